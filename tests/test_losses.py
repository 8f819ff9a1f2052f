"""Losses (SPEC §4): values and gradients against numpy references written from the formulas."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from tr.rl import losses
from tr.rl.losses import (
    LossTerms,
    accumulate,
    ppo_policy_loss,
    ppo_policy_loss_terms,
    reterm_token_weights,
    sft_loss,
    sft_loss_terms,
    value_loss,
    value_loss_terms,
)

ARBITRARY_MASK_ROW = [1, 1, 0, 0, 1, 1, 0, 1, 0, 0]


def make_batch(seed, batch=4, length=10):
    rng = np.random.default_rng(seed)
    mask = rng.random((batch, length)) < 0.7
    mask[0] = np.array(ARBITRARY_MASK_ROW, bool)
    old = rng.normal(-1.5, 0.5, size=(batch, length)).astype(np.float32)
    # Ratios spread over both clip edges: ρ from about e^-1.5 to e^2.5.
    logp = (old + rng.uniform(-1.5, 2.5, size=(batch, length))).astype(np.float32)
    adv = rng.normal(size=(batch, length)).astype(np.float32)
    # Masked positions hold garbage that must not leak into values or gradients.
    logp = np.where(mask, logp, np.float32(50.0))
    adv = np.where(mask, adv, np.float32(1e4))
    return dict(logp=logp, old=old, adv=adv, mask=mask,
                ref=(old + rng.normal(0, 0.3, size=old.shape)).astype(np.float32),
                entropy=rng.uniform(0, 3, size=old.shape).astype(np.float32))


def reference_ppo(logp, old, adv, mask, eps_low=0.30, eps_high=5.00):
    """Per-token loss and d(loss)/d(logp) from the formula, float64, global token mean."""
    logp, old, adv = (np.asarray(x, np.float64) for x in (logp, old, adv))
    ratio = np.exp(logp - old)
    unclipped = ratio * adv
    clipped = np.clip(ratio, 1 - eps_low, 1 + eps_high) * adv
    n = mask.sum()
    per_token = np.where(mask, -np.minimum(unclipped, clipped), 0.0)
    # The gradient flows through the unclipped term only where it is the smaller one, or where the
    # ratio lies inside the clip range (then both terms are equal with equal slopes).
    inside = (ratio >= 1 - eps_low) & (ratio <= 1 + eps_high)
    active = inside | (unclipped < clipped)
    grad = np.where(mask & active, -ratio * adv / n, 0.0)
    return per_token.sum() / n, grad, ratio


class PpoPolicyLossTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_value_and_metrics_match_numpy(self):
        b = make_batch(0)
        loss, metrics = self.variant(ppo_policy_loss)(b["logp"], b["old"], b["adv"], b["mask"])
        expected, _, ratio = reference_ppo(b["logp"], b["old"], b["adv"], b["mask"])
        np.testing.assert_allclose(loss, expected, rtol=1e-5)
        m, a = b["mask"], b["adv"]
        low = m & (a < 0) & (ratio < 0.7)
        high = m & (a > 0) & (ratio > 6.0)
        self.assertGreater(low.sum(), 0)
        self.assertGreater(high.sum(), 0)
        np.testing.assert_allclose(metrics["clip_frac_low"], low.sum() / m.sum(), rtol=1e-6)
        np.testing.assert_allclose(metrics["clip_frac_high"], high.sum() / m.sum(), rtol=1e-6)
        log_ratio = np.log(ratio)
        np.testing.assert_allclose(metrics["approx_kl"],
                                   (ratio - 1 - log_ratio)[m].mean(), rtol=1e-5)
        np.testing.assert_allclose(metrics["num_tokens"], m.sum())
        chex.assert_type([loss, *metrics.values()], jnp.float32)

    def test_gradient_is_zero_on_the_clipped_side_and_off_the_mask(self):
        b = make_batch(1)
        grad = jax.grad(lambda lp: ppo_policy_loss(lp, b["old"], b["adv"], b["mask"])[0])(b["logp"])
        _, expected, ratio = reference_ppo(b["logp"], b["old"], b["adv"], b["mask"])
        np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-8)
        clipped_side = b["mask"] & (((b["adv"] > 0) & (ratio > 6.0)) | ((b["adv"] < 0) & (ratio < 0.7)))
        self.assertGreater(clipped_side.sum(), 0)
        self.assertTrue(np.all(np.asarray(grad)[clipped_side] == 0.0))
        self.assertTrue(np.all(np.asarray(grad)[~b["mask"]] == 0.0))
        # The other side of each clip edge keeps its gradient (the clip is one-sided).
        other_side = b["mask"] & (((b["adv"] < 0) & (ratio > 6.0)) | ((b["adv"] > 0) & (ratio < 0.7)))
        self.assertGreater(other_side.sum(), 0)
        self.assertTrue(np.all(np.asarray(grad)[other_side] != 0.0))

    def test_masked_infinities_do_not_poison_the_gradient(self):
        b = make_batch(2)
        logp = np.where(b["mask"], b["logp"], -np.inf).astype(np.float32)
        loss, grad = jax.value_and_grad(
            lambda lp: ppo_policy_loss(lp, b["old"], b["adv"], b["mask"])[0])(logp)
        self.assertTrue(np.isfinite(loss))
        self.assertTrue(np.all(np.isfinite(grad)))

    def test_asymmetric_clip_defaults(self):
        self.assertEqual((losses.EPS_LOW, losses.EPS_HIGH, losses.EPS_VALUE), (0.30, 5.00, 4.00))
        # ρ = 5.5 with A > 0 is inside the high clip (1 + 5.0) and keeps its gradient.
        mask = np.ones((1, 2), bool)
        logp = np.log(np.array([[5.5, 6.5]], np.float32))
        grad = jax.grad(lambda lp: ppo_policy_loss(lp, np.zeros((1, 2), np.float32),
                                                   np.ones((1, 2), np.float32), mask)[0])(logp)
        np.testing.assert_allclose(grad, [[-5.5 / 2, 0.0]], rtol=1e-6)

    def test_kl_and_entropy_terms(self):
        b = make_batch(3)
        base, _ = ppo_policy_loss(b["logp"], b["old"], b["adv"], b["mask"])
        with_ref, metrics = ppo_policy_loss(b["logp"], b["old"], b["adv"], b["mask"],
                                            ref_logprobs=b["ref"], entropies=b["entropy"])
        np.testing.assert_allclose(with_ref, base, rtol=1e-7)  # coefficients default to 0
        m = b["mask"]
        diff = (b["ref"] - b["logp"]).astype(np.float64)
        k3 = np.exp(diff) - diff - 1
        np.testing.assert_allclose(metrics["kl_ref"], k3[m].mean(), rtol=1e-5)
        np.testing.assert_allclose(metrics["entropy"], b["entropy"][m].mean(), rtol=1e-5)

        def full(lp, ent):
            return ppo_policy_loss(lp, b["old"], b["adv"], m, ref_logprobs=b["ref"], kl_coef=0.1,
                                   entropies=ent, entropy_coef=0.01)[0]

        loss = full(b["logp"], b["entropy"])
        np.testing.assert_allclose(
            loss, float(base) + 0.1 * k3[m].mean() - 0.01 * b["entropy"][m].mean(), rtol=1e-5)
        grad_lp, grad_ent = jax.grad(full, argnums=(0, 1))(b["logp"], b["entropy"])
        _, pg_grad, _ = reference_ppo(b["logp"], b["old"], b["adv"], m)
        kl_grad = np.where(m, 0.1 * (1 - np.exp(diff)) / m.sum(), 0.0)
        np.testing.assert_allclose(grad_lp, pg_grad + kl_grad, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(grad_ent, np.where(m, -0.01 / m.sum(), 0.0), rtol=1e-6)
        with self.assertRaisesRegex(ValueError, "kl_coef=0.1 needs ref_logprobs"):
            ppo_policy_loss(b["logp"], b["old"], b["adv"], m, kl_coef=0.1)
        with self.assertRaisesRegex(ValueError, "entropy_coef=0.1 needs entropies"):
            ppo_policy_loss(b["logp"], b["old"], b["adv"], m, entropy_coef=0.1)

    def test_bad_input_names_the_argument(self):
        b = make_batch(4)
        with self.assertRaisesRegex(ValueError, "'advantages' has shape"):
            ppo_policy_loss(b["logp"], b["old"], b["adv"][:, :3], b["mask"])
        with self.assertRaisesRegex(ValueError, "'advantages' must be floating point"):
            ppo_policy_loss(b["logp"], b["old"], b["adv"].astype(np.int32), b["mask"])


def split_rows(batch_dict, bounds):
    return [{k: v[a:b] for k, v in batch_dict.items()} for a, b in zip(bounds[:-1], bounds[1:])]


class AccumulationTest(parameterized.TestCase):
    """Σ numerators / Σ denominators over micro-batches equals the full batch: values and grads."""

    def _check(self, terms_fn, b, grad_key):
        full_terms = terms_fn(b)
        micro = split_rows(b, [0, 1, 3, 4])  # uneven micro-batches
        summed = accumulate(*[terms_fn(mb) for mb in micro])
        np.testing.assert_allclose(summed.loss, full_terms.loss, rtol=1e-6)
        for name, value in full_terms.metrics.items():
            np.testing.assert_allclose(summed.metrics[name], value, rtol=1e-5, atol=1e-7,
                                       err_msg=name)

        def numerator(x, mb):
            return terms_fn(dict(mb, **{grad_key: x})).numerator

        grads = [jax.grad(numerator)(mb[grad_key], mb) for mb in micro]
        accumulated = np.concatenate(grads, axis=0) / float(summed.denominator)
        full_grad = jax.grad(lambda x: terms_fn(dict(b, **{grad_key: x})).loss)(b[grad_key])
        np.testing.assert_allclose(accumulated, full_grad, rtol=1e-5, atol=1e-8)

    def test_policy_loss_accumulates_exactly(self):
        b = make_batch(5)
        self._check(lambda d: ppo_policy_loss_terms(d["logp"], d["old"], d["adv"], d["mask"],
                                                    ref_logprobs=d["ref"], kl_coef=0.05),
                    b, "logp")

    def test_value_loss_accumulates_exactly(self):
        b = make_value_batch(6)
        self._check(lambda d: value_loss_terms(d["v"], d["v_old"], d["g"], d["mask"]), b, "v")

    def test_sft_loss_accumulates_exactly(self):
        b = make_batch(7)
        self._check(lambda d: sft_loss_terms(d["logp"], d["mask"]), b, "logp")

    @parameterized.parameters(("sequence_mean", 0.0), ("constant", 0.0), ("constant", 7.0))
    def test_aggregations_accumulate_exactly(self, aggregation, constant):
        b = make_batch(9)
        b["mask"][2] = False                     # a row with no token: no sequence
        self._check(lambda d: ppo_policy_loss_terms(d["logp"], d["old"], d["adv"], d["mask"],
                                                    aggregation=aggregation,
                                                    aggregation_constant=constant),
                    b, "logp")

    def test_terms_are_a_pytree(self):
        terms = sft_loss_terms(make_batch(8)["logp"], make_batch(8)["mask"])
        self.assertIsInstance(terms, LossTerms)
        self.assertLen(jax.tree.leaves(terms), 3)  # numerator, denominator, the "nll" metric sum
        with self.assertRaisesRegex(ValueError, "at least one"):
            accumulate()


def make_value_batch(seed, batch=4, length=10):
    rng = np.random.default_rng(seed)
    mask = rng.random((batch, length)) < 0.7
    mask[0] = np.array(ARBITRARY_MASK_ROW, bool)
    v_old = rng.normal(0, 3, size=(batch, length)).astype(np.float32)
    v = (v_old + rng.uniform(-8, 8, size=(batch, length))).astype(np.float32)
    g = rng.normal(0, 4, size=(batch, length)).astype(np.float32)
    return dict(v=np.where(mask, v, 1e4).astype(np.float32), v_old=v_old, g=g, mask=mask)


def reference_value_loss(v, v_old, g, mask, eps=4.0):
    v, v_old, g = (np.asarray(x, np.float64) for x in (v, v_old, g))
    unclipped = (v - g) ** 2
    v_clip = v_old + np.clip(v - v_old, -eps, eps)
    clipped = (v_clip - g) ** 2
    n = mask.sum()
    loss = np.where(mask, 0.5 * np.maximum(unclipped, clipped), 0.0).sum() / n
    inside = np.abs(v - v_old) <= eps
    # Slope of the max: unclipped term where it wins (or ties inside the range, same slope);
    # the clipped term has zero slope in v outside the range.
    through = (unclipped > clipped) | inside
    grad = np.where(mask & through, (v - g) / n, 0.0)
    return loss, grad, unclipped, clipped


class ValueLossTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_value_and_metrics_match_numpy(self):
        b = make_value_batch(10)
        loss, metrics = self.variant(value_loss)(b["v"], b["v_old"], b["g"], b["mask"])
        expected, _, unclipped, clipped = reference_value_loss(b["v"], b["v_old"], b["g"], b["mask"])
        np.testing.assert_allclose(loss, expected, rtol=1e-5)
        m = b["mask"]
        np.testing.assert_allclose(metrics["vf_clip_frac"], (clipped > unclipped)[m].mean(),
                                   rtol=1e-6)
        np.testing.assert_allclose(metrics["value_error"], unclipped[m].mean(), rtol=1e-5)

    def test_gradient_is_zero_where_the_clipped_term_wins(self):
        b = make_value_batch(11)
        grad = jax.grad(lambda v: value_loss(v, b["v_old"], b["g"], b["mask"])[0])(b["v"])
        _, expected, unclipped, clipped = reference_value_loss(b["v"], b["v_old"], b["g"], b["mask"])
        np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-8)
        clipped_wins = b["mask"] & (clipped > unclipped)
        self.assertGreater(clipped_wins.sum(), 0)
        self.assertTrue(np.all(np.asarray(grad)[clipped_wins] == 0.0))
        self.assertTrue(np.all(np.asarray(grad)[~b["mask"]] == 0.0))

    def test_eps_value_default_and_override(self):
        b = make_value_batch(12)
        default, _ = value_loss(b["v"], b["v_old"], b["g"], b["mask"])
        np.testing.assert_allclose(default, reference_value_loss(b["v"], b["v_old"], b["g"],
                                                                 b["mask"], eps=4.0)[0], rtol=1e-5)
        tight, _ = value_loss(b["v"], b["v_old"], b["g"], b["mask"], eps_value=0.5)
        np.testing.assert_allclose(tight, reference_value_loss(b["v"], b["v_old"], b["g"],
                                                               b["mask"], eps=0.5)[0], rtol=1e-5)


class SftLossTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_masked_nll_and_gradient(self):
        b = make_batch(20)
        fn = self.variant(sft_loss)
        loss, metrics = fn(b["logp"], b["mask"])
        m = b["mask"]
        np.testing.assert_allclose(loss, -b["logp"][m].astype(np.float64).mean(), rtol=1e-5)
        np.testing.assert_allclose(metrics["nll"], loss, rtol=1e-6)
        grad = jax.grad(lambda lp: sft_loss(lp, m)[0])(b["logp"])
        np.testing.assert_allclose(grad, np.where(m, -1.0 / m.sum(), 0.0), rtol=1e-6)

    def test_all_masked_batch_is_zero_not_nan(self):
        loss, metrics = sft_loss(np.zeros((2, 3), np.float32), np.zeros((2, 3), bool))
        self.assertEqual(float(loss), 0.0)
        self.assertEqual(float(metrics["num_tokens"]), 0.0)


class ReTermWeightingTest(parameterized.TestCase):

    def _setup(self):
        rng = np.random.default_rng(30)
        # 5 original groups of 2 rollouts and 2 recovery groups of 3: M_O = 5, M_R = 2.
        group_ids = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 5, 6, 6, 6], np.int32)
        is_recovery = group_ids >= 5
        batch, length = len(group_ids), 9
        mask = rng.random((batch, length)) < 0.6
        mask[:, 0] = True
        b = make_batch(31, batch=batch, length=length + 1)
        b = {k: v[:, :length] for k, v in b.items()}
        b["mask"] = mask
        b["logp"] = np.where(mask, b["logp"], 0.0).astype(np.float32)
        return b, group_ids, is_recovery

    @chex.variants(with_jit=True, without_jit=True)
    def test_weighted_loss_equals_the_reterm_objective(self):
        b, group_ids, is_recovery = self._setup()
        weights = self.variant(functools.partial(reterm_token_weights, num_groups=8,
                                                 weighting="literal"))(
            group_ids, is_recovery, b["mask"])
        chex.assert_type(weights, jnp.float32)
        loss, _ = ppo_policy_loss(b["logp"], b["old"], b["adv"], b["mask"], token_weights=weights)
        # J_g: token mean of the clipped surrogate over the group's masked tokens, from numpy.
        ratio = np.exp(b["logp"].astype(np.float64) - b["old"])
        surrogate = np.minimum(ratio * b["adv"], np.clip(ratio, 0.7, 6.0) * b["adv"])
        m_o, m_r = 5, 2
        objective = 0.0
        for g in range(7):
            rows = group_ids == g
            j_g = surrogate[rows][b["mask"][rows]].mean()
            objective += (m_r if g >= 5 else m_o) / (m_o + m_r) * j_g
        np.testing.assert_allclose(loss, -objective, rtol=1e-5)
        self.assertTrue(np.all(np.asarray(weights)[~b["mask"]] == 0.0))

    def test_equal_weighting_is_the_mean_over_groups(self):
        b, group_ids, is_recovery = self._setup()
        weights = reterm_token_weights(group_ids, is_recovery, b["mask"], num_groups=8)
        loss, _ = ppo_policy_loss(b["logp"], b["old"], b["adv"], b["mask"], token_weights=weights)
        ratio = np.exp(b["logp"].astype(np.float64) - b["old"])
        surrogate = np.minimum(ratio * b["adv"], np.clip(ratio, 0.7, 6.0) * b["adv"])
        j = [surrogate[group_ids == g][b["mask"][group_ids == g]].mean() for g in range(7)]
        # 5/7 · mean over original groups + 2/7 · mean over recovery groups = mean over groups
        objective = 5 / 7 * np.mean(j[:5]) + 2 / 7 * np.mean(j[5:])
        np.testing.assert_allclose(loss, -objective, rtol=1e-5)
        np.testing.assert_allclose(np.mean(j), objective, rtol=1e-12)

    @parameterized.parameters(("equal", 0.2, 1.0), ("literal", 4 / 68, 6.8))
    def test_class_shares_at_eight_plus_two(self, weighting, recovery_share, scale):
        # the paper's 8 original + 2 recovery groups of 16, rows of unequal lengths
        rng = np.random.default_rng(7)
        group_ids = np.repeat(np.arange(10, dtype=np.int32), 16)
        is_recovery = group_ids >= 8
        mask = rng.random((160, 12)) < rng.uniform(0.2, 1.0, (160, 1))
        mask[:, 0] = True
        w = np.asarray(reterm_token_weights(group_ids, is_recovery, mask, weighting=weighting))
        n = mask.sum()
        # share of the objective (and of the gradient for equal per-token surrogates) per class
        np.testing.assert_allclose(w[is_recovery].sum() / w.sum(), recovery_share, rtol=1e-5)
        np.testing.assert_allclose(w.sum() / n, scale, rtol=1e-5)   # the loss's overall scale
        per_group = np.array([w[group_ids == g].sum() for g in range(10)]) / n
        if weighting == "equal":
            np.testing.assert_allclose(per_group, 0.1, rtol=1e-5)   # every group weighs the same
        with self.assertRaisesRegex(ValueError, "weighting='mean'"):
            reterm_token_weights(group_ids, is_recovery, mask, weighting="mean")

    @parameterized.parameters("equal", "literal")
    def test_padding_groups_change_nothing(self, weighting):
        # 4 original + 1 recovery groups of 4, padded with 3 groups of all-false rows to a fixed
        # shape: the real rows' weights are those of the unpadded batch (padding is no group)
        rng = np.random.default_rng(3)
        mask = rng.random((20, 9)) < 0.6
        mask[:, 0] = True
        group_ids = np.arange(20, dtype=np.int32) // 4
        is_recovery = group_ids == 4
        w = np.asarray(reterm_token_weights(group_ids, is_recovery, mask, weighting=weighting))
        pad_mask = np.concatenate([mask, np.zeros((12, 9), bool)])
        pad_ids = np.arange(32, dtype=np.int32) // 4
        pad_rec = np.concatenate([is_recovery, np.zeros(12, bool)])
        wp = np.asarray(reterm_token_weights(pad_ids, pad_rec, pad_mask, weighting=weighting))
        np.testing.assert_allclose(wp[:20], w, rtol=1e-6)
        assert not wp[20:].any()

    def test_weighted_loss_accumulates_over_micro_batches(self):
        b, group_ids, is_recovery = self._setup()
        b["w"] = np.asarray(reterm_token_weights(group_ids, is_recovery, b["mask"]))  # whole update

        def terms(d):
            return ppo_policy_loss_terms(d["logp"], d["old"], d["adv"], d["mask"],
                                         token_weights=d["w"])

        micro = split_rows(b, [0, 5, 11, 16])  # micro-batches cut through groups
        summed = accumulate(*[terms(mb) for mb in micro])
        np.testing.assert_allclose(summed.loss, terms(b).loss, rtol=1e-5)
        grads = [jax.grad(lambda x, mb=mb: terms(dict(mb, logp=x)).numerator)(mb["logp"])
                 for mb in micro]
        full = jax.grad(lambda x: terms(dict(b, logp=x)).loss)(b["logp"])
        np.testing.assert_allclose(np.concatenate(grads) / float(summed.denominator), full,
                                   rtol=1e-5, atol=1e-8)

    def test_bad_group_ids(self):
        mask = np.ones((3, 4), bool)
        with self.assertRaisesRegex(ValueError, "'group_ids'.*must both have shape \\(3,\\)"):
            reterm_token_weights(np.zeros(2, np.int32), np.zeros(3, bool), mask)
        with self.assertRaisesRegex(ValueError, "'group_ids' must be integers"):
            reterm_token_weights(np.zeros(3, np.float32), np.zeros(3, bool), mask)


class AggregationTest(parameterized.TestCase):
    """token_mean / sequence_mean / constant against numpy written from the definitions."""

    def _batch(self):
        b = make_batch(12, batch=5)
        b["mask"][2] = False                      # an empty row is no sequence
        b["mask"][4] = False
        b["mask"][4, 3] = True                    # a one-token sequence
        return b

    @parameterized.parameters(("token_mean", 0.0), ("sequence_mean", 0.0), ("constant", 0.0),
                              ("constant", 64.0))
    def test_value_and_gradient_match_numpy(self, aggregation, constant):
        b = self._batch()
        mask = b["mask"]
        ratio = np.exp(b["logp"].astype(np.float64) - b["old"])
        surrogate = np.minimum(ratio * b["adv"], np.clip(ratio, 0.7, 6.0) * b["adv"])
        per_token = np.where(mask, -surrogate, 0.0)
        n_rows = mask.sum(axis=1)
        live = n_rows > 0
        if aggregation == "token_mean":
            expected = per_token.sum() / mask.sum()
        elif aggregation == "sequence_mean":
            expected = np.mean([per_token[r].sum() / n_rows[r] for r in np.flatnonzero(live)])
        else:
            c = constant or mask.shape[1]
            expected = per_token.sum() / (c * live.sum())
        terms = ppo_policy_loss_terms(b["logp"], b["old"], b["adv"], mask,
                                      aggregation=aggregation, aggregation_constant=constant)
        np.testing.assert_allclose(terms.loss, expected, rtol=1e-5)
        # the metrics stay masked token means whatever the aggregation
        np.testing.assert_allclose(terms.metrics["num_tokens"], mask.sum())
        np.testing.assert_allclose(terms.metrics["pg_loss"], per_token.sum() / mask.sum(),
                                   rtol=1e-5)
        # gradient: the per-token gradient of the token mean rescaled by each token's coefficient
        _, grad_token_mean, _ = reference_ppo(b["logp"], b["old"], b["adv"], mask)
        g = grad_token_mean * mask.sum()
        if aggregation == "sequence_mean":
            g = g / np.maximum(n_rows, 1)[:, None] / live.sum()
        elif aggregation == "constant":
            g = g / ((constant or mask.shape[1]) * live.sum())
        else:
            g = g / mask.sum()
        got = jax.grad(lambda x: ppo_policy_loss_terms(
            x, b["old"], b["adv"], mask, aggregation=aggregation,
            aggregation_constant=constant).loss)(b["logp"])
        np.testing.assert_allclose(got, g, rtol=1e-5, atol=1e-8)

    def test_token_mean_is_the_default_and_bitwise_unchanged(self):
        b = self._batch()
        default = ppo_policy_loss_terms(b["logp"], b["old"], b["adv"], b["mask"])
        named = ppo_policy_loss_terms(b["logp"], b["old"], b["adv"], b["mask"],
                                      aggregation="token_mean")
        self.assertIsNone(default.tokens)
        self.assertEqual(float(default.numerator), float(named.numerator))
        self.assertEqual(float(default.denominator), float(b["mask"].sum()))

    def test_sequence_mean_over_packed_segments(self):
        # two rows, each packing sequences [1,1,1,2,2,0 ...]: the mean is over the 4 sequences
        mask = np.array([[1, 1, 0, 1, 1, 1, 0, 0], [1, 0, 1, 1, 1, 1, 1, 0]], bool)
        seg = np.array([[1, 1, 1, 2, 2, 2, 0, 0], [1, 1, 2, 2, 2, 2, 2, 0]], np.int32)
        x = np.arange(16, dtype=np.float32).reshape(2, 8)
        terms = losses.aggregate(jnp.asarray(x), mask, {}, aggregation="sequence_mean",
                                 segment_ids=seg)
        means = []
        for r in range(2):
            for s_id in (1, 2):
                sel = mask[r] & (seg[r] == s_id)
                means.append(x[r][sel].mean())
        np.testing.assert_allclose(terms.loss, np.mean(means), rtol=1e-6)
        np.testing.assert_allclose(terms.denominator, 4.0)

    def test_unknown_aggregation_is_named(self):
        b = self._batch()
        with self.assertRaisesRegex(ValueError, "aggregation 'mean' unknown"):
            ppo_policy_loss_terms(b["logp"], b["old"], b["adv"], b["mask"], aggregation="mean")
        with self.assertRaisesRegex(ValueError, "aggregation='mean'"):
            reterm_token_weights(np.zeros(5, np.int32), np.zeros(5, bool), b["mask"],
                                 aggregation="mean")

    @parameterized.parameters(("sequence_mean", 0.0), ("constant", 0.0), ("constant", 20.0))
    def test_group_weights_compute_the_aggregated_group_objective(self, aggregation, constant):
        # 3 original groups of 3 rollouts and 1 recovery group of 3, rows of unequal lengths
        rng = np.random.default_rng(40)
        group_ids = np.repeat(np.arange(4, dtype=np.int32), 3)
        is_recovery = group_ids == 3
        b = make_batch(41, batch=12, length=10)
        mask = b["mask"]
        mask[5] = False                           # a lost row: its group has k_g = 2
        mask[:, 0] |= np.arange(12) != 5
        del rng
        w = reterm_token_weights(group_ids, is_recovery, mask, num_groups=4,
                                 aggregation=aggregation, aggregation_constant=constant)
        loss, _ = ppo_policy_loss(b["logp"], b["old"], b["adv"], mask, token_weights=w)
        ratio = np.exp(b["logp"].astype(np.float64) - b["old"])
        surrogate = np.minimum(ratio * b["adv"], np.clip(ratio, 0.7, 6.0) * b["adv"])
        j = []
        for g in range(4):
            rows = [r for r in np.flatnonzero(group_ids == g) if mask[r].any()]
            if aggregation == "sequence_mean":
                j.append(np.mean([surrogate[r][mask[r]].mean() for r in rows]))
            else:
                c = constant or mask.shape[1]
                j.append(np.mean([surrogate[r][mask[r]].sum() / c for r in rows]))
        np.testing.assert_allclose(loss, -np.mean(j), rtol=1e-5)
