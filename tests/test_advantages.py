"""Properties of the advantage estimators (SPEC §3), each against an independent reference."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import rlax
from absl.testing import parameterized
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tr.rl.advantages import (
    Carry,
    GaeOutput,
    explained_variance,
    grpo_advantages,
    tb_gae,
    token_gae,
)

METHODS = ("blocked", "scan", "associative")
GAMMA_TURN, LAM_TURN = 0.9, 0.8


# ---------------------------------------------------------------- references written the obvious way


def reference_gae(rewards, values, node_mask, dones, turn_ids, gamma, lam, *, turn_boundary,
                  carry=(0.0, 0.0, -1)):
    """One row at a time, right to left, remembering the next node; float64."""
    rewards, values = np.asarray(rewards, np.float64), np.asarray(values, np.float64)
    advantages = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        v_next, a_next, t_next = (float(carry[0][b]), float(carry[1][b]), int(carry[2][b])) \
            if np.ndim(carry[0]) else carry
        for j in reversed(range(rewards.shape[1])):
            if not node_mask[b, j]:
                continue
            if turn_boundary and turn_ids[b, j] == t_next:
                g, l = 1.0, 1.0
            else:
                g, l = gamma, lam
            not_done = 0.0 if dones[b, j] else 1.0
            delta = rewards[b, j] + g * not_done * v_next - values[b, j]
            advantages[b, j] = delta + g * l * not_done * a_next
            v_next, a_next = values[b, j], advantages[b, j]
            t_next = turn_ids[b, j] if turn_ids is not None else -1
    return advantages


def ref_tb(d, gamma_turn=GAMMA_TURN, lam_turn=LAM_TURN, **kw):
    return reference_gae(d["rewards"], d["values"], d["actor_mask"], d["dones"], d["turn_ids"],
                         gamma_turn, lam_turn, turn_boundary=True, **kw)


def ref_token(d, mask, gamma, lam, **kw):
    return reference_gae(d["rewards"], d["values"], mask, d["dones"], None, gamma, lam,
                         turn_boundary=False, **kw)


# ---------------------------------------------------------------- layouts


def make_layout(seed, batch=3, length=48, max_turns=4, fractional=True):
    """Rows of packed episodes: prompt, then turns of action then observation tokens, then padding."""
    rng = np.random.default_rng(seed)
    actor = np.zeros((batch, length), bool)
    real = np.zeros((batch, length), bool)
    turns = np.zeros((batch, length), np.int32)
    dones = np.zeros((batch, length), bool)
    rewards = np.zeros((batch, length), np.float32)
    for b in range(batch):
        pos = 0
        while pos < length - 4:
            n_prompt = int(rng.integers(1, 4))
            real[b, pos:pos + n_prompt] = True
            pos += n_prompt
            last = -1
            for turn in range(1, int(rng.integers(1, max_turns + 1)) + 1):
                n_act, n_obs = int(rng.integers(1, 5)), int(rng.integers(0, 5))
                end = min(pos + n_act, length)
                actor[b, pos:end], turns[b, pos:end], real[b, pos:end] = True, turn, True
                last = end - 1 if end > pos else last
                pos = end
                end = min(pos + n_obs, length)
                turns[b, pos:end], real[b, pos:end] = turn, True
                pos = end
                if pos >= length:
                    break
            if last >= 0 and rng.random() < 0.8:  # sometimes the last episode is cut (no done)
                dones[b, last] = True
                rewards[b, last] = rng.random() * 2 if fractional else float(rng.integers(0, 2))
        if rng.random() < 0.5:
            real[b, length - int(rng.integers(1, 6)):] = False  # padding
            actor &= real
            dones &= real
    rewards = rewards + (rng.random((batch, length)) < 0.1) * rng.normal(size=(batch, length))
    rewards = np.where(real, rewards, 0.0).astype(np.float32)
    values = rng.normal(size=(batch, length)).astype(np.float32)
    return dict(rewards=rewards, values=values, actor_mask=actor, real_mask=real, turn_ids=turns,
                dones=dones)


def tb_partial(method, gamma_turn=GAMMA_TURN, lam_turn=LAM_TURN):
    return functools.partial(tb_gae, gamma_turn=gamma_turn, lam_turn=lam_turn, method=method)


@functools.lru_cache(maxsize=None)
def tb_fn(method, gamma_turn=GAMMA_TURN, lam_turn=LAM_TURN):
    """Jitted once per setting and reused across tests (compilation dominates test time)."""
    return jax.jit(tb_partial(method, gamma_turn, lam_turn))


def token_partial(method, gamma, lam):
    return functools.partial(token_gae, gamma=gamma, lam=lam, method=method)


@functools.lru_cache(maxsize=None)
def token_fn(method, gamma, lam):
    return jax.jit(token_partial(method, gamma, lam))


def call_tb(fn, d, carry=None):
    return fn(d["rewards"], d["values"], d["actor_mask"], d["turn_ids"], d["dones"], carry=carry)


# ---------------------------------------------------------------- tests


class TbGaeTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("blocked", "scan")
    def test_agrees_with_reference_loop(self, method):
        d = make_layout(seed=1)
        out = self.variant(tb_partial(method))(
            d["rewards"], d["values"], d["actor_mask"], d["turn_ids"], d["dones"])
        expected = ref_tb(d)
        np.testing.assert_allclose(out.advantages, expected, atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(
            out.returns, np.where(d["actor_mask"], expected + d["values"], 0.0), atol=2e-5, rtol=1e-5)
        chex.assert_type([out.advantages, out.returns, out.carry.value, out.carry.advantage],
                         jnp.float32)
        chex.assert_type(out.carry.turn_id, jnp.int32)

    @parameterized.parameters(*METHODS)
    def test_agrees_with_reference_loop_over_many_blocks_with_carry(self, method):
        # Length 300 (many blocks, many levels of the associative scan), a carry-in, long episodes.
        d = make_layout(seed=2, batch=3, length=300, max_turns=12)
        rng = np.random.default_rng(0)
        carry = Carry(rng.normal(size=3).astype(np.float32), rng.normal(size=3).astype(np.float32),
                      np.array([d["turn_ids"][0, -1], 99, d["turn_ids"][2, -1]], np.int32))
        if True:
            out = call_tb(tb_fn(method), d, carry)
            np.testing.assert_allclose(out.advantages, ref_tb(d, carry=carry), atol=5e-5, rtol=1e-5,
                                       err_msg=method)

    @parameterized.parameters(*METHODS)
    def test_zero_off_the_nodes(self, method):
        d = make_layout(seed=3)
        out = call_tb(tb_fn(method), d)
        self.assertTrue(np.all(np.asarray(out.advantages)[~d["actor_mask"]] == 0.0))
        self.assertTrue(np.all(np.asarray(out.returns)[~d["actor_mask"]] == 0.0))

    def test_decay_is_independent_of_observation_length_and_tokens_per_turn(self):
        # One episode, reward R at its end, zero values: every token of turn t gets R (γλ)^(T−t).
        reward, num_turns = 1.7, 4
        rows = []
        for actions, observations in [(1, 0), (3, 2), (5, 9), (2, 17)]:
            mask, turns = [], []
            for turn in range(1, num_turns + 1):
                mask += [True] * actions + [False] * observations
                turns += [turn] * (actions + observations)
            rows.append((np.array(mask), np.array(turns, np.int32)))
        for mask, turns in rows:
            length = len(mask)
            last = np.flatnonzero(mask)[-1]
            rewards = np.zeros((1, length), np.float32)
            rewards[0, last] = reward
            dones = np.zeros((1, length), bool)
            dones[0, last] = True
            out = tb_fn("blocked")(rewards, np.zeros((1, length), np.float32), mask[None],
                                   turns[None], dones)
            per_token = np.asarray(out.advantages)[0][mask]
            expected = reward * (GAMMA_TURN * LAM_TURN) ** (num_turns - turns[mask])
            np.testing.assert_allclose(per_token, expected, rtol=1e-6)

    def test_longer_logs_same_decisions_same_advantages(self):
        # Same decisions and outcome, observations 3x longer (and different critic values on them):
        # identical advantages on the action tokens when the action-token values agree.
        rng = np.random.default_rng(4)
        actions = [2, 3, 1, 4]
        layouts = []
        for obs_scale in (1, 3):
            mask, turns = [False, False], [0, 0]
            for turn, n_act in enumerate(actions, start=1):
                mask += [True] * n_act + [False] * (2 * turn * obs_scale)
                turns += [turn] * (n_act + 2 * turn * obs_scale)
            layouts.append((np.array(mask), np.array(turns, np.int32)))
        action_values = rng.normal(size=sum(actions)).astype(np.float32)
        action_rewards = np.zeros(sum(actions), np.float32)
        action_rewards[-1] = 0.63
        results = {method: [] for method in METHODS}
        for mask, turns in layouts:
            values = rng.normal(size=mask.shape).astype(np.float32)
            values[mask] = action_values
            rewards = np.zeros(mask.shape, np.float32)
            rewards[mask] = action_rewards
            dones = np.zeros(mask.shape, bool)
            dones[np.flatnonzero(mask)[-1]] = True
            for method in METHODS:
                out = tb_fn(method)(rewards[None], values[None], mask[None], turns[None], dones[None])
                results[method].append(np.asarray(out.advantages)[0][mask])
        # Bitwise for the sequential scan (observations only pass the carry); the blocked and
        # associative forms group the products by position, so they agree to float rounding.
        np.testing.assert_array_equal(*results["scan"])
        for method in METHODS:
            np.testing.assert_allclose(*results[method], rtol=1e-6, atol=1e-6)

    def test_last_turn_advantage_is_reward_minus_value(self):
        d = make_layout(seed=5, batch=1, length=40)
        mask, turns = d["actor_mask"][0], d["turn_ids"][0]
        # A single clean episode: last turn's tokens, reward on its last token.
        dones = np.zeros_like(d["dones"])
        last = np.flatnonzero(mask)[-1]
        dones[0, last] = True
        rewards = np.zeros_like(d["rewards"])
        rewards[0, last] = 0.41
        out = tb_fn("blocked")(rewards, d["values"], d["actor_mask"], d["turn_ids"], dones)
        in_last_turn = mask & (turns == turns[last])
        in_last_turn[:np.flatnonzero(mask & (turns != turns[last]))[-1] + 1] = False
        self.assertGreater(in_last_turn.sum(), 0)
        np.testing.assert_allclose(np.asarray(out.advantages)[0][in_last_turn],
                                   0.41 - d["values"][0][in_last_turn], rtol=1e-6, atol=1e-6)

    @parameterized.parameters(*METHODS)
    def test_unit_clock_equivalence(self, method):
        d = make_layout(seed=6)
        tb = call_tb(tb_fn(method, 1.0, 1.0), d)
        tok = token_fn(method, 1.0, 1.0)(d["rewards"], d["values"], d["actor_mask"], d["dones"])
        np.testing.assert_allclose(tb.advantages, tok.advantages, atol=1e-5, rtol=1e-6)
        np.testing.assert_allclose(tb.returns, tok.returns, atol=1e-5, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("blocked", "scan")
    def test_degenerate_layout_equals_rlax_truncated_gae(self, method):
        # One action token per turn, no observations: textbook truncated GAE.
        rng = np.random.default_rng(7)
        batch, length = 3, 30
        rewards = rng.normal(size=(batch, length)).astype(np.float32)
        values = rng.normal(size=(batch, length)).astype(np.float32)
        dones = rng.random((batch, length)) < 0.15
        turns = np.tile(np.arange(1, length + 1, dtype=np.int32), (batch, 1))
        out = self.variant(tb_partial(method))(rewards, values, np.ones((batch, length), bool), turns,
                                          dones)
        discount = GAMMA_TURN * (1.0 - dones.astype(np.float32))
        values_tp1 = np.concatenate([values, np.zeros((batch, 1), np.float32)], axis=1)
        expected = jax.vmap(rlax.truncated_generalized_advantage_estimation,
                            in_axes=(0, 0, None, 0))(rewards, discount, LAM_TURN, values_tp1)
        np.testing.assert_allclose(out.advantages, expected, atol=1e-5, rtol=1e-5)

    @parameterized.parameters(*METHODS)
    def test_partition_sweep_reproduces_unsplit(self, method):
        d = make_layout(seed=8, length=60)
        fn = tb_fn(method)
        full = call_tb(fn, d)
        cuts = [0, 12, 13, 25, 37, 60]  # uneven, with a 1-token partition
        parts, carry = [], None
        for start, stop in reversed(list(zip(cuts[:-1], cuts[1:]))):
            out = call_tb(fn, {k: v[:, start:stop] for k, v in d.items()}, carry)
            parts.insert(0, out)
            carry = out.carry
        swept = np.concatenate([p.advantages for p in parts], axis=1)
        if method == "scan":  # the same operations in the same order: bitwise
            np.testing.assert_array_equal(swept, full.advantages)
        np.testing.assert_allclose(swept, full.advantages, atol=1e-5, rtol=1e-6)
        np.testing.assert_allclose(np.concatenate([p.returns for p in parts], axis=1), full.returns,
                                   atol=1e-5, rtol=1e-6)
        for got, want in zip(carry, full.carry):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-6)

    def test_partition_without_nodes_passes_the_carry_through(self):
        d = make_layout(seed=9, length=10)
        empty = dict(d, actor_mask=np.zeros_like(d["actor_mask"]))
        carry = Carry(np.array([1.0, 2.0, 3.0], np.float32), np.array([4.0, 5.0, 6.0], np.float32),
                      np.array([7, 8, 9], np.int32))
        for method in METHODS:
            out = call_tb(tb_fn(method), empty, carry)
            for got, want in zip(out.carry, carry):
                np.testing.assert_array_equal(got, want)
            self.assertTrue(np.all(np.asarray(out.advantages) == 0))

    @parameterized.parameters(*METHODS)
    def test_truncation_identity(self, method):
        # Dropping the carried advantage at a cut loses exactly W_{j,k} A_full_k for the left part.
        d = make_layout(seed=10, length=50)
        fn = tb_fn(method)
        cut = 27
        full = call_tb(fn, d)
        right = call_tb(fn, {k: v[:, cut:] for k, v in d.items()})
        left = {k: v[:, :cut] for k, v in d.items()}
        cut_carry = right.carry._replace(advantage=jnp.zeros_like(right.carry.advantage))
        truncated = call_tb(fn, left, cut_carry)
        expected_loss = np.zeros(left["rewards"].shape)
        for b in range(left["rewards"].shape[0]):
            # W_{j,k}: product of ΓΛ(1−d) over the nodes from j to k−1, written from the definition.
            k_turn, weight = int(right.carry.turn_id[b]), 1.0
            for j in reversed(np.flatnonzero(left["actor_mask"][b])):
                same = left["turn_ids"][b, j] == k_turn
                weight *= (1.0 if same else GAMMA_TURN * LAM_TURN) * (0.0 if left["dones"][b, j] else 1.0)
                expected_loss[b, j] = weight * float(right.carry.advantage[b])
                k_turn = left["turn_ids"][b, j]
        np.testing.assert_allclose(np.asarray(full.advantages)[:, :cut] - truncated.advantages,
                                   expected_loss, atol=2e-5, rtol=1e-5)
        self.assertTrue(np.any(np.abs(expected_loss) > 1e-3))  # the cut matters in this layout

    def test_packed_episodes_equal_separate_episodes(self):
        d = make_layout(seed=11, batch=1, length=80)
        self.assertGreaterEqual(d["dones"].sum(), 2)
        full = np.asarray(call_tb(tb_fn("blocked"), d).advantages)[0]
        ends = list(np.flatnonzero(d["dones"][0]) + 1)
        starts = [0] + ends
        stops = ends + [d["rewards"].shape[1]]
        for start, stop in zip(starts, stops):
            piece = call_tb(tb_fn("blocked"), {k: v[:, start:stop] for k, v in d.items()})
            np.testing.assert_allclose(full[start:stop], np.asarray(piece.advantages)[0],
                                       atol=1e-5, rtol=1e-6)

    def test_fractional_rewards_stay_float32(self):
        d = make_layout(seed=12, fractional=True)
        d64 = dict(d, rewards=d["rewards"].astype(np.float64), values=d["values"].astype(np.float64))
        out = call_tb(tb_fn("blocked"), d64)
        chex.assert_type([out.advantages, out.returns], jnp.float32)
        last = np.argwhere(d["dones"])
        for b, j in last:  # a done token with a fractional reward: A = r − v exactly
            np.testing.assert_allclose(out.advantages[b, j], d["rewards"][b, j] - d["values"][b, j],
                                       rtol=1e-6)
            self.assertNotEqual(float(d["rewards"][b, j]) % 1.0, 0.0)
        with self.assertRaisesRegex(ValueError, "'rewards' must be floating point"):
            call_tb(tb_fn("blocked"), dict(d, rewards=d["rewards"].astype(np.int32)))

    def test_bad_input_names_the_field(self):
        d = make_layout(seed=13)
        with self.assertRaisesRegex(ValueError, "'turn_ids' has shape"):
            call_tb(tb_fn("blocked"), dict(d, turn_ids=d["turn_ids"][:, :-1]))
        with self.assertRaisesRegex(ValueError, "'turn_ids' must be integers"):
            call_tb(tb_fn("blocked"), dict(d, turn_ids=d["turn_ids"].astype(np.float32)))
        with self.assertRaisesRegex(ValueError, "'carry.value' has shape"):
            call_tb(tb_fn("blocked"), d, Carry(np.zeros(2), np.zeros(3), np.zeros(3, np.int32)))
        with self.assertRaisesRegex(ValueError, "method must be"):
            call_tb(tb_fn("fast"), d)

    def test_batch_sharded_over_eight_devices(self):
        devices = jax.devices()
        self.assertEqual(len(devices), 8, "tests/conftest.py forces 8 host devices")
        mesh = Mesh(np.array(devices), ("data",))
        d = make_layout(seed=14, batch=16, length=40)
        sharding = NamedSharding(mesh, PartitionSpec("data", None))
        sharded = {k: jax.device_put(v, sharding) for k, v in d.items()}
        for method in ("blocked", "scan"):
            fn = jax.jit(lambda x, method=method: call_tb(tb_partial(method), x))
            out = fn(sharded)
            self.assertEqual(len(out.advantages.sharding.device_set), 8)
            np.testing.assert_allclose(out.advantages, ref_tb(d), atol=2e-5, rtol=1e-5)
            np.testing.assert_allclose(out.advantages, call_tb(tb_fn(method), d).advantages,
                                       atol=1e-6, rtol=1e-6)


class TokenGaeTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(method=("blocked", "scan"), chain=("interleaved", "actions"))
    def test_agrees_with_reference_loop(self, method, chain):
        d = make_layout(seed=20)
        mask = d["real_mask"] if chain == "interleaved" else d["actor_mask"]
        out = self.variant(token_partial(method, 0.95, 0.7))(d["rewards"], d["values"], mask, d["dones"])
        self.assertIsInstance(out, GaeOutput)
        expected = ref_token(d, mask, 0.95, 0.7)
        np.testing.assert_allclose(out.advantages, expected, atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(out.returns, np.where(mask, expected + d["values"], 0.0),
                                   atol=2e-5, rtol=1e-5)
        np.testing.assert_array_equal(out.carry.turn_id, -1)

    @parameterized.parameters(*METHODS)
    def test_arbitrary_mask_row(self, method):
        mask = np.array([[1, 1, 0, 0, 1, 1, 0, 1, 0, 0]], bool)
        rewards = np.array([[0.1, -0.2, 9.0, 9.0, 0.3, 0.25, 9.0, 1.5, 9.0, 9.0]], np.float32)
        values = np.array([[0.5, 0.4, 7.0, 7.0, 0.2, 0.1, 7.0, 0.3, 7.0, 7.0]], np.float32)
        dones = np.zeros_like(mask)
        out = token_fn(method, 0.9, 0.95)(rewards, values, mask, dones)
        # Written out by hand over the nodes 0,1,4,5,7 (the 9s and 7s must never be read).
        v = {0: 0.5, 1: 0.4, 4: 0.2, 5: 0.1, 7: 0.3}
        r = {0: 0.1, 1: -0.2, 4: 0.3, 5: 0.25, 7: 1.5}
        adv, a_next, v_next = {}, 0.0, 0.0
        for j in (7, 5, 4, 1, 0):
            adv[j] = r[j] + 0.9 * v_next - v[j] + 0.9 * 0.95 * a_next
            a_next, v_next = adv[j], v[j]
        expected = np.zeros((1, 10))
        for j, a in adv.items():
            expected[0, j] = a
        np.testing.assert_allclose(out.advantages, expected, atol=1e-6, rtol=1e-6)

    @parameterized.parameters(*METHODS)
    def test_partition_sweep_reproduces_unsplit(self, method):
        d = make_layout(seed=21, length=50)
        fn = token_fn(method, 0.97, 0.9)
        full = fn(d["rewards"], d["values"], d["real_mask"], d["dones"])
        parts, carry = [], None
        for start, stop in reversed([(0, 13), (13, 14), (14, 50)]):
            out = fn(d["rewards"][:, start:stop], d["values"][:, start:stop],
                     d["real_mask"][:, start:stop], d["dones"][:, start:stop], carry=carry)
            parts.insert(0, out.advantages)
            carry = out.carry
        np.testing.assert_allclose(np.concatenate(parts, axis=1), full.advantages, atol=1e-5,
                                   rtol=1e-6)

    def test_truncation_identity(self):
        d = make_layout(seed=22, length=40)
        gamma, lam, cut = 0.97, 0.9, 19
        fn = token_fn("scan", gamma, lam)
        args = lambda s: (d["rewards"][:, s], d["values"][:, s], d["real_mask"][:, s], d["dones"][:, s])  # noqa: E731
        full = fn(*args(slice(None)))
        right = fn(*args(slice(cut, None)))
        truncated = fn(*args(slice(0, cut)), carry=right.carry._replace(advantage=jnp.zeros(3)))
        expected = np.zeros((3, cut))
        for b in range(3):
            weight = 1.0
            for j in reversed(np.flatnonzero(d["real_mask"][b, :cut])):
                weight *= gamma * lam * (0.0 if d["dones"][b, j] else 1.0)
                expected[b, j] = weight * float(right.carry.advantage[b])
        np.testing.assert_allclose(np.asarray(full.advantages)[:, :cut] - truncated.advantages,
                                   expected, atol=2e-5, rtol=1e-5)


class GrpoAndExplainedVarianceTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_grpo_population_std(self):
        rewards = np.array([[1.0, 0.0, 0.5, 0.25], [2.0, 2.0, 2.0, 2.0], [0.3, 1.7, 0.0, 1.0]],
                           np.float32)
        out = self.variant(grpo_advantages)(rewards)
        mean = rewards.mean(axis=1, keepdims=True)
        std = np.sqrt(((rewards - mean) ** 2).mean(axis=1, keepdims=True))  # ddof 0
        np.testing.assert_allclose(out, (rewards - mean) / (std + 1e-6), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out[1], 0.0)  # a constant group carries no signal
        chex.assert_type(out, jnp.float32)

    def test_grpo_rejects_integer_rewards(self):
        with self.assertRaisesRegex(ValueError, "floating point"):
            grpo_advantages(np.array([[1, 0]], np.int32))

    @chex.variants(with_jit=True, without_jit=True)
    def test_explained_variance_over_masked_positions(self):
        rng = np.random.default_rng(30)
        returns = rng.normal(size=(4, 12)).astype(np.float32)
        values = (returns + 0.5 * rng.normal(size=(4, 12))).astype(np.float32)
        mask = rng.random((4, 12)) < 0.6
        values_garbage = np.where(mask, values, 1e6).astype(np.float32)  # never read
        ev = self.variant(explained_variance)(returns, values_garbage, mask)
        g, v = returns[mask].astype(np.float64), values[mask].astype(np.float64)
        np.testing.assert_allclose(ev, 1.0 - np.var(g - v) / np.var(g), rtol=1e-5)
        constant = explained_variance(returns, np.full_like(returns, returns[mask].mean()), mask)
        np.testing.assert_allclose(constant, 0.0, atol=1e-5)
        self.assertLess(float(explained_variance(returns, -returns, mask)), 0.0)
        # every return equal (a batch without a success): NaN, not -inf, whatever the critic says
        flat = np.zeros_like(returns)
        self.assertTrue(np.isnan(self.variant(explained_variance)(flat, values, mask)))
        self.assertTrue(np.isnan(explained_variance(returns, values, np.zeros_like(mask))))
        # equal returns rebuilt as A + V in float32 (TB-GAE, λ = 1, no success): their rounding
        # noise is not a variance (it gave EV -1.7e13 in a warm-up, 2 Dec)
        reward = np.full_like(returns, 0.3)
        noisy = ((reward - values) + values).astype(np.float32)
        self.assertGreater(float(np.var(noisy[mask])), 0.0)
        self.assertTrue(np.isnan(self.variant(explained_variance)(noisy, values, mask)))
