"""Packed training rows (`arrays.pack_multiple`): several episodes to a row give the same targets and
the same PPO update as one episode per padded row, in fewer rows. The reference is the padded
layout every other test already checks; a tiny random actor and critic compute both."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tr.agent.records import EpisodeRecord, EpisodeStatus, Segment, episode_to_sequences
from tr.data.episodes import pack_rows
from tr.models.config import get_model_config
from tr.models.critic import CriticModel
from tr.models.decoder import Decoder
from tr.stages.arrays import training_arrays
from tr.stages.registry import ConfigError
from tr.train.compile import build_steps
from tr.train.model_fns import nnx_model_fns
from tr.train.optim import make_optimizer
from tr.train.updates import default_config
from tr.train.state import create_train_state

LENGTH = 128


def _record(i: int, rng: np.random.Generator) -> EpisodeRecord:
    """An episode of 1-3 turns with random token ids, lengths and behaviour log-probs."""
    segs = [Segment("prompt", rng.integers(1, 250, rng.integers(4, 20)).tolist(), turn=0)]
    turns = int(rng.integers(1, 4))
    for t in range(1, turns + 1):
        n = int(rng.integers(2, 9))
        segs.append(Segment("action", rng.integers(1, 250, n).tolist(), turn=t, source="policy",
                            logprobs=(-rng.random(n) * 3).tolist()))
        if t < turns:
            segs.append(Segment("observation", rng.integers(1, 250, rng.integers(3, 15)).tolist(),
                                turn=t))
    passed = bool(i % 3 == 0)
    return EpisodeRecord(episode_id=f"e{i}", task_id=f"t{i}", passed=passed, segments=segs,
                         status=EpisodeStatus.VERIFIED_PASS if passed else EpisodeStatus.VERIFIED_FAIL)


@pytest.fixture(scope="module")
def records():
    rng = np.random.default_rng(0)
    return [_record(i, rng) for i in range(12)]


def first_fit_decreasing(lengths, length):
    """The reference: each sequence, longest first (ties in input order), into the first row with
    room, a new row when none has."""
    rows, free = [], []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = next((r for r, f in enumerate(free) if f >= lengths[i]), None)
        if r is None:
            rows.append([])
            free.append(length)
            r = len(rows) - 1
        rows[r].append(i)
        free[r] -= lengths[i]
    return rows


def test_pack_rows_is_first_fit_decreasing_with_every_sequence_whole_in_its_segment(records):
    seqs = [episode_to_sequences(r, reward=float(r.passed))[0] for r in records]
    lengths = [len(s["tokens"]) for s in seqs]
    batch, placed = pack_rows(seqs, LENGTH, pad_id=3)
    assert placed == first_fit_decreasing(lengths, LENGTH)
    assert batch["tokens"].shape[0] == len(placed) < len(seqs)
    assert batch["tokens"].shape[0] <= -(-sum(lengths) // LENGTH) + 1   # first-fit decreasing is tight here
    for row, members in enumerate(placed):
        ids = batch["segment_ids"][row]
        used = ids > 0
        assert used.sum() == sum(lengths[i] for i in members)
        assert used[:used.sum()].all()                                  # padding at the end
        assert (batch["tokens"][row][~used] == 3).all() and not batch["loss_mask"][row][~used].any()
        for k, i in enumerate(members, start=1):
            at = ids == k
            for field in seqs[i]:
                np.testing.assert_array_equal(batch[field][row, at], seqs[i][field], err_msg=field)
            np.testing.assert_array_equal(batch["positions"][row, at], np.arange(lengths[i]))
    with pytest.raises(ValueError, match="rows of length 8"):
        pack_rows(seqs, 8)


def test_pack_rows_rounds_up_to_the_multiple_with_empty_rows(records):
    seqs = [episode_to_sequences(r, reward=float(r.passed))[0] for r in records]
    batch, placed = pack_rows(seqs, LENGTH, multiple=8)
    assert batch["tokens"].shape == (8, LENGTH) and placed[-1] == []
    assert batch["segment_ids"][len(first_fit_decreasing([len(s["tokens"]) for s in seqs],
                                                         LENGTH)):].max() == 0
    empty, none = pack_rows([], LENGTH, multiple=4)
    assert empty["tokens"].shape == (4, LENGTH) and none == [[]] * 4


def test_training_arrays_pack_into_the_fewest_rows_of_the_multiple(records):
    rewards = [float(r.passed) for r in records]
    padded, stats = training_arrays(records, rewards, rows=16, length=LENGTH)
    packed, pstats = training_arrays(records, rewards, rows=16, length=LENGTH, pack_multiple=4)
    assert padded["tokens"].shape == (16, LENGTH) and stats["rows"] == 16
    assert pstats["rows"] == packed["tokens"].shape[0] == 4        # 12 episodes fit in <= 4 rows
    assert pstats["fill"] > 3 * stats["fill"]
    for k in ("actor_mask", "loss_mask", "dones"):
        assert packed[k].sum() == padded[k].sum(), k
    assert packed["rewards"].sum() == pytest.approx(padded["rewards"].sum())
    with pytest.raises(ConfigError, match="pack_multiple=3"):
        training_arrays(records, rewards, rows=16, length=LENGTH, pack_multiple=3)
    with pytest.raises(ConfigError, match="num_windows"):
        training_arrays(records, rewards, rows=16, length=LENGTH, num_windows=2,
                        pack_multiple=4)


@pytest.mark.parametrize("estimator", ["tb_gae", "token_gae"])
def test_packed_rows_give_the_same_targets_and_update_as_padded_rows(records, estimator):
    config = get_model_config("tiny", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16,
                              d_ff=128, vocab_size=256, max_seq_len=LENGTH)
    actor = Decoder(config, rngs=nnx.Rngs(0))
    critic = CriticModel(config, rngs=nnx.Rngs(1))
    fns = nnx_model_fns(actor, critic, chunk_size=64)
    train = default_config()
    train.ppo.estimator = estimator
    train.ppo.gamma, train.ppo.lam = 0.99, 0.95       # token GAE with real decay: cuts must hold
    train.ppo.gamma_turn, train.ppo.lam_turn = 0.9, 0.8
    steps = build_steps(train, actor_logprobs=fns.actor_logprobs,
                        critic_values=fns.critic_values)
    state = create_train_state(actor_params=fns.actor_params, critic_params=fns.critic_params,
                               actor_optimizer=make_optimizer(train.actor.optimizer),
                               critic_optimizer=make_optimizer(train.critic.optimizer))
    rewards = [0.3 + float(r.passed) for r in records]
    results = {}
    for name, multiple in (("padded", 0), ("packed", 4)):
        arrays, _ = training_arrays(records, rewards, rows=12, length=LENGTH,
                                    pack_multiple=multiple)
        batch = {k: jnp.asarray(v) for k, v in arrays.items()}
        prepared = {**batch, **steps.targets(state, batch)}
        new_state, metrics = steps.ppo(state, prepared)
        results[name] = (prepared, jax.device_get(metrics), new_state)
    padded, packed = results["padded"][0], results["packed"][0]
    assert packed["tokens"].shape[0] == 4 and padded["tokens"].shape[0] == 12

    # Each episode's targets, found by its tokens: padded row i holds episode i.
    seqs = [episode_to_sequences(r, reward=x)[0] for r, x in zip(records, rewards)]
    _, placed = pack_rows(seqs, LENGTH)
    for row, members in enumerate(placed):
        for k, i in enumerate(members, start=1):
            n = len(seqs[i]["tokens"])
            at = np.asarray(packed["segment_ids"][row]) == k
            for field in ("old_logprobs", "old_values", "advantages", "returns"):
                np.testing.assert_allclose(np.asarray(packed[field][row])[at],
                                           np.asarray(padded[field][i, :n]), atol=2e-5, rtol=2e-5,
                                           err_msg=f"episode {i} {field}")
    m_pad, m_pack = results["padded"][1], results["packed"][1]
    for key in m_pad:
        assert m_pack[key] == pytest.approx(m_pad[key], rel=1e-4, abs=1e-5), key
    for a, b in zip(jax.tree.leaves(results["padded"][2].actor_params),
                    jax.tree.leaves(results["packed"][2].actor_params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_packing_without_segment_ids_would_mix_episodes(records):
    """The check above can fail: the same packed tokens without segment ids and positions (one
    causal sequence per row) give other log-probs to every episode after a row's first."""
    config = get_model_config("tiny", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16,
                              d_ff=128, vocab_size=256, max_seq_len=LENGTH)
    fns = nnx_model_fns(Decoder(config, rngs=nnx.Rngs(0)), chunk_size=64)
    rewards = [float(r.passed) for r in records]
    arrays, _ = training_arrays(records, rewards, rows=12, length=LENGTH, pack_multiple=4)
    batch = {k: jnp.asarray(v) for k, v in arrays.items()}
    with_ids = np.asarray(fns.actor_logprobs(fns.actor_params, batch))
    without = np.asarray(fns.actor_logprobs(fns.actor_params, {
        k: v for k, v in batch.items() if k not in ("segment_ids", "positions")}))
    later = (np.asarray(batch["segment_ids"]) > 1) & np.asarray(batch["actor_mask"])
    assert later.any() and np.abs(with_ids - without)[later].max() > 1e-3
