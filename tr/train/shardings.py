"""Shardings of a TrainState and of a batch on a device mesh (logical-axis rules of `tr.models`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tr.models import sharding as sharding_lib
from tr.train.state import TrainState

PyTree = Any
Batch = dict[str, jax.Array]


def nnx_param_shardings(model, mesh: Mesh) -> PyTree:
    """Pure-dict tree of `NamedSharding`s for the `nnx.Param`s of `model` (logical-axis rules)."""
    from flax import nnx  # pylint: disable=g-import-not-at-top

    shardings = sharding_lib.state_shardings(nnx.state(model, nnx.Param), mesh)
    return nnx.to_pure_dict(shardings)


def _opt_state_shardings(opt_state: PyTree, params: PyTree, param_shardings: PyTree,
                         replicated: NamedSharding) -> PyTree:
    """Shardings for an optax state: a leaf whose key path ends with a parameter's key path and
    has that parameter's shape (Adam's `mu`, `nu`, ...) is sharded like it; others replicated."""
    by_path = {}
    for (path, p), s in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                            jax.tree.leaves(param_shardings)):
        by_path[jax.tree_util.keystr(path)] = (jnp.shape(p), s)

    def pick(path, leaf):
        key = jax.tree_util.keystr(path)
        best = None
        for suffix, (shape, sharding) in by_path.items():
            if key.endswith(suffix) and tuple(jnp.shape(leaf)) == tuple(shape):
                if best is None or len(suffix) > len(best[0]):
                    best = (suffix, sharding)
        return replicated if best is None else best[1]

    return jax.tree_util.tree_map_with_path(pick, opt_state)


def train_state_shardings(state: TrainState, mesh: Mesh, *, actor_param_shardings: PyTree = None,
                          critic_param_shardings: PyTree = None) -> TrainState:
    """A TrainState of `NamedSharding`s on `mesh`: parameters as given (default replicated),
    optimizer states like their parameters, step and RNG replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())

    def params_sharding(params, given):
        if params is None:
            return None
        return given if given is not None else jax.tree.map(lambda _: replicated, params)

    actor_sh = params_sharding(state.actor_params, actor_param_shardings)
    critic_sh = params_sharding(state.critic_params, critic_param_shardings)

    def opt_sharding(opt_state, params, param_sh):
        if opt_state is None:
            return None
        return _opt_state_shardings(opt_state, params, param_sh, replicated)

    return TrainState(
        step=replicated,
        actor_params=actor_sh,
        actor_opt_state=opt_sharding(state.actor_opt_state, state.actor_params, actor_sh),
        critic_params=critic_sh,
        critic_opt_state=opt_sharding(state.critic_opt_state, state.critic_params, critic_sh),
        rng=replicated,
    )


def shard_batch(batch: Batch, mesh: Mesh) -> Batch:
    """Places a batch on `mesh`: rows over the data-parallel axes (`tr.models.sharding` rules)."""

    return {k: jax.device_put(v, sharding_lib.batch_sharding(mesh, min(jnp.ndim(v), 2)))
            for k, v in batch.items()}
