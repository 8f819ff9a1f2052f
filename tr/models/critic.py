"""The critic: the decoder backbone with a scalar value head giving PRE-TOKEN values (SPEC §2).

`v_i = V_φ(h_i)` is the value of the history *before* token `i`. With `s[j]` the backbone's final
hidden state after reading tokens `[0..j]`:

    v_i = w · s[i-1] + b          for i >= 1 (and i not the first token of a packed segment)
    v_i = v_start                 at i = 0 and at the first token of every packed segment

`v_start` is a learned scalar: the value of an empty history, which no hidden state represents.
So changing token `i` never changes `v_i` (it only reaches `v_{i+1}`, `v_{i+2}`, ...).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from tr.models.config import ModelConfig
from tr.models.decoder import Decoder
from tr.models.sharding import constrain


class CriticModel(nnx.Module):
    """Backbone (a `Decoder` without output projection) + `Linear(d_model -> 1)` + `v_start`."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.backbone = Decoder(config, rngs=rngs, lm_head=False)
        self.value_head = nnx.Param(jnp.zeros((config.d_model,), jnp.float32), logical_axes=("embed",))
        self.value_bias = nnx.Param(jnp.zeros((), jnp.float32), logical_axes=())
        self.value_start = nnx.Param(jnp.zeros((), jnp.float32), logical_axes=())

    def __call__(self, tokens: Int[Array, "b l"], positions: Int[Array, "b l"] | None = None,
                 segment_ids: Int[Array, "b l"] | None = None) -> Float[Array, "b l"]:
        """Pre-token values `[B, L]` float32 (see the module docstring for the shift)."""
        chex.assert_rank(tokens, 2)
        hidden, _ = self.backbone.hidden_states(tokens, positions, segment_ids)
        post = jnp.einsum("bld,d->bl", hidden.astype(jnp.float32), self.value_head.get_value()) \
            + self.value_bias.get_value()
        post = constrain(post, ("activation_batch", "activation_length"))
        start = jnp.broadcast_to(self.value_start.get_value(), post[:, :1].shape)
        pre = jnp.concatenate([start, post[:, :-1]], axis=1)
        if segment_ids is not None:
            first = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool),
                                     segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
            pre = jnp.where(first, self.value_start.get_value(), pre)
        return pre


def critic_from_actor(actor: Decoder, *, rngs: nnx.Rngs) -> CriticModel:
    """A critic whose backbone copies the actor's backbone weights (value head freshly zero)."""
    critic = CriticModel(actor.config, rngs=rngs)
    source = dict(nnx.to_flat_state(nnx.state(actor)))
    target = nnx.to_flat_state(nnx.state(critic.backbone))
    copied = [(path, var.replace(source[path].get_value())) for path, var in target]
    nnx.update(critic.backbone, nnx.from_flat_state(copied))
    return critic
