"""Token-level losses for PPO, GRPO, the critic and SFT (SPEC.md §4).

Every loss is a pure function of arrays (log-probabilities, values, advantages, masks), never of a
model, so it can be called on the outputs of any actor or critic.

Each loss comes in two forms:

* ``<name>_terms(...) -> LossTerms``: the *sums* over masked tokens (``numerator``), the number of
  masked tokens (``denominator``) and the masked sums of every metric (``metric_sums``). Terms of
  micro-batches add up (``accumulate``), so gradient accumulation is exact:
  ``Σ_mb ∇numerator_mb / Σ_mb denominator_mb == ∇ loss(full batch)``.
* ``<name>(...) -> (loss, metrics)``: the finished global token mean, ``numerator / denominator``,
  and the metrics as masked means.

Aggregation (SPEC §4) is a choice, ``aggregation=`` of the policy losses (``AGGREGATIONS``):

* ``"token_mean"`` (today's recipes): ``Σ_i m_i ℓ_i / Σ_i m_i``, the global token mean of the batch
  (every token weighs the same, so long episodes weigh more);
* ``"sequence_mean"``: the mean over sequences of each sequence's token mean,
  ``Σ_s (Σ_{i∈s} m_i ℓ_i / n_s) / S`` (every episode weighs the same; a sequence is a row, or a
  packed segment of a row when ``segment_ids`` are given);
* ``"constant"`` (Dr. GRPO / DAPO): ``Σ_i m_i ℓ_i / (C · S)`` with a fixed ``C`` per sequence (default
  the row length, the most tokens a row can hold): a token sum whose scale does not depend on the
  lengths the batch happened to have.

All three keep the numerator/denominator form: the per-token coefficient (``1`` or ``1/n_s``) depends
on the token's own sequence only, which never straddles micro-batches, and the denominators (tokens,
``S``, ``C·S``) add up over micro-batches, so accumulation stays exact.

ReTerm weighting (``reterm_token_weights``, "every group weighs the same" by default, the literal
reading as an option) turns the group objective
``J = M_O/(M_O+M_R) Σ_g J^O_g + M_R/(M_O+M_R) Σ_g J^R_g`` into per-token weights that multiply the
PPO/GRPO per-token surrogate, so the same ``ppo_policy_loss`` computes it exactly.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

__all__ = [
    "AGGREGATIONS",
    "LossTerms",
    "accumulate",
    "aggregate",
    "ppo_policy_loss",
    "ppo_policy_loss_terms",
    "reterm_token_weights",
    "sft_loss",
    "sft_loss_terms",
    "value_loss",
    "value_loss_terms",
]

EPS_LOW = 0.30
EPS_HIGH = 5.00
EPS_VALUE = 4.00
RETERM_WEIGHTINGS = ("equal", "literal")   # see reterm_token_weights
AGGREGATIONS = ("token_mean", "sequence_mean", "constant")   # see the module docstring


class LossTerms(NamedTuple):
    """Sums over the masked tokens of one (micro-)batch; a pytree, so terms add with ``accumulate``.

    numerator:   Σ_i m_i c_i ℓ_i (the loss sum; differentiate this for accumulated gradients);
                 ``c_i = 1``, or ``1/n_s`` under ``"sequence_mean"`` (``aggregate``).
    denominator: Σ_i m_i (number of masked tokens, float32), or the sequences ``S`` /
                 ``C · S`` of the other aggregations.
    metric_sums: {name: Σ_i m_i x_i} for every metric, averaged by the masked token count.
    tokens:      Σ_i m_i when the denominator is not the token count (``aggregation`` other than
                 ``"token_mean"``), so the metrics stay masked token means; None otherwise.
    """

    numerator: Float[Array, ""]
    denominator: Float[Array, ""]
    metric_sums: dict[str, Float[Array, ""]]
    tokens: Float[Array, ""] | None = None

    @property
    def loss(self) -> Float[Array, ""]:
        """The aggregated loss ``numerator / max(denominator, 1)`` (0 for an all-masked batch)."""
        return self.numerator / jnp.maximum(self.denominator, 1.0)

    @property
    def metrics(self) -> dict[str, Float[Array, ""]]:
        """Masked token means of the metrics, plus ``num_tokens``."""
        count = self.denominator if self.tokens is None else self.tokens
        d = jnp.maximum(count, 1.0)
        out = {k: v / d for k, v in self.metric_sums.items()}
        out["num_tokens"] = count
        return out


def accumulate(*terms: LossTerms) -> LossTerms:
    """Adds the terms of micro-batches: the result finishes to the full-batch loss and metrics."""
    if not terms:
        raise ValueError("accumulate needs at least one LossTerms")
    return jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *terms)


def _check_arrays(name: str, reference: str, **arrays) -> None:
    """Raises ValueError naming the argument whose shape differs from ``arrays[reference]``."""
    shape = jnp.shape(arrays[reference])
    for key, value in arrays.items():
        if value is not None and jnp.shape(value) != shape:
            raise ValueError(
                f"{name}: '{key}' has shape {jnp.shape(value)}, expected {shape} "
                f"(the shape of '{reference}')"
            )
    for key, value in arrays.items():
        if key.endswith("mask") or value is None:
            continue
        if not jnp.issubdtype(jnp.result_type(value), jnp.floating):
            raise ValueError(
                f"{name}: '{key}' must be floating point, got dtype {jnp.result_type(value)}"
            )


def _masked_sum(x: Array, mask: Array) -> Float[Array, ""]:
    return jnp.sum(jnp.where(mask, x, 0.0).astype(jnp.float32))


def _sequence_tokens(mask: Bool[Array, "b l"], segment_ids: Int[Array, "b l"] | None
                     ) -> tuple[Float[Array, "b l"], Float[Array, ""]]:
    """``n_s`` at every token (the masked tokens of its sequence) and ``S`` (sequences with one)."""
    batch, length = mask.shape
    if segment_ids is None:
        per_row = jnp.sum(mask, axis=1).astype(jnp.float32)
        return jnp.broadcast_to(per_row[:, None], mask.shape), jnp.sum(per_row > 0).astype(jnp.float32)
    seg = jnp.asarray(segment_ids, jnp.int32)
    ids = (jnp.arange(batch, dtype=jnp.int32)[:, None] * (length + 1) + seg).reshape(-1)
    counts = jax.ops.segment_sum(mask.reshape(-1).astype(jnp.float32), ids,
                                 batch * (length + 1))
    return counts[ids].reshape(mask.shape), jnp.sum(counts > 0).astype(jnp.float32)


def aggregate(
    per_token: Float[Array, "b l"],
    mask: Bool[Array, "b l"],
    metric_sums: dict[str, Float[Array, ""]],
    *,
    aggregation: str = "token_mean",
    constant: float = 0.0,
    segment_ids: Int[Array, "b l"] | None = None,
) -> LossTerms:
    """``LossTerms`` of per-token losses ``ℓ`` under an aggregation (the module docstring).

    token_mean:    numerator ``Σ m ℓ``,       denominator ``Σ m``;
    sequence_mean: numerator ``Σ m ℓ / n_s``, denominator ``S`` (sequences with a masked token);
    constant:      numerator ``Σ m ℓ``,       denominator ``C · S`` (``C = constant``, or the row
                   length ``L`` when ``constant <= 0``).
    ``metric_sums`` are masked token sums; the metrics stay token means (``LossTerms.tokens``).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"loss aggregation {aggregation!r} unknown; expected one of {AGGREGATIONS}")
    mask = jnp.asarray(mask, bool)
    if aggregation == "token_mean":      # the recipes' path: the same ops in the same order as before
        return LossTerms(numerator=_masked_sum(per_token, mask),
                         denominator=jnp.sum(mask).astype(jnp.float32), metric_sums=metric_sums)
    tokens = jnp.sum(mask).astype(jnp.float32)
    n_s, sequences = _sequence_tokens(mask, segment_ids)
    if aggregation == "sequence_mean":
        numerator = _masked_sum(per_token / jnp.maximum(n_s, 1.0), mask)
        denominator = sequences
    else:
        c = float(constant) if constant > 0 else float(mask.shape[1])
        numerator = _masked_sum(per_token, mask)
        denominator = c * sequences
    return LossTerms(numerator=numerator, denominator=denominator, metric_sums=metric_sums,
                     tokens=tokens)


def ppo_policy_loss_terms(
    logprobs: Float[Array, "b l"],
    old_logprobs: Float[Array, "b l"],
    advantages: Float[Array, "b l"],
    mask: Bool[Array, "b l"],
    *,
    eps_low: float = EPS_LOW,
    eps_high: float = EPS_HIGH,
    ref_logprobs: Float[Array, "b l"] | None = None,
    kl_coef: float = 0.0,
    entropies: Float[Array, "b l"] | None = None,
    entropy_coef: float = 0.0,
    token_weights: Float[Array, "b l"] | None = None,
    aggregation: str = "token_mean",
    aggregation_constant: float = 0.0,
    segment_ids: Int[Array, "b l"] | None = None,
) -> LossTerms:
    """Sums of the asymmetric-clip PPO loss over masked tokens, aggregated by ``aggregation``
    (``aggregate``: token_mean | sequence_mean | constant, with ``aggregation_constant``).

    ``ρ_i = exp(logp_i − logp_old_i)``;
    ``ℓ_i = −w_i · min(ρ_i A_i, clip(ρ_i, 1−ε_low, 1+ε_high) A_i)
           + β_KL · k3_i − β_H · H_i``, with
    ``k3_i = exp(logp_ref_i − logp_i) − (logp_ref_i − logp_i) − 1`` (unbiased, non-negative estimate
    of KL(π‖π_ref) on samples of π) and ``H_i`` the given per-token entropy. ``w_i`` are optional
    per-token weights (default 1; see ``reterm_token_weights``). Masked-out tokens contribute
    nothing, not even NaN gradients.

    Metrics (masked means): ``pg_loss``, ``clip_frac_low`` (A<0 and ρ<1−ε_low: the gradient is cut),
    ``clip_frac_high`` (A>0 and ρ>1+ε_high), ``clip_frac``, ``approx_kl`` (k3 estimate of
    KL(π_old‖π): ``ρ − 1 − log ρ``), ``ratio``, ``advantage``, and ``kl_ref`` / ``entropy`` when
    given.
    """
    _check_arrays(
        "ppo_policy_loss", "logprobs",
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask,
        ref_logprobs=ref_logprobs, entropies=entropies, token_weights=token_weights,
    )
    if kl_coef != 0.0 and ref_logprobs is None:
        raise ValueError(f"ppo_policy_loss: kl_coef={kl_coef} needs ref_logprobs")
    if entropy_coef != 0.0 and entropies is None:
        raise ValueError(f"ppo_policy_loss: entropy_coef={entropy_coef} needs entropies")
    mask = jnp.asarray(mask, bool)
    # Masked positions may hold garbage (padding logprobs); zero them before exp so no inf/NaN
    # reaches the gradient through jnp.where.
    log_ratio = jnp.where(mask, logprobs - old_logprobs, 0.0)
    ratio = jnp.exp(log_ratio)
    adv = jnp.where(mask, advantages, 0.0)
    clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    surrogate = jnp.minimum(ratio * adv, clipped_ratio * adv)
    weights = 1.0 if token_weights is None else jnp.where(mask, token_weights, 0.0)
    per_token = -weights * surrogate
    metric_sums = {}
    if ref_logprobs is not None:
        ref_diff = jnp.where(mask, ref_logprobs - logprobs, 0.0)
        kl_ref = jnp.exp(ref_diff) - ref_diff - 1.0
        per_token = per_token + kl_coef * kl_ref
        metric_sums["kl_ref"] = _masked_sum(kl_ref, mask)
    if entropies is not None:
        ent = jnp.where(mask, entropies, 0.0)
        per_token = per_token - entropy_coef * ent
        metric_sums["entropy"] = _masked_sum(ent, mask)
    clip_low = (adv < 0) & (ratio < 1.0 - eps_low)
    clip_high = (adv > 0) & (ratio > 1.0 + eps_high)
    metric_sums.update(
        pg_loss=_masked_sum(-weights * surrogate, mask),
        clip_frac_low=_masked_sum(clip_low, mask),
        clip_frac_high=_masked_sum(clip_high, mask),
        clip_frac=_masked_sum(clip_low | clip_high, mask),
        approx_kl=_masked_sum(ratio - 1.0 - log_ratio, mask),
        ratio=_masked_sum(ratio, mask),
        advantage=_masked_sum(adv, mask),
    )
    metric_sums = jax.tree.map(jax.lax.stop_gradient, metric_sums)
    return aggregate(per_token, mask, metric_sums, aggregation=aggregation,
                     constant=aggregation_constant, segment_ids=segment_ids)


def ppo_policy_loss(
    logprobs: Float[Array, "b l"],
    old_logprobs: Float[Array, "b l"],
    advantages: Float[Array, "b l"],
    mask: Bool[Array, "b l"],
    **kwargs,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """PPO policy loss, global token mean over ``mask`` (see ``ppo_policy_loss_terms``).

    ``L = −Σ_i m_i min(ρ_i A_i, clip(ρ_i, 1−ε_low, 1+ε_high) A_i) / Σ_i m_i`` (+ KL − entropy terms,
    coefficients default 0). Returns ``(loss, metrics)``.
    """
    terms = ppo_policy_loss_terms(logprobs, old_logprobs, advantages, mask, **kwargs)
    return terms.loss, terms.metrics


def value_loss_terms(
    values: Float[Array, "b l"],
    old_values: Float[Array, "b l"],
    returns: Float[Array, "b l"],
    mask: Bool[Array, "b l"],
    *,
    eps_value: float = EPS_VALUE,
) -> LossTerms:
    """Sums of the PPO-clipped value loss over masked tokens.

    ``ℓ_i = ½ max((V_i − G_i)², (V_old_i + clip(V_i − V_old_i, −ε_V, ε_V) − G_i)²)``.

    Metrics (masked means): ``vf_loss``, ``vf_clip_frac`` (the clipped term is strictly larger, so
    the gradient is cut), ``value``, ``return``, ``value_error`` (``(V−G)²``).
    """
    _check_arrays(
        "value_loss", "values",
        values=values, old_values=old_values, returns=returns, mask=mask,
    )
    mask = jnp.asarray(mask, bool)
    v = jnp.where(mask, values, 0.0)
    v_old = jnp.where(mask, old_values, 0.0)
    g = jnp.where(mask, returns, 0.0)
    unclipped = jnp.square(v - g)
    v_clipped = v_old + jnp.clip(v - v_old, -eps_value, eps_value)
    clipped = jnp.square(v_clipped - g)
    per_token = 0.5 * jnp.maximum(unclipped, clipped)
    metric_sums = {
        "vf_loss": _masked_sum(per_token, mask),
        "vf_clip_frac": _masked_sum(clipped > unclipped, mask),
        "value": _masked_sum(v, mask),
        "return": _masked_sum(g, mask),
        "value_error": _masked_sum(unclipped, mask),
    }
    metric_sums = jax.tree.map(jax.lax.stop_gradient, metric_sums)
    return LossTerms(
        numerator=_masked_sum(per_token, mask),
        denominator=jnp.sum(mask).astype(jnp.float32),
        metric_sums=metric_sums,
    )


def value_loss(
    values: Float[Array, "b l"],
    old_values: Float[Array, "b l"],
    returns: Float[Array, "b l"],
    mask: Bool[Array, "b l"],
    *,
    eps_value: float = EPS_VALUE,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """PPO-clipped value loss ``½ mean_masked max((V−G)², (V_old + clip(V−V_old, ±ε_V) − G)²)``."""
    terms = value_loss_terms(values, old_values, returns, mask, eps_value=eps_value)
    return terms.loss, terms.metrics


def sft_loss_terms(
    logprobs: Float[Array, "b l"],
    mask: Bool[Array, "b l"],
) -> LossTerms:
    """Sums of the masked negative log-likelihood: ``ℓ_i = −log π(y_i | h_i)`` where ``mask``.

    ``logprobs`` are the model's log-probabilities of the target tokens. Metric: ``nll``.
    """
    _check_arrays("sft_loss", "logprobs", logprobs=logprobs, mask=mask)
    mask = jnp.asarray(mask, bool)
    nll = -jnp.where(mask, logprobs, 0.0)
    return LossTerms(
        numerator=_masked_sum(nll, mask),
        denominator=jnp.sum(mask).astype(jnp.float32),
        metric_sums={"nll": jax.lax.stop_gradient(_masked_sum(nll, mask))},
    )


def sft_loss(
    logprobs: Float[Array, "b l"],
    mask: Bool[Array, "b l"],
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """SFT loss ``−Σ_i m_i log π(y_i | h_i) / Σ_i m_i`` (over ``loss_mask``)."""
    terms = sft_loss_terms(logprobs, mask)
    return terms.loss, terms.metrics


def reterm_token_weights(
    group_ids: Int[Array, " b"],
    is_recovery: Bool[Array, " b"],
    mask: Bool[Array, "b l"],
    *,
    num_groups: int | None = None,
    weighting: str = "equal",
    aggregation: str = "token_mean",
    aggregation_constant: float = 0.0,
) -> Float[Array, "b l"]:
    """Per-token weights that make ``ppo_policy_loss`` compute the ReTerm objective exactly.

    ``J = M_O/(M_O+M_R) Σ_{g∈O} J_g + M_R/(M_O+M_R) Σ_{g∈R} J_g`` where ``J_g`` is the clipped GRPO
    surrogate of group ``g`` as a token mean over the group's masked tokens, ``M_O``/``M_R`` the
    numbers of original/recovery groups present (SPEC §4). Two readings (``weighting``):

    * ``"equal"`` (default): every group weighs the same, each ``Σ_g`` a mean over its class, so
      ``J = 1/(M_O+M_R) Σ_g J_g`` and the recovery class carries ``M_R/(M_O+M_R)`` of the objective
      (20 % at 8 + 2); the weights sum to 1 over groups.
    * ``"literal"``: each group weighted by its class share and summed as written: recovery groups
      carry ``M_R²/(M_O²+M_R²)`` (5.9 % at 8 + 2) and the loss is scaled by
      ``(M_O²+M_R²)/(M_O+M_R)`` (6.8 at 8 + 2). Kept as an option for the audit.

    With ``N = Σ mask`` (tokens of the whole update), ``n_g`` the masked tokens of group ``g`` and
    ``c_g = 1`` (equal) or ``M_O``/``M_R`` by the group's kind (literal),

        ``w_i = N · c_g / ((M_O + M_R) · n_g)``  for token ``i`` of group ``g`` (0 off the mask),

    so ``Σ_i m_i w_i s_i / N = J``. Compute the weights on the *whole* update before splitting it
    into micro-batches; then accumulated ``LossTerms`` (denominators summing to ``N``) stay exact.

    ``aggregation`` says how ``J_g`` aggregates the group's tokens (the policy loss then takes the
    token mean, ``"token_mean"``, which the weights' ``N`` cancels). With ``k_g`` the group's rows
    holding a masked token and ``n_r`` the masked tokens of row ``r`` (one rollout per row):

    * ``"token_mean"`` (above): ``J_g`` the token mean over the group, ``w_i ∝ 1/n_g``;
    * ``"sequence_mean"``: ``J_g = 1/k_g Σ_r (token mean of row r)``, ``w_i = N c_g/(M k_g n_r)``;
    * ``"constant"`` (Dr. GRPO): ``J_g = Σ_{i∈g} s_i / (k_g C)``, ``w_i = N c_g/(M k_g C)``, ``C =
      aggregation_constant`` or the row length when that is ``<= 0``.

    Args:
      group_ids: [B] group of each row, integers in ``[0, num_groups)``.
      is_recovery: [B] whether the row belongs to a recovery group (constant within a group).
      mask: [B, L] tokens with a policy loss.
      num_groups: static upper bound on group ids (default ``B``).

    A group without masked tokens (padding rows to a fixed batch shape) is not counted in
    ``M_O``/``M_R``.
    """
    group_ids = jnp.asarray(group_ids)
    is_recovery = jnp.asarray(is_recovery, bool)
    mask = jnp.asarray(mask, bool)
    chex.assert_rank(mask, 2)
    batch = mask.shape[0]
    if group_ids.shape != (batch,) or is_recovery.shape != (batch,):
        raise ValueError(
            f"reterm_token_weights: 'group_ids' {group_ids.shape} and 'is_recovery' "
            f"{is_recovery.shape} must both have shape ({batch},), one entry per row of 'mask'"
        )
    if not jnp.issubdtype(group_ids.dtype, jnp.integer):
        raise ValueError(f"reterm_token_weights: 'group_ids' must be integers, got {group_ids.dtype}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"reterm_token_weights: aggregation={aggregation!r}; expected one of "
                         f"{AGGREGATIONS}")
    if weighting not in RETERM_WEIGHTINGS:
        raise ValueError(f"reterm_token_weights: weighting={weighting!r}; expected one of "
                         f"{RETERM_WEIGHTINGS}")
    num_groups = batch if num_groups is None else num_groups
    tokens_per_row = jnp.sum(mask, axis=1).astype(jnp.float32)
    rows_per_group = jax.ops.segment_sum(jnp.ones((batch,), jnp.float32), group_ids, num_groups)
    tokens_per_group = jax.ops.segment_sum(tokens_per_row, group_ids, num_groups)
    recovery_rows = jax.ops.segment_sum(is_recovery.astype(jnp.float32), group_ids, num_groups)
    present = tokens_per_group > 0     # padding rows (no masked token) form no group
    group_is_recovery = recovery_rows > 0
    m_recovery = jnp.sum(present & group_is_recovery).astype(jnp.float32)
    m_original = jnp.sum(present & ~group_is_recovery).astype(jnp.float32)
    if weighting == "equal":
        class_count = jnp.ones_like(rows_per_group)
    else:
        class_count = jnp.where(group_is_recovery, m_recovery, m_original)
    total_tokens = jnp.sum(tokens_per_row)
    if aggregation == "token_mean":
        group_weight = jnp.where(
            tokens_per_group > 0,
            total_tokens * class_count / ((m_original + m_recovery)
                                          * jnp.maximum(tokens_per_group, 1.0)),
            0.0,
        )
        return jnp.where(mask, group_weight[group_ids][:, None], 0.0).astype(jnp.float32)
    live_rows = jax.ops.segment_sum((tokens_per_row > 0).astype(jnp.float32), group_ids, num_groups)
    per_group = jnp.where(
        tokens_per_group > 0,
        total_tokens * class_count / ((m_original + m_recovery) * jnp.maximum(live_rows, 1.0)),
        0.0,
    )
    if aggregation == "sequence_mean":
        per_row = per_group[group_ids] / jnp.maximum(tokens_per_row, 1.0)
    else:
        c = float(aggregation_constant) if aggregation_constant > 0 else float(mask.shape[1])
        per_row = per_group[group_ids] / c
    return jnp.where(mask, per_row[:, None], 0.0).astype(jnp.float32)
