"""Advantage estimators and policy losses by name: a new algorithm is one function + one registration.

    @register_estimator("my_gae")
    def my_gae(batch, values, params):          # -> (advantages [B, L], returns [B, L])
        ...

    @register_policy_loss("my_pg")
    def my_pg(logprobs, batch, params):         # -> losses.LossTerms over batch["loss_mask"]
        ...

The update steps (`tr.train.updates`) look both up by the names in their config
(`ppo.estimator`, `ppo.policy_loss`). `batch` is the dict of SPEC §2 arrays plus the prepared
targets (`old_logprobs`, `advantages`, ...); `params` is a plain mapping of hyper-parameters (the
config section). Both functions must be pure and `jit`-able. (The shape is tunix's
`algo_core` registry.)
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax.numpy as jnp

from tr.rl import advantages as adv_lib
from tr.rl import losses

Estimator = Callable[[Mapping[str, Any], Any, Mapping[str, Any]], tuple[Any, Any]]
PolicyLoss = Callable[[Any, Mapping[str, Any], Mapping[str, Any]], losses.LossTerms]

_ESTIMATORS: dict[str, Estimator] = {}
_POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Registers `fn(batch, values, params) -> (advantages, returns)` under `name`."""
    def register(fn: Estimator) -> Estimator:
        if name in _ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        _ESTIMATORS[name] = fn
        return fn
    return register


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Registers `fn(logprobs, batch, params) -> LossTerms` under `name`."""
    def register(fn: PolicyLoss) -> PolicyLoss:
        if name in _POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        _POLICY_LOSSES[name] = fn
        return fn
    return register


def estimator(name: str) -> Estimator:
    if name not in _ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} unknown; registered: {sorted(_ESTIMATORS)}")
    return _ESTIMATORS[name]


def policy_loss(name: str) -> PolicyLoss:
    if name not in _POLICY_LOSSES:
        raise ValueError(f"policy loss {name!r} unknown; registered: {sorted(_POLICY_LOSSES)}")
    return _POLICY_LOSSES[name]


def estimators() -> list[str]:
    return sorted(_ESTIMATORS)


def policy_losses() -> list[str]:
    return sorted(_POLICY_LOSSES)


# ------------------------------------------------------------------------------------------------
# The built-in ones.


@register_estimator("tb_gae")
def _tb_gae(batch, values, params):
    """TB-GAE over `actor_mask` (`gamma_turn`, `lam_turn`); carried across summary windows when the
    batch has `window_ids` / `next_window_row` and `params['num_windows'] > 1`."""
    common = dict(gamma_turn=params["gamma_turn"], lam_turn=params["lam_turn"],
                  method=params.get("gae_method", "scan"))
    if "next_window_row" in batch and int(params.get("num_windows", 1)) > 1:
        out = adv_lib.tb_gae_across_windows(
            batch["rewards"], values, batch["actor_mask"], batch["turn_ids"], batch["dones"],
            batch["window_ids"], batch["next_window_row"], num_windows=int(params["num_windows"]),
            **common)
    else:
        out = adv_lib.tb_gae(batch["rewards"], values, batch["actor_mask"], batch["turn_ids"],
                             batch["dones"], **common)
    return out.advantages, out.returns


@register_estimator("token_gae")
def _token_gae(batch, values, params):
    """Token GAE over the action tokens (`actor_mask`), `gamma`, `lam` (the baseline)."""
    out = adv_lib.token_gae(batch["rewards"], values, batch["actor_mask"], batch["dones"],
                            gamma=params["gamma"], lam=params["lam"],
                            method=params.get("gae_method", "scan"))
    return out.advantages, out.returns


@register_estimator("grpo")
def _grpo(batch, values, params):
    """Group-normalised row rewards (`group_size`, `std_eps`); returns are the advantages."""
    del values
    adv = adv_lib.grpo_row_advantages(batch["rewards"], batch["actor_mask"],
                                      group_size=int(params["group_size"]),
                                      std_eps=params["std_eps"])
    return adv, adv


def _aggregation(params) -> dict[str, Any]:
    """`aggregation` (token_mean | sequence_mean | constant, `tr.rl.losses.aggregate`) and
    `aggregation_constant` of a config section; token_mean when the section has none."""
    return {"aggregation": params.get("aggregation", "token_mean"),
            "aggregation_constant": float(params.get("aggregation_constant", 0.0))}


@register_policy_loss("ppo")
def _ppo(logprobs, batch, params):
    """Asymmetric-clip PPO surrogate over `loss_mask` (`eps_low`, `eps_high`), ratio against
    `old_logprobs`; per-token `token_weights` when the batch has them (ReTerm groups); aggregated
    by `aggregation` (sequences: rows, or `segment_ids` segments); `kl_coef` · k3 KL to
    `ref_logprobs` and `entropy_coef` · entropy when the batch carries them (`tr.train.updates`)."""
    return losses.ppo_policy_loss_terms(
        logprobs, batch["old_logprobs"], batch["advantages"], batch["loss_mask"],
        eps_low=params["eps_low"], eps_high=params["eps_high"],
        ref_logprobs=batch.get("ref_logprobs"), kl_coef=float(params.get("kl_coef", 0.0)),
        entropies=batch.get("entropies"), entropy_coef=float(params.get("entropy_coef", 0.0)),
        token_weights=batch.get("token_weights"), segment_ids=batch.get("segment_ids"),
        **_aggregation(params))


@register_policy_loss("reinforce")
def _reinforce(logprobs, batch, params):
    """`−Σ m A log π`, aggregated by `aggregation` (token mean by default): the unclipped
    score-function surrogate (a baseline for ablations)."""
    mask = jnp.asarray(batch["loss_mask"], bool)
    per = -jnp.where(mask, batch["advantages"] * logprobs, 0.0)
    agg = _aggregation(params)
    return losses.aggregate(per, mask, {"pg_loss": jnp.sum(jnp.where(mask, per, 0.0))},
                            aggregation=agg["aggregation"], constant=agg["aggregation_constant"],
                            segment_ids=batch.get("segment_ids"))
