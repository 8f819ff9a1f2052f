"""The pure functions of parameter pytrees the update steps are written over:

    actor_logprobs(actor_params, batch) -> logp [B, L]    log π(tokens[i] | tokens[<i]), 0 at i = 0
    actor_logprobs_entropy(actor_params, batch) -> (logp, entropy) [B, L]   (entropy bonuses)
    critic_values(critic_params, batch) -> v [B, L]       pre-token values v_i = V(h_i)

`nnx_model_fns` builds both from `tr.models` NNX modules (chunked log-probs).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
from jaxtyping import Array, Float

from tr.models.decoder import token_logprobs

PyTree = Any
Batch = dict[str, jax.Array]
ActorFn = Callable[[PyTree, Batch], Float[Array, "b l"]]
# (logp, entropy) [B, L]: the entropy of the (tempered) policy at each position, for entropy bonuses
ActorEntropyFn = Callable[[PyTree, Batch], tuple[Float[Array, "b l"], Float[Array, "b l"]]]
CriticFn = Callable[[PyTree, Batch], Float[Array, "b l"]]


@dataclasses.dataclass(frozen=True)
class ModelFns:
    """Pure functions of parameter pytrees for the steps, and the models' initial parameters."""

    actor_logprobs: ActorFn | None
    critic_values: CriticFn | None
    actor_params: PyTree
    critic_params: PyTree
    actor_logprobs_entropy: ActorEntropyFn | None = None


def nnx_model_fns(actor=None, critic=None, *, chunk_size: int = 1024,
                  temperature: float = 1.0) -> ModelFns:
    """`ModelFns` for a `tr.models` `Decoder` actor and `CriticModel` critic (NNX modules).

    The parameters become pure dicts (`nnx.to_pure_dict`); the graph definitions and any non-
    parameter state are closed over. Log-probs use `tr.models.decoder.token_logprobs` in chunks of
    `chunk_size` positions, of the `temperature`-scaled model `softmax(logits / temperature)` (1:
    the raw model; see `train.policy_temperature`).
    """
    if not temperature > 0:
        raise ValueError(f"nnx_model_fns: temperature must be > 0, got {temperature}")
    from flax import nnx  # pylint: disable=g-import-not-at-top

    def split(model):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        return graphdef, nnx.to_pure_dict(params), rest

    actor_fn = critic_fn = actor_params = critic_params = actor_entropy_fn = None
    if actor is not None:
        actor_graph, actor_params, actor_rest = split(actor)

        def actor_fn(params, batch):
            model = nnx.merge(actor_graph, params, actor_rest)
            logp, _ = token_logprobs(model, batch["tokens"], batch.get("positions"),
                                     batch.get("segment_ids"), chunk_size=chunk_size,
                                     temperature=temperature)
            return logp

        def actor_entropy_fn(params, batch):
            model = nnx.merge(actor_graph, params, actor_rest)
            return token_logprobs(model, batch["tokens"], batch.get("positions"),
                                  batch.get("segment_ids"), chunk_size=chunk_size,
                                  with_entropy=True, temperature=temperature)
    if critic is not None:
        critic_graph, critic_params, critic_rest = split(critic)

        def critic_fn(params, batch):
            model = nnx.merge(critic_graph, params, critic_rest)
            return model(batch["tokens"], batch.get("positions"), batch.get("segment_ids"))
    return ModelFns(actor_fn, critic_fn, actor_params, critic_params, actor_entropy_fn)
