"""EpisodeSampler: caches reused across turns give the log-probs of a fresh full forward, only
appended tokens are prefilled, summaries/evictions rebuild by prefill, slots refill as requests
finish, weight sync drops caches without recompiling, compiles stay bounded."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tr.models.config import get_model_config
from tr.models.decoder import Decoder, token_logprobs
from tr.sampling.sampler import SamplingParams
from tr.sampling.slots import EpisodeSampler, RequestCancelled

CFG = get_model_config("tiny", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
                       max_seq_len=1024)
logprobs_of = nnx.jit(token_logprobs, static_argnames=("chunk_size",))
forward = nnx.jit(lambda m, t: m(t))
TRAIN = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16, seed=1)


@pytest.fixture(scope="module")
def model():
    return Decoder(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def sampler(model):
    """One sampler for the module (3 rows), so its functions compile once; each test frees its rows."""
    s = EpisodeSampler(model, slots=3, max_new_tokens=32, min_capacity=128, prefill_chunk=64, decode_steps=4,
                       attention_block=32)  # the cache is read in blocks (online softmax)
    yield s
    s.close()


def _forward_padded(model, ids):
    """Fresh forward over `ids` right-padded to 512 (causal: the padding is never seen)."""
    full = np.zeros((1, 512), np.int32)
    full[0, :len(ids)] = ids
    return jnp.asarray(full)


def _reference(model, history, completion):
    ids = history + completion.token_ids
    logp, _ = logprobs_of(model, _forward_padded(model, ids), chunk_size=128)
    return np.asarray(logp[0, len(history):len(ids)])


def _episodes(sampler, model, turns=4, episodes="abc", obs=20, params=TRAIN, check=True, timeout=120):
    """Multi-turn episodes with random observations, each turn checked against a fresh forward of the
    whole history; ends the episodes. Returns (completions, prompt tokens submitted)."""
    rng = np.random.default_rng(0)
    hist = {e: rng.integers(1, 256, 30).tolist() for e in episodes}
    outs, prompt_tokens = [], 0
    for turn in range(turns):
        prompt_tokens += sum(len(h) for h in hist.values())
        futs = {e: sampler.submit(h, params, episode_id=e, salt=turn) for e, h in hist.items()}
        for e, f in futs.items():
            c = f.result(timeout=timeout)
            if check:
                np.testing.assert_allclose(c.raw_logprobs, _reference(model, hist[e], c), atol=1e-4)
            outs.append(c)
            hist[e] = hist[e] + c.token_ids + rng.integers(1, 256, obs).tolist()
    assert sampler.cached_episodes() == {e: len(h) - obs for e, h in hist.items()} or sampler.stats.evictions
    for e in episodes:
        sampler.end_episode(e)
    return outs, prompt_tokens


def test_every_turn_equals_a_fresh_forward_and_only_appended_tokens_are_prefilled(model, sampler):
    before = dataclasses.replace(sampler.stats)
    outs, prompt_tokens = _episodes(sampler, model)
    assert all(c.logprobs == c.raw_logprobs for c in outs)  # temperature 1, top-p 1: the same numbers
    prefilled = sampler.stats.prefill_tokens - before.prefill_tokens
    assert prefilled == 3 * 30 + 3 * 3 * 20  # turn 1: the prompt; later turns: the observation only
    assert prefilled + sampler.stats.reused_tokens - before.reused_tokens == prompt_tokens
    assert sampler.cached_episodes() == {}  # ended
    # The same samples as with a full re-prefill every turn (same keys, same numbers).
    sampler.reuse_cache = False
    try:
        again, _ = _episodes(sampler, model, check=False)
    finally:
        sampler.reuse_cache = True
    assert [c.token_ids for c in again] == [c.token_ids for c in outs]
    for a, b in zip(again, outs):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_summary_and_eviction_rebuild_by_prefill(model, sampler):
    evictions = sampler.stats.evictions
    _episodes(sampler, model, turns=3, episodes="abcd")  # 4 episodes on 3 rows: evicted, rebuilt
    assert sampler.stats.evictions > evictions
    # A summary replaces the history: the prompt shares only a 10-token prefix with the cache.
    rng = np.random.default_rng(5)
    history = rng.integers(1, 256, 40).tolist()
    first = sampler.submit(history, TRAIN, episode_id="s").result(timeout=60)
    summary = history[:10] + rng.integers(1, 256, 25).tolist()
    before = sampler.stats.prefill_tokens
    c = sampler.submit(summary, TRAIN, episode_id="s").result(timeout=60)
    np.testing.assert_allclose(c.raw_logprobs, _reference(model, summary, c), atol=1e-4)
    assert sampler.stats.prefill_tokens - before == 25
    assert sampler.cached_episodes() == {"s": len(summary) + len(c.token_ids)} and first.token_ids
    sampler.end_episode("s")


def test_evaluation_sampling_logprobs_are_the_processed_distribution(model, sampler):
    params = SamplingParams(temperature=0.6, top_p=0.95, max_new_tokens=12, seed=2)
    prompt = list(range(1, 40))
    c = sampler.submit(prompt, params).result(timeout=60)
    ids = prompt + c.token_ids
    logits = np.asarray(forward(model, _forward_padded(model, ids))[0, len(prompt) - 1:len(ids) - 1], np.float64)
    for row, tok, lp in zip(logits / 0.6, c.token_ids, c.logprobs):  # nucleus of softmax(z / T)
        p = np.exp(row - row.max())
        p /= p.sum()
        order = np.argsort(-p)
        keep = order[np.cumsum(p[order]) - p[order] < 0.95]
        assert lp == pytest.approx(np.log(p[tok] / p[keep].sum()), abs=1e-4)
    assert not np.allclose(c.logprobs, c.raw_logprobs, atol=1e-3)
    greedy = sampler.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=6))[0]
    ids = prompt + greedy.token_ids
    logits = np.asarray(forward(model, _forward_padded(model, ids))[0])
    assert greedy.token_ids == [int(np.argmax(logits[i])) for i in range(len(prompt) - 1, len(ids) - 1)]
    assert greedy.logprobs == [0.0] * 6 and sampler.cached_episodes() == {}


def test_slots_refill_while_a_long_request_decodes(sampler):
    """Four short requests on three slots beside a long one: the last two take the slots the first
    two free, and all four finish while `long` keeps decoding. Finishing order is read from the
    futures (not from the test thread's timing, which a loaded host can stall for many steps)."""
    finished = []

    def submit(prompt, new_tokens, name):   # a callback added at once runs in finishing order
        future = sampler.submit(prompt, SamplingParams(temperature=0.0, max_new_tokens=new_tokens),
                                episode_id=name)
        future.add_done_callback(lambda _: finished.append(name))
        return future

    long = submit([1, 2, 3], 32, "long")
    shorts = [submit([4 + i, 5], 2, f"s{i}") for i in range(4)]
    for i, short in enumerate(shorts):
        assert len(short.result(timeout=60).token_ids) == 2
        sampler.end_episode(f"s{i}")
    assert len(long.result(timeout=60).token_ids) == 32
    assert finished[-1] == "long" and sorted(finished[:-1]) == ["s0", "s1", "s2", "s3"], finished
    sampler.end_episode("long")


def test_a_queued_request_takes_the_first_freed_slot(sampler):
    """Every row busy (two long, one short) and a request queued: it takes the short one's row as
    soon as that finishes (the decode call returns early instead of running its `decode_steps`),
    so it is done within one more call and before either long one; weight sync is refused meanwhile."""
    greedy = lambda n: SamplingParams(temperature=0.0, max_new_tokens=n)  # noqa: E731
    order, steps0 = [], sampler.stats.decode_steps
    steps_at = {}  # decode steps run when each request was done (callbacks run in the engine thread)
    with sampler.admission_lock():  # the engine admits nothing until all four are queued
        futs = {name: sampler.submit([1, 2 + i], greedy(n), episode_id=name)
                for i, (name, n) in enumerate((("long0", 32), ("long1", 32), ("short", 2), ("queued", 3)))}
        for name, f in futs.items():
            f.add_done_callback(lambda _, name=name: (order.append(name), steps_at.setdefault(
                name, sampler.stats.decode_steps - steps0)))
        with pytest.raises(RuntimeError, match="in flight"):
            sampler.update_weights(sampler.state)
    assert [len(f.result(timeout=900).token_ids) for f in futs.values()] == [32, 32, 2, 3]  # may compile
    assert order.index("queued") < min(order.index("long0"), order.index("long1")), order
    assert steps_at["short"] == 2 and steps_at["queued"] <= 2 + sampler.decode_steps, steps_at  # 3 <= 4 tokens
    for name in futs:
        sampler.end_episode(name)
    assert sampler.cached_episodes() == {}


def test_decode_computes_only_the_active_rows(model, sampler):
    """With one or two of three rows busy, a decode call computes only those rows (row buckets of 1
    on 3 slots), and every turn still equals a fresh forward; the same episodes through a sampler
    that decodes every row (`decode_buckets=1`) give the same tokens and log-probs up to rounding."""
    assert sampler.row_quantum == 1
    before = dataclasses.replace(sampler.stats)
    one, _ = _episodes(sampler, model, turns=2, episodes="a")
    steps = sampler.stats.decode_steps - before.decode_steps
    assert steps > 0 and sampler.stats.decode_row_steps - before.decode_row_steps == steps      # 1 row
    assert sampler.stats.decode_slot_steps - before.decode_slot_steps == 3 * steps
    two, _ = _episodes(sampler, model, turns=2, episodes="ab")
    full = EpisodeSampler(model, slots=3, max_new_tokens=32, min_capacity=128, prefill_chunk=64, decode_steps=4,
                          attention_block=32, decode_buckets=1)
    try:
        assert full.row_quantum == 3
        for episodes, outs in (("a", one), ("ab", two)):
            ref, _ = _episodes(full, model, turns=2, episodes=episodes, timeout=900)
            assert [c.token_ids for c in ref] == [c.token_ids for c in outs]
            for a, b in zip(ref, outs):
                np.testing.assert_allclose(a.raw_logprobs, b.raw_logprobs, atol=1e-5)
        assert full.stats.decode_row_steps == 3 * full.stats.decode_steps
    finally:
        full.close()


def test_end_episode_cancels_and_frees(sampler):
    slow = SamplingParams(temperature=0.0, max_new_tokens=32)
    running = [sampler.submit([1, 2 + i], slow, episode_id=f"r{i}") for i in range(3)]  # every row busy
    queued = sampler.submit([3, 4], SamplingParams(max_new_tokens=4), episode_id="q")
    sampler.end_episode("q")
    with pytest.raises(RequestCancelled):
        queued.result(timeout=60)
    sampler.end_episode("r0")
    with pytest.raises(RequestCancelled):
        running[0].result(timeout=60)
    assert len(sampler.submit([5], SamplingParams(max_new_tokens=3), episode_id="c").result(timeout=60).token_ids) == 3
    for e in ("r1", "r2", "c"):
        sampler.end_episode(e)
    assert sampler.cached_episodes() == {}


def test_update_weights_drops_caches_without_recompiling(model, sampler):
    _episodes(sampler, model, turns=1)
    compiles = dict(sampler.compile_counts)
    sampler.submit([1, 2, 3], TRAIN, episode_id="kept").result(timeout=60)
    other = Decoder(CFG, rngs=nnx.Rngs(7))
    sampler.update_weights(nnx.to_pure_dict(nnx.state(other, nnx.Param)))  # TrainState.actor_params form
    assert sampler.cached_episodes() == {}
    try:
        _episodes(sampler, other, turns=2)  # checked against the NEW model's forward
    finally:
        sampler.update_weights(model)  # a Decoder works too
    _episodes(sampler, model, turns=1)
    assert dict(sampler.compile_counts) == compiles
    with pytest.raises(ValueError, match="embed_tokens"):
        sampler.update_weights({**nnx.to_pure_dict(nnx.state(model, nnx.Param)), "embed_tokens": jnp.zeros((3, 3))})


def test_compiles_are_bounded_by_the_buckets(model, sampler):
    """Runs last on the shared sampler: random lengths and caps; compiles stay within the buckets
    (capacities 128.. grown to, rows-in-call 1/2; one chunk shape) and a repeat adds none; after
    `precompile` nothing compiles."""
    rng = np.random.default_rng(1)
    counts = []
    for rep in range(2):
        hist = {f"{rep}-{e}": rng.integers(1, 256, int(rng.integers(5, 100))).tolist() for e in range(5)}
        for turn in range(4):
            futs = {e: sampler.submit(h, TRAIN, max_new_tokens=int(rng.integers(1, 17)), episode_id=e, salt=turn)
                    for e, h in hist.items()}
            for e, f in futs.items():
                hist[e] = hist[e] + f.result(timeout=120).token_ids + rng.integers(1, 256, int(rng.integers(1, 70))).tolist()
        for e in hist:
            sampler.end_episode(e)
        counts.append(dict(sampler.compile_counts))
    capacities = int(np.log2(sampler.capacity // 128)) + 1
    assert sampler.compile_counts["decode"] <= capacities * 3  # active-row buckets 1, 2, 3 (3 slots)
    assert sampler.compile_counts["prefill"] <= capacities * 2  # rows-in-call 1, 2 (3 slots: no padding rows)
    assert counts[0] == counts[1] or sampler.capacity > 128
    # precompile: every bucket at the current capacity, after which a rollout that fits compiles nothing.
    compiled = sampler.precompile(sampler.capacity)
    assert compiled["prefill"] <= capacities * 2 and compiled["decode"] <= capacities * 3
    _episodes(sampler, model, turns=2, check=False)
    assert dict(sampler.compile_counts) == compiled


@pytest.mark.parametrize("scan_layers", [True, False])
def test_compiled_calls_update_the_cache_in_place(scan_layers):
    """Prefill and decode write the cache in place: no whole-cache copy in the compiled code (with
    the writes after every layer's read XLA copied it twice per call, ~4x the work of a gym
    decode step); the layer scan and the unrolled layers, every row and a row bucket."""
    model = Decoder(dataclasses.replace(CFG, scan_layers=scan_layers), rngs=nnx.Rngs(0))
    s = EpisodeSampler(model, slots=4, max_new_tokens=16, min_capacity=256, prefill_chunk=32, decode_steps=4,
                       attention_block=64, decode_buckets=2)
    try:
        assert s.cache_copies() == {"prefill": 0, "decode": 0, "decode_rows": 0}
    finally:
        s.close()


def test_unrolled_layers_match_a_fresh_forward():
    """`scan_layers=False` (the gym's model): `Decoder.extend`'s unrolled loop, cache read in blocks."""
    model = Decoder(dataclasses.replace(CFG, scan_layers=False), rngs=nnx.Rngs(3))
    s = EpisodeSampler(model, slots=2, max_new_tokens=16, min_capacity=64, prefill_chunk=32, decode_steps=4,
                       attention_block=16)
    try:
        _episodes(s, model, turns=2, episodes="ab", timeout=900)  # a fresh sampler: its first turn compiles
        assert s.stats.reused_tokens > 0
    finally:
        s.close()


def test_sharded_sampler_matches_one_device(model, sampler):
    """On a (data, fsdp, tensor, context) = (2, 1, 2, 2) mesh of forced host devices the cache stays
    split by `HEAD_MAJOR_CACHE_AXES` (rows over data, kv heads over tensor) and every turn gives the
    samples and log-probs of the one-device sampler (and of a fresh forward)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from tr.models.sharding import make_mesh, state_shardings

    mesh = make_mesh((2, 1, 2, 2))
    state = nnx.state(model)
    sharded = nnx.merge(nnx.graphdef(model), jax.device_put(state, state_shardings(state, mesh)))
    s = EpisodeSampler(sharded, slots=4, max_new_tokens=32, min_capacity=128, prefill_chunk=64, decode_steps=4,
                       attention_block=32, mesh=mesh)
    try:
        outs, _ = _episodes(s, model, turns=2, episodes="ab", timeout=900)  # fresh: its first turn compiles
        assert s._keys.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "data", "tensor")), 5)
        assert s._dec["out_tokens"].sharding.is_equivalent_to(NamedSharding(mesh, P("data")), 2)
    finally:
        s.close()
    single, _ = _episodes(sampler, model, turns=2, episodes="ab", check=False)
    assert [c.token_ids for c in outs] == [c.token_ids for c in single]
    for a, b in zip(outs, single):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_batch_invariant_samples_are_bit_identical_whatever_else_runs(model):
    """`batch_invariant=True` (the stages' sampler): an episode's tokens, log-probs and raw log-probs
    are bit-identical served alone, beside other episodes (other rows, other lengths, another row
    for itself), after another sampler compiled and ran in the process, and after `update_weights`
    (same weights). At a fixed row count only: the row count is part of the compiled decode."""
    params = SamplingParams(temperature=0.6, top_p=0.95, max_new_tokens=12, seed=4)
    rng = np.random.default_rng(11)
    prompts = {e: rng.integers(1, 256, int(rng.integers(10, 90))).tolist() for e in "xabc"}
    obs = {e: [rng.integers(1, 256, 9).tolist() for _ in range(3)] for e in prompts}

    def run(s, others=""):
        hist, out = {e: list(prompts[e]) for e in others + "x"}, []
        for turn in range(3):
            futs = {e: s.submit(h, params, episode_id=e, salt=turn) for e, h in hist.items()}  # x last
            for e, f in futs.items():
                c = f.result(timeout=900)
                if e == "x":
                    out.append((c.token_ids, c.logprobs, c.raw_logprobs))
                hist[e] = hist[e] + c.token_ids + obs[e][turn]
        for e in hist:
            s.end_episode(e)
        return out

    kw = dict(max_new_tokens=16, min_capacity=128, prefill_chunk=32, decode_steps=4, attention_block=32,
              batch_invariant=True)
    s = EpisodeSampler(model, slots=4, **kw)
    try:
        alone = run(s)
        assert sum(len(ids) for ids, _, _ in alone) > 12
        assert run(s, "abc") == alone          # beside three episodes, x in the last row
        assert run(s, "b") == alone
        other = EpisodeSampler(model, slots=2, **{**kw, "max_new_tokens": 32, "prefill_chunk": 64})
        try:
            run(other, "a")                      # another sampler's compiles and runs
        finally:
            other.close()
        assert run(s) == alone
        s.update_weights(model)
        assert run(s, "c") == alone
    finally:
        s.close()
