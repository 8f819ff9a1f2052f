"""The train state: one pytree holding everything an update step reads and writes.

`TrainState` is what flows through the pure update steps of `tr/train/updates.py` (state in, state and
metrics out) and what `tr/train/checkpoint.py` writes per stage. Parameters are *pure* pytrees (for
an NNX model, `nnx.to_pure_dict(nnx.state(model, nnx.Param))`); the model's graph definition stays
outside the state, in the step functions, so the state holds arrays only and can be sharded,
donated, checkpointed and restored onto any mesh.

A side that a stage does not have (no critic in an SFT or GRPO stage) is `None`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

PyTree = Any

# The names of the parts of a TrainState that hold parameters or optimizer state, in the order the
# checkpoint store writes them.
MODEL_ITEMS: tuple[str, ...] = ("actor_params", "actor_opt_state", "critic_params", "critic_opt_state")


@struct.dataclass
class TrainState:
    """Actor and critic parameters, their optimizer states, the update count and the RNG.

    step:             int32 scalar, the number of updates applied in this stage.
    actor_params:     pure pytree of the policy's parameters (or None).
    actor_opt_state:  optax state of the actor's optimizer (or None: actor frozen / absent).
    critic_params:    pure pytree of the critic's parameters (or None).
    critic_opt_state: optax state of the critic's optimizer (or None).
    rng:              uint32 raw key data (`jax.random.key_data`), so it checkpoints as an array.
    """

    step: jax.Array
    actor_params: PyTree
    actor_opt_state: PyTree
    critic_params: PyTree
    critic_opt_state: PyTree
    rng: jax.Array

    @property
    def key(self) -> jax.Array:
        """The typed PRNG key of `rng`."""
        return jax.random.wrap_key_data(self.rng)


def create_train_state(
    *,
    actor_params: PyTree = None,
    actor_optimizer=None,
    critic_params: PyTree = None,
    critic_optimizer=None,
    seed: int = 0,
) -> TrainState:
    """A step-0 state; each optimizer's state is `optimizer.init(params)` when both are given."""
    def init(optimizer, params):
        return None if optimizer is None or params is None else optimizer.init(params)

    return TrainState(
        step=jnp.zeros((), jnp.int32),
        actor_params=actor_params,
        actor_opt_state=init(actor_optimizer, actor_params),
        critic_params=critic_params,
        critic_opt_state=init(critic_optimizer, critic_params),
        rng=jax.random.key_data(jax.random.key(seed)),
    )


def abstract_state(state: TrainState, shardings: PyTree = None) -> TrainState:
    """`state` as a tree of `jax.ShapeDtypeStruct` (what a restore needs as its target).

    `shardings` is None (keep each leaf's current sharding), one `jax.sharding.Sharding` for every
    leaf, or a TrainState-shaped tree of shardings: the restored arrays are laid out that way, on
    whatever mesh they name (restoring onto a different mesh shape than the one saved from).
    """
    def leaf(x, sharding=None):
        sharding = sharding if sharding is not None else getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x), sharding=sharding)

    if shardings is None:
        return jax.tree.map(leaf, state)
    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda x: leaf(x, shardings), state)
    return jax.tree.map(leaf, state, shardings)
