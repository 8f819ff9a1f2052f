"""The update steps `sft`, `critic`, `ppo`, `grpo` and the once-per-batch `targets`: pure functions,
state in, state and metrics out.

Each is written over the pure model functions of `tr.train.model_fns` (`actor_logprobs`,
`critic_values`) and the losses and estimators of `tr.rl` (by name: `tr.rl.registry`). The batch is
a dict of SPEC §2 arrays (`tokens, actor_mask, loss_mask, turn_ids, rewards, dones, logprobs`,
`[B, L]`, plus optional `positions`, `segment_ids`; GRPO also `is_recovery [B]`).

| step      | trains | loss                                                       | frozen, bitwise |
|-----------|--------|------------------------------------------------------------|-----------------|
| `targets` | —      | (none) `old_logprobs, old_values, advantages, returns`     | both            |
| `sft`     | actor  | masked NLL over `loss_mask`                                | critic          |
| `critic`  | critic | clipped value loss vs `returns`, over `actor_mask`         | actor           |
| `ppo`     | both   | registered policy loss (`loss_mask`) + clipped value loss  | —               |
| `grpo`    | actor  | ReTerm objective: clipped surrogate, group-weighted        | critic          |

**Targets once per rollout batch.** `rollout_targets` computes, with the state the rollouts came
from, `old_values = V_old` (the critic on the whole batch), `advantages, returns` (the estimator
named by `ppo.estimator`: TB-GAE by default, token GAE selectable), and `old_logprobs` (the
behaviour log-probs, or recomputed under the current actor). PPO epochs and mini-batches then
reuse them, so the value clip `|V − V_old| ≤ ε_V` and the policy ratio bind after the first
update. A `critic`/`ppo` step given a batch without `returns` computes the targets itself first
(the single-update case, identical to preparing them): the loop always prepares them once.

Explained variance `EV = 1 − Var(G − V_old)/Var(G)` over `actor_mask` is logged at every critic
update as `critic/explained_variance`.

**KL and entropy (default 0).** `kl_coef` (`ppo` / `grpo` sections) adds `β_KL · k3` per token,
`k3 = exp(logp_ref − logp) − (logp_ref − logp) − 1`, with `logp_ref` the batch's `ref_logprobs`
(a frozen reference's log-probs, computed by the caller, e.g. the Base's) or, when the batch has
none, the behaviour log-probs `old_logprobs` (then the term is a penalty on drifting from the
policy that sampled the batch: 0 at the first update of a batch). `entropy_coef` subtracts
`β_H · H_i`, the entropy of the current (τ-tempered) policy at each loss token, which needs the
`actor_logprobs_entropy` model function (`tr.train.model_fns.ModelFns`).
"""

from __future__ import annotations

from typing import Any, Mapping

import chex
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jaxtyping import Array, Float

from tr.rl import advantages as adv_lib
from tr.rl import losses
from tr.rl import registry
from tr.train.microbatch import accumulate, map_micro_batches
from tr.train.model_fns import ActorEntropyFn, ActorFn, Batch, CriticFn, PyTree
from tr.train.optim import optimizer_config
from tr.train.state import TrainState

# The fields each step needs on a raw (unprepared) batch.
REQUIRED = {
    "sft": ("tokens", "loss_mask"),
    "targets": ("tokens", "actor_mask", "turn_ids", "rewards", "dones", "logprobs"),
    "critic": ("tokens", "actor_mask", "turn_ids", "rewards", "dones"),
    "ppo": ("tokens", "actor_mask", "loss_mask", "turn_ids", "rewards", "dones", "logprobs"),
    "grpo": ("tokens", "actor_mask", "loss_mask", "rewards", "logprobs", "is_recovery"),
}
TARGET_FIELDS = ("old_logprobs", "old_values", "advantages", "returns")
_ROW_FIELDS = ("is_recovery", "window_ids", "next_window_row")


def default_config() -> ml_collections.ConfigDict:
    """Table 1 of the Terminal-RSI paper (SPEC §6) for PPO; ReTerm-GRPO lr 5e-7, groups of 16.

    The actor's global-norm clip (1.0) is a common default, not a number from the papers.
    """
    return ml_collections.ConfigDict({
        "actor": {"optimizer": optimizer_config(5e-7, 1.0)},
        "critic": {"optimizer": optimizer_config(1.5e-5, 100.0)},
        "ppo": {
            "estimator": "tb_gae",     # tr.rl.registry: tb_gae | token_gae | ...
            "policy_loss": "ppo",      # tr.rl.registry: ppo | reinforce | ...
            # tr.rl.losses.aggregate: token_mean (the recipes') | sequence_mean | constant (Dr.
            # GRPO: Σ tokens / (C · sequences), C = aggregation_constant, or the row length if 0)
            "aggregation": "token_mean",
            "aggregation_constant": 0.0,
            "eps_low": 0.30,
            "eps_high": 5.00,
            "eps_value": 4.00,
            "kl_coef": 0.0,
            "entropy_coef": 0.0,
            "gamma_turn": 1.0,  # the documented RPR-1 run used γ = λ = 1 (unit-clock equivalence)
            "lam_turn": 1.0,
            "gamma": 1.0,       # token GAE (estimator = token_gae)
            "lam": 1.0,
            "gae_method": "blocked",   # tr.rl.advantages: scan | blocked | associative (equal)
            "num_windows": 1,          # > 1: TB-GAE carried across summary windows (static)
            "old_logprobs": "behaviour",  # behaviour (the sampler's) | recompute (current actor)
            "epochs": 1,               # passes over one rollout batch
            "mini_batches": 1,         # optimizer updates per pass
        },
        # ReTerm-GRPO. The paper gives no clip range: eps_low/eps_high here are the PPO defaults
        # of SPEC §4, a config value. group_weighting: "equal" (every group weighs the same) or
        # "literal" (tr.rl.losses.reterm_token_weights).
        # aggregation: how J_g aggregates a group's tokens (losses.reterm_token_weights).
        "grpo": {"group_size": 16, "eps_low": 0.30, "eps_high": 5.00, "std_eps": 1e-6,
                 "policy_loss": "ppo", "group_weighting": "equal",
                 "aggregation": "token_mean", "aggregation_constant": 0.0,
                 "kl_coef": 0.0, "entropy_coef": 0.0},
        "num_micro_batches": 1,
        # > 0: micro-batches of this many rows whatever the batch size (num_micro_batches is then
        # rows / micro_batch_rows, read off each batch's shape), and the loop lays every batch out
        # in `arrays.rows` rows (`microbatch.bucket_layout`): one compiled step for every batch and
        # mini-batch size, empty micro-batches skipped. 0: num_micro_batches (the pod's setting).
        "micro_batch_rows": 0,
        "logprob_chunk_size": 1024,
        # τ: the actor's log-probs in every update are log softmax(logits / τ), so the policy the
        # updates train is the τ-tempered model (1: the raw model, SPEC §2). PPO is on-policy only
        # when the rollouts sample from that policy: rollout temperature τ, top-p 1 (checked by
        # the stages that train on rollouts).
        "policy_temperature": 1.0,
    })


def _params(section) -> dict[str, Any]:
    """A config section as a plain dict of hyper-parameters (for the registry's functions)."""
    if section is None:
        return dict(default_config().ppo)
    return dict(section.to_dict() if hasattr(section, "to_dict") else section)


def check_batch(kind: str, batch: Batch) -> None:
    """Raises ValueError naming the missing field, the wrong shape or the integer reward."""
    missing = [k for k in REQUIRED[kind] if k not in batch]
    if missing:
        raise ValueError(f"{kind} step: the batch lacks {missing} (has {sorted(batch)})")
    chex.assert_rank(batch["tokens"], 2)
    for key, value in batch.items():
        expected = batch["tokens"].shape[:1] if key in _ROW_FIELDS else batch["tokens"].shape
        if jnp.shape(value) != tuple(expected):
            raise ValueError(f"{kind} step: batch[{key!r}] has shape {jnp.shape(value)}, "
                             f"expected {tuple(expected)}")
    for key in ("rewards", "logprobs", "ref_logprobs") + TARGET_FIELDS:
        if key in batch and not jnp.issubdtype(batch[key].dtype, jnp.floating):
            raise ValueError(f"{kind} step: batch[{key!r}] must be floating point, got "
                             f"{batch[key].dtype} (a fractional reward would be truncated)")


def _apply(optimizer, grads, opt_state, params):
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _scale(tree: PyTree, denominator: jax.Array) -> PyTree:
    return jax.tree.map(lambda g: g / jnp.maximum(denominator, 1.0), tree)


def _prefixed(prefix: str, metrics: dict) -> dict:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}


def _regularised(kind: str, params: Mapping, actor_logprobs_entropy: ActorEntropyFn | None):
    """`(kl_coef, entropy_coef)` of `params`, checked: an entropy bonus needs the entropy fn."""
    kl_coef = float(params.get("kl_coef") or 0.0)
    entropy_coef = float(params.get("entropy_coef") or 0.0)
    if entropy_coef and actor_logprobs_entropy is None:
        raise ValueError(f"{kind} step: entropy_coef={entropy_coef} needs actor_logprobs_entropy "
                         "(tr.train.model_fns.ModelFns.actor_logprobs_entropy)")
    return kl_coef, entropy_coef


def _with_reference(batch: Batch, kl_coef: float) -> Batch:
    """The batch with `ref_logprobs` for the KL term: its own (a frozen reference's), else the
    behaviour log-probs `old_logprobs`; unchanged when `kl_coef` is 0."""
    if not kl_coef or "ref_logprobs" in batch:
        return batch
    return {**batch, "ref_logprobs": batch["old_logprobs"]}


def _policy_inputs(actor_logprobs, actor_logprobs_entropy, entropy_coef, params, mb):
    """`(logp, mb)` under `params`, with `entropies` in `mb` when the entropy bonus is on."""
    if not entropy_coef:
        return actor_logprobs(params, mb), mb
    logp, entropy = actor_logprobs_entropy(params, mb)
    return logp, {**mb, "entropies": entropy}


# ------------------------------------------------------------------------------------------------
# Targets, once per rollout batch


def rollout_targets(state: TrainState, batch: Batch, *, actor_logprobs: ActorFn | None = None,
                    critic_values: CriticFn | None = None, params: Mapping | None = None,
                    num_micro_batches: int = 1) -> dict[str, Float[Array, "b l"]]:
    """`{old_logprobs, old_values, advantages, returns}` of a rollout batch, before any update.

    `old_values = V_φ(h)` (0 without a critic); `(advantages, returns)` from the estimator named
    `params['estimator']`; `old_logprobs` are `batch['logprobs']` (`old_logprobs='behaviour'`) or
    `log π_θ` of the current actor (`'recompute'`). All are `stop_gradient`-ed constants.
    """
    check_batch("targets", batch)
    params = _params(params)
    n = num_micro_batches
    if critic_values is not None and state.critic_params is not None:
        values = map_micro_batches(lambda mb: critic_values(state.critic_params, mb), batch, n)
    else:
        values = jnp.zeros(batch["tokens"].shape, jnp.float32)
    values = jax.lax.stop_gradient(values.astype(jnp.float32))
    advantages, returns = registry.estimator(params["estimator"])(batch, values, params)
    mode = params.get("old_logprobs", "behaviour")
    if mode == "behaviour":
        old_logprobs = batch["logprobs"].astype(jnp.float32)
    elif mode == "recompute":
        if actor_logprobs is None:
            raise ValueError("rollout_targets: old_logprobs='recompute' needs actor_logprobs")
        old_logprobs = map_micro_batches(lambda mb: actor_logprobs(state.actor_params, mb), batch, n)
    else:
        raise ValueError(f"ppo.old_logprobs = {mode!r}: expected 'behaviour' or 'recompute'")
    return {"old_logprobs": jax.lax.stop_gradient(old_logprobs.astype(jnp.float32)),
            "old_values": values, "advantages": jax.lax.stop_gradient(advantages),
            "returns": jax.lax.stop_gradient(returns)}


def _prepared(state, batch, actor_logprobs, critic_values, params, n) -> Batch:
    if all(k in batch for k in TARGET_FIELDS):
        return batch
    return {**batch, **rollout_targets(state, batch, actor_logprobs=actor_logprobs,
                                       critic_values=critic_values, params=params,
                                       num_micro_batches=n)}


# ------------------------------------------------------------------------------------------------
# The updates


def sft_update(state: TrainState, batch: Batch, *, actor_logprobs: ActorFn,
               actor_optimizer: optax.GradientTransformation, num_micro_batches: int = 1
               ) -> tuple[TrainState, dict]:
    """One SFT update of the actor: `L = −Σ_i m_i log π(y_i|h_i) / Σ_i m_i`, `m = loss_mask`."""
    check_batch("sft", batch)

    def grad_fn(mb):
        def numerator(params):
            terms = losses.sft_loss_terms(actor_logprobs(params, mb), mb["loss_mask"])
            return terms.numerator, terms
        return jax.grad(numerator, has_aux=True)(state.actor_params)

    grads, terms = accumulate(grad_fn, batch, num_micro_batches)
    grads = _scale(grads, terms.denominator)
    params, opt_state = _apply(actor_optimizer, grads, state.actor_opt_state, state.actor_params)
    metrics = {**_prefixed("actor", terms.metrics), "actor/loss": terms.loss,
               "actor/grad_norm": optax.tree.norm(grads)}
    return state.replace(step=state.step + 1, actor_params=params, actor_opt_state=opt_state), metrics


def _value_terms(critic_values, params, mb, eps_value):
    return losses.value_loss_terms(critic_values(params, mb), mb["old_values"], mb["returns"],
                                   mb["actor_mask"], eps_value=eps_value)


def critic_update(state: TrainState, batch: Batch, *, critic_values: CriticFn,
                  critic_optimizer: optax.GradientTransformation, params: Mapping | None = None,
                  gamma_turn: float | None = None, lam_turn: float | None = None,
                  eps_value: float | None = None, num_micro_batches: int = 1
                  ) -> tuple[TrainState, dict]:
    """One critic-only update (calibration, warm-up): clipped value loss vs the prepared returns.

    `L = ½ mean_{actor_mask} max((V−G)², (V_old + clip(V−V_old, ±ε_V) − G)²)`. The actor is not
    read and not written.
    """
    check_batch("critic", batch)
    params = _params(params)
    for key, value in (("gamma_turn", gamma_turn), ("lam_turn", lam_turn), ("eps_value", eps_value)):
        if value is not None:
            params[key] = value
    if "logprobs" not in batch:
        batch = {**batch, "logprobs": jnp.zeros(batch["tokens"].shape, jnp.float32)}
    full = _prepared(state, batch, None, critic_values, params, num_micro_batches)

    def grad_fn(mb):
        def numerator(p):
            terms = _value_terms(critic_values, p, mb, params["eps_value"])
            return terms.numerator, terms
        return jax.grad(numerator, has_aux=True)(state.critic_params)

    grads, terms = accumulate(grad_fn, full, num_micro_batches)
    grads = _scale(grads, terms.denominator)
    new_params, opt_state = _apply(critic_optimizer, grads, state.critic_opt_state,
                                   state.critic_params)
    metrics = {
        **_prefixed("critic", terms.metrics),
        "critic/loss": terms.loss,
        "critic/grad_norm": optax.tree.norm(grads),
        "critic/explained_variance": adv_lib.explained_variance(
            full["returns"], full["old_values"], full["actor_mask"]),
    }
    return state.replace(step=state.step + 1, critic_params=new_params,
                         critic_opt_state=opt_state), metrics


def ppo_update(state: TrainState, batch: Batch, *, actor_logprobs: ActorFn,
               critic_values: CriticFn, actor_optimizer: optax.GradientTransformation,
               critic_optimizer: optax.GradientTransformation, params: Mapping | None = None,
               num_micro_batches: int = 1, actor_logprobs_entropy: ActorEntropyFn | None = None,
               **overrides) -> tuple[TrainState, dict]:
    """One joint update of actor and critic on a prepared batch, each side with its own optimizer.

    The actor minimises the registered policy loss `params['policy_loss']` (PPO's asymmetric clip
    by default: `ρ = exp(logp − old_logprobs)`) over `loss_mask`; the critic the clipped value loss
    over `actor_mask` against `old_values`, `returns`. `kl_coef` / `entropy_coef` (default 0,
    the paper's setting) add the KL-to-reference and entropy terms (module docstring).
    `overrides` replace entries of `params` (e.g. `eps_low=0.2`).
    """
    check_batch("ppo", batch)
    params = {**_params(params), **overrides}
    kl_coef, entropy_coef = _regularised("ppo", params, actor_logprobs_entropy)
    full = _prepared(state, batch, actor_logprobs, critic_values, params, num_micro_batches)
    full = _with_reference(full, kl_coef)
    policy_loss = registry.policy_loss(params["policy_loss"])

    def grad_fn(mb):
        def numerators(actor_params, critic_params):
            logp, pmb = _policy_inputs(actor_logprobs, actor_logprobs_entropy, entropy_coef,
                                       actor_params, mb)
            policy = policy_loss(logp, pmb, params)
            value = _value_terms(critic_values, critic_params, mb, params["eps_value"])
            return policy.numerator + value.numerator, (policy, value)
        return jax.grad(numerators, argnums=(0, 1), has_aux=True)(
            state.actor_params, state.critic_params)

    (actor_grads, critic_grads), (policy, value) = accumulate(grad_fn, full, num_micro_batches)
    actor_grads = _scale(actor_grads, policy.denominator)
    critic_grads = _scale(critic_grads, value.denominator)
    actor_params, actor_opt = _apply(actor_optimizer, actor_grads, state.actor_opt_state,
                                     state.actor_params)
    critic_params, critic_opt = _apply(critic_optimizer, critic_grads, state.critic_opt_state,
                                       state.critic_params)
    metrics = {
        **_prefixed("actor", policy.metrics),
        **_prefixed("critic", value.metrics),
        "actor/loss": policy.loss,
        "critic/loss": value.loss,
        "actor/grad_norm": optax.tree.norm(actor_grads),
        "critic/grad_norm": optax.tree.norm(critic_grads),
        "critic/explained_variance": adv_lib.explained_variance(
            full["returns"], full["old_values"], full["actor_mask"]),
    }
    new_state = state.replace(step=state.step + 1, actor_params=actor_params,
                              actor_opt_state=actor_opt, critic_params=critic_params,
                              critic_opt_state=critic_opt)
    return new_state, metrics


def grpo_update(state: TrainState, batch: Batch, *, actor_logprobs: ActorFn,
                actor_optimizer: optax.GradientTransformation, group_size: int,
                eps_low: float = losses.EPS_LOW, eps_high: float = losses.EPS_HIGH,
                std_eps: float = 1e-6, policy_loss: str = "ppo", num_micro_batches: int = 1,
                group_weighting: str = "equal", aggregation: str = "token_mean",
                aggregation_constant: float = 0.0, kl_coef: float = 0.0,
                entropy_coef: float = 0.0,
                actor_logprobs_entropy: ActorEntropyFn | None = None
                ) -> tuple[TrainState, dict]:
    """One ReTerm-GRPO update of the actor over original and recovery groups.

    Rows come in consecutive groups of `group_size` rollouts of one task, one rollout per row
    (`tr.rl.advantages.check_one_rollout_per_row`: the compiled step refuses packed rows and split
    windows); `is_recovery [B]` marks recovery groups.
    `J = M_O/(M_O+M_R) Σ_g J^O_g + M_R/(M_O+M_R) Σ_g J^R_g`, each `J_g` the clipped surrogate of a
    group as a token mean (`losses.reterm_token_weights`; `group_weighting` "equal": every group
    weighs the same, so the recovery class carries M_R/(M_O+M_R); "literal": the formula as
    written, recovery M_R²/(M_O²+M_R²)). The clip range (`eps_low`, `eps_high`) is not given by the
    ReTerm paper: it is the config's `grpo.eps_low/eps_high`. `aggregation` says how `J_g`
    aggregates the group's tokens: `token_mean` (the recipes'), `sequence_mean` (each rollout's
    token mean, averaged over the group) or `constant` (Dr. GRPO: the group's token sum over
    `k_g · C`). Advantages are `batch['advantages']` when given, else
    `tr.rl.advantages.grpo_row_advantages` of the rows' rewards. `kl_coef` / `entropy_coef`
    (default 0) as in `ppo_update` (module docstring).
    """
    check_batch("grpo", batch)
    rows = batch["tokens"].shape[0]
    params = {"group_size": group_size, "eps_low": eps_low, "eps_high": eps_high,
              "std_eps": std_eps}
    kl_coef, entropy_coef = _regularised(
        "grpo", {"kl_coef": kl_coef, "entropy_coef": entropy_coef}, actor_logprobs_entropy)
    if kl_coef or entropy_coef:
        params.update(kl_coef=kl_coef, entropy_coef=entropy_coef)
    advantages = batch.get("advantages")
    if advantages is None:
        advantages, _ = registry.estimator("grpo")(batch, None, params)
    group_ids = jnp.arange(rows, dtype=jnp.int32) // group_size
    weights = losses.reterm_token_weights(group_ids, batch["is_recovery"], batch["loss_mask"],
                                          num_groups=-(-rows // group_size),
                                          weighting=group_weighting, aggregation=aggregation,
                                          aggregation_constant=aggregation_constant)
    full = {**batch, "advantages": advantages, "token_weights": weights,
            "old_logprobs": batch.get("old_logprobs", batch["logprobs"])}
    full = _with_reference(full, kl_coef)
    loss_fn = registry.policy_loss(policy_loss)

    def grad_fn(mb):
        def numerator(p):
            logp, pmb = _policy_inputs(actor_logprobs, actor_logprobs_entropy, entropy_coef, p, mb)
            terms = loss_fn(logp, pmb, params)
            return terms.numerator, terms
        return jax.grad(numerator, has_aux=True)(state.actor_params)

    grads, terms = accumulate(grad_fn, full, num_micro_batches)
    grads = _scale(grads, terms.denominator)
    new_params, opt_state = _apply(actor_optimizer, grads, state.actor_opt_state,
                                   state.actor_params)
    metrics = {**_prefixed("actor", terms.metrics), "actor/loss": terms.loss,
               "actor/grad_norm": optax.tree.norm(grads),
               "grpo/recovery_rows": jnp.sum(batch["is_recovery"]).astype(jnp.float32)}
    return state.replace(step=state.step + 1, actor_params=new_params,
                         actor_opt_state=opt_state), metrics
