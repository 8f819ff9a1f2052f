"""Targets once per rollout batch, PPO epochs / mini-batches, the value clip binding, TB-GAE carried
across summary windows, GRPO's one-rollout-per-row guard, and the estimator/loss registry."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tr.models.config import get_model_config
from tr.models.critic import CriticModel
from tr.models.decoder import Decoder
from tr.rl import advantages as adv_lib
from tr.rl import losses, registry
from tr.train import compile as compile_lib
from tr.train import updates
from tr.train.model_fns import nnx_model_fns
from tr.train.optim import make_optimizer
from tr.train.state import create_train_state

B, L, VOCAB = 4, 16, 64


def make_batch(seed=0, rows=B, length=L):
    rng = np.random.default_rng(seed)
    actor = np.zeros((rows, length), bool)
    turns = np.zeros((rows, length), np.int32)
    rewards = np.zeros((rows, length), np.float32)
    dones = np.zeros((rows, length), bool)
    for r in range(rows):
        pos, turn = 1, 0
        while pos < length - 2:
            turn += 1
            n_act, n_obs = int(rng.integers(1, 4)), int(rng.integers(0, 4))
            actor[r, pos:min(pos + n_act, length)] = True
            turns[r, pos:] = turn
            pos += n_act + n_obs
        last = np.flatnonzero(actor[r])[-1]
        rewards[r, last] = rng.uniform(0, 2)
        dones[r, last] = True
    return {"tokens": jnp.asarray(rng.integers(0, VOCAB, (rows, length)), jnp.int32),
            "actor_mask": jnp.asarray(actor), "loss_mask": jnp.asarray(actor),
            "turn_ids": jnp.asarray(turns), "rewards": jnp.asarray(rewards),
            "dones": jnp.asarray(dones),
            "logprobs": jnp.asarray(np.log(rng.uniform(0.02, 0.2, (rows, length))), jnp.float32)}


@pytest.fixture(scope="module")
def setup():
    cfg = get_model_config("tiny", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, head_dim=16,
                           d_ff=64, vocab_size=VOCAB)
    critic = CriticModel(cfg, rngs=nnx.Rngs(1))
    critic.value_head.set_value(jax.random.normal(jax.random.key(2), critic.value_head.shape))
    fns = nnx_model_fns(Decoder(cfg, rngs=nnx.Rngs(0)), critic, chunk_size=8)
    config = updates.default_config()
    config.actor.optimizer.learning_rate = 1e-3
    config.critic.optimizer.learning_rate = 3e-2   # V moves past a small ε_V in one update
    config.ppo.eps_value = 0.01
    config.ppo.gamma_turn, config.ppo.lam_turn = 0.9, 0.8
    state = create_train_state(
        actor_params=fns.actor_params, actor_optimizer=make_optimizer(config.actor.optimizer),
        critic_params=fns.critic_params, critic_optimizer=make_optimizer(config.critic.optimizer))
    steps = compile_lib.build_steps(config, actor_logprobs=fns.actor_logprobs,
                                    critic_values=fns.critic_values)
    return dict(fns=fns, config=config, state=state, steps=steps, batch=make_batch())


def max_abs_diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_targets_are_the_critic_and_tb_gae_of_the_rollout_state(setup):
    fns, state, batch, config = setup["fns"], setup["state"], setup["batch"], setup["config"]
    t = setup["steps"].targets(state, batch)
    values = fns.critic_values(state.critic_params, batch)
    want = adv_lib.tb_gae(batch["rewards"], values, batch["actor_mask"], batch["turn_ids"],
                          batch["dones"], gamma_turn=0.9, lam_turn=0.8)
    np.testing.assert_allclose(t["old_values"], values, atol=1e-5)
    np.testing.assert_allclose(t["advantages"], want.advantages, atol=1e-5)
    np.testing.assert_allclose(t["returns"], want.returns, atol=1e-5)
    np.testing.assert_array_equal(t["old_logprobs"], batch["logprobs"])
    config.ppo.old_logprobs = "recompute"
    try:
        t2 = compile_lib.build_steps(config, actor_logprobs=fns.actor_logprobs,
                                     critic_values=fns.critic_values).targets(state, batch)
    finally:
        config.ppo.old_logprobs = "behaviour"
    np.testing.assert_allclose(t2["old_logprobs"], fns.actor_logprobs(state.actor_params, batch),
                               atol=1e-5)


def test_clipped_value_gradient_differs_from_unclipped_once_v_moves_past_eps(setup):
    """After one update on a batch, V − V_old exceeds ε_V: the clipped loss cuts the gradient.
    Were V_old recomputed inside each update (the audited bug), V = V_old and it never binds."""
    fns, state, batch, steps = setup["fns"], setup["state"], setup["batch"], setup["steps"]
    prepared = {**batch, **steps.targets(state, batch)}
    state1, m1 = steps.critic(state, prepared)
    assert m1["critic/vf_clip_frac"] == 0.0               # V = V_old at the first update
    v1 = fns.critic_values(state1.critic_params, prepared)
    mask = np.asarray(batch["actor_mask"])
    assert np.max(np.abs(np.asarray(v1 - prepared["old_values"]))[mask]) > 0.01

    def grad(eps):
        return jax.grad(lambda p: losses.value_loss_terms(
            fns.critic_values(p, prepared), prepared["old_values"], prepared["returns"],
            prepared["actor_mask"], eps_value=eps).numerator)(state1.critic_params)
    assert max_abs_diff(grad(0.01), grad(1e9)) > 1e-6
    _, m2 = steps.critic(state1, prepared)                 # the second update on the same batch
    assert m2["critic/vf_clip_frac"] > 0.0
    _, m_bug = steps.critic(state1, batch)                 # targets recomputed from state1
    assert m_bug["critic/vf_clip_frac"] == 0.0


def test_epochs_and_mini_batches_reuse_the_batch_targets(setup):
    state, batch, steps = setup["state"], setup["batch"], setup["steps"]
    prepared = {**batch, **steps.targets(state, batch)}
    got, history = compile_lib.run_epochs(steps.ppo, state, prepared, epochs=2, mini_batches=2,
                                          seed=3)
    assert len(history) == 4
    has_data = np.asarray(prepared["actor_mask"]).any(axis=1)
    order = compile_lib.mini_batch_order(B, epochs=2, mini_batches=2, seed=3, has_data=has_data)
    assert sorted(order[0].ravel().tolist()) == list(range(B))
    want = state
    for rows in order.reshape(4, -1):
        idx = jnp.asarray(np.sort(rows))
        want, _ = steps.ppo(want, {k: v[idx] for k, v in prepared.items()})
    assert max_abs_diff(got.actor_params, want.actor_params) == 0.0
    assert max_abs_diff(got.critic_params, want.critic_params) == 0.0
    # Padding rows are spread: 2 data rows of 8 over 2 mini-batches -> one data row in each.
    spread = compile_lib.mini_batch_order(8, epochs=3, mini_batches=2, seed=0,
                                          has_data=np.array([0, 0, 1, 0, 0, 0, 1, 0], bool))
    for epoch in spread:
        assert [int(np.isin(mb, [2, 6]).sum()) for mb in epoch] == [1, 1]
        assert sorted(epoch.ravel().tolist()) == list(range(8))
    with pytest.raises(ValueError, match="lacks its targets"):
        compile_lib.run_epochs(steps.ppo, state, batch)
    with pytest.raises(ValueError, match="cannot be cut into 3 equal mini-batches"):
        compile_lib.run_epochs(steps.ppo, state, prepared, mini_batches=3)


def split_into_windows(row: dict, cuts: list[int]):
    """One episode row cut into windows at `cuts`; rows [len(cuts)+1, L], window ids, next rows."""
    bounds = [0, *cuts, row["rewards"].shape[0]]
    out = {k: np.zeros((len(bounds) - 1, row[k].shape[0]), row[k].dtype) for k in row}
    for w, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        for k in row:
            out[k][w, :b - a] = row[k][a:b]
    n = len(bounds) - 1
    return out, np.arange(n, dtype=np.int32), np.array([*range(1, n), -1], np.int32)


def test_tb_gae_carried_across_summary_windows_equals_the_unsplit_episode():
    batch = make_batch(seed=5, rows=1, length=40)
    rng = np.random.default_rng(0)
    row = {k: np.asarray(batch[k])[0] for k in ("rewards", "actor_mask", "turn_ids", "dones")}
    row["values"] = rng.normal(size=40).astype(np.float32)
    cuts = [11, 26]   # one inside a turn's actions, one elsewhere
    windows, window_ids, next_row = split_into_windows(row, cuts)
    whole = adv_lib.tb_gae(*(jnp.asarray(row[k])[None] for k in ("rewards", "values", "actor_mask",
                                                                 "turn_ids", "dones")),
                           gamma_turn=0.9, lam_turn=0.8)
    for method in ("scan", "blocked"):
        split = adv_lib.tb_gae_across_windows(
            *(jnp.asarray(windows[k]) for k in ("rewards", "values", "actor_mask", "turn_ids",
                                                 "dones")),
            window_ids, next_row, num_windows=3, gamma_turn=0.9, lam_turn=0.8, method=method)
        got = np.concatenate([np.asarray(split.advantages)[w, :b - a] for w, (a, b) in
                              enumerate(zip([0, *cuts], [*cuts, 40]))])
        np.testing.assert_allclose(got, np.asarray(whole.advantages)[0], atol=1e-5, err_msg=method)
    # Without the carry (each window on its own) the early windows lose the later credit.
    alone = adv_lib.tb_gae(*(jnp.asarray(windows[k]) for k in ("rewards", "values", "actor_mask",
                                                                "turn_ids", "dones")),
                           gamma_turn=0.9, lam_turn=0.8)
    assert not np.allclose(np.asarray(alone.advantages)[0, :11],
                           np.asarray(whole.advantages)[0, :11], atol=1e-3)
    # The registered estimator takes the same path when the config says num_windows > 1.
    params = {"gamma_turn": 0.9, "lam_turn": 0.8, "num_windows": 3}
    wb = {**{k: jnp.asarray(v) for k, v in windows.items()}, "window_ids": window_ids,
          "next_window_row": next_row}
    adv, _ = registry.estimator("tb_gae")(wb, wb["values"], params)
    np.testing.assert_allclose(adv, split.advantages, atol=1e-6)


def test_grpo_refuses_packed_rows_and_split_windows(setup):
    state, steps = setup["state"], setup["steps"]
    batch = {**make_batch(rows=16), "is_recovery": jnp.zeros((16,), bool)}
    packed = np.ones((16, L), np.int32)
    packed[3, 8:] = 2
    with pytest.raises(ValueError, match=r"rows \[3\] hold several packed rollouts"):
        steps.grpo(state, {**batch, "segment_ids": jnp.asarray(packed)})
    with pytest.raises(ValueError, match="windows of episodes split by summarisation"):
        steps.grpo(state, {**batch, "window_ids": jnp.asarray([0] * 15 + [1], jnp.int32)})
    new_state, _ = steps.grpo(state, {**batch, "segment_ids": jnp.ones((16, L), jnp.int32)})
    assert int(new_state.step) == 1


def test_a_new_estimator_is_one_function_and_one_registration(setup):
    fns, state, batch, config = setup["fns"], setup["state"], setup["batch"], setup["config"]

    @registry.register_estimator("test_monte_carlo")
    def monte_carlo(batch, values, params):   # G = episode reward at every action token, A = G − V
        g = jnp.where(batch["actor_mask"], jnp.sum(batch["rewards"], 1, keepdims=True), 0.0)
        return jnp.where(batch["actor_mask"], g - values, 0.0), g

    assert "test_monte_carlo" in registry.estimators()
    with pytest.raises(ValueError, match="already registered"):
        registry.register_estimator("test_monte_carlo")(monte_carlo)
    with pytest.raises(ValueError, match="estimator 'nope' unknown"):
        registry.estimator("nope")
    config = config.copy_and_resolve_references()
    config.ppo.estimator = "test_monte_carlo"
    t = compile_lib.build_steps(config, actor_logprobs=fns.actor_logprobs,
                                critic_values=fns.critic_values).targets(state, batch)
    row_reward = np.asarray(batch["rewards"]).sum(1, keepdims=True)
    mask = np.asarray(batch["actor_mask"])
    np.testing.assert_allclose(np.asarray(t["returns"])[mask],
                               np.broadcast_to(row_reward, mask.shape)[mask], atol=1e-6)


def test_sampler_takes_the_train_states_pure_params():
    """`JaxSampler.update_weights(state.actor_params)` samples exactly like a Decoder holding them."""
    from tr.models.tokenizer import ByteTokenizer
    from tr.sampling.sampler import JaxSampler, SamplingParams

    cfg = get_model_config("tiny", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, head_dim=16,
                           d_ff=64)
    old, new = Decoder(cfg, rngs=nnx.Rngs(0)), Decoder(cfg, rngs=nnx.Rngs(7))
    tokenizer = ByteTokenizer(vocab_size=cfg.vocab_size)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=8, seed=3)
    prompts = [tokenizer.encode("ls -la"), tokenizer.encode("cat /app/x")]
    want = JaxSampler(new, tokenizer).generate(prompts, params)
    sampler = JaxSampler(old, tokenizer)
    before = sampler.generate(prompts, params)
    sampler.update_weights(nnx_model_fns(new).actor_params)
    got = sampler.generate(prompts, params)
    assert [list(c.token_ids) for c in got] == [list(c.token_ids) for c in want]
    np.testing.assert_allclose([c.logprobs for c in got], [c.logprobs for c in want], atol=1e-5)
    assert not np.allclose([c.logprobs for c in before], [c.logprobs for c in want], atol=1e-3)
    assert sampler.compile_counts["prefill"] == 1      # same shapes: no recompilation


def _reference_regularised_loss(model_graph, params, rest, batch, adv, ref, kl_coef, entropy_coef):
    """The GRPO-with-one-group loss written the obvious way from the full logits:
    mean over loss tokens of −min(ρA, clip(ρ)A) + β_KL k3(ref, logp) − β_H H."""
    model = nnx.merge(model_graph, params, rest)
    logits = model(batch["tokens"])                          # [B, L, V]
    logp_all = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    targets = batch["tokens"][:, 1:]
    logp = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
    logp = jnp.concatenate([jnp.zeros_like(logp[:, :1]), logp], axis=1)
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    entropy = jnp.concatenate([jnp.zeros_like(entropy[:, :1]), entropy], axis=1)
    mask = batch["loss_mask"]
    ratio = jnp.exp(jnp.where(mask, logp - batch["logprobs"], 0.0))
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 0.7, 6.0) * adv)
    d = jnp.where(mask, ref - logp, 0.0)
    per = -surrogate + kl_coef * (jnp.exp(d) - d - 1.0) - entropy_coef * entropy
    return jnp.sum(jnp.where(mask, per, 0.0)) / jnp.sum(mask)


@pytest.mark.parametrize("kl_coef,entropy_coef,with_ref", [
    (0.0, 0.0, False), (0.5, 0.0, True), (0.5, 0.0, False), (0.0, 0.3, False), (0.2, 0.1, True)])
def test_kl_and_entropy_terms_give_the_reference_gradient(kl_coef, entropy_coef, with_ref):
    """One GRPO update with plain SGD (lr 1) moves the actor by minus the gradient of the loss
    written from the full logits: the k3 KL to the batch's `ref_logprobs` (else the behaviour
    log-probs) and the entropy bonus of the current policy, both default 0."""
    import optax

    cfg = get_model_config("tiny", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, head_dim=16,
                           d_ff=64, vocab_size=VOCAB)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    fns = nnx_model_fns(model, chunk_size=8)
    batch = make_batch(seed=3)
    rng = np.random.default_rng(4)
    adv = jnp.asarray(np.where(batch["loss_mask"], rng.normal(size=(B, L)), 0.0), jnp.float32)
    ref = jnp.asarray(np.log(rng.uniform(0.02, 0.2, (B, L))), jnp.float32)
    full = {**batch, "is_recovery": jnp.zeros((B,), bool), "advantages": adv}
    if with_ref:
        full["ref_logprobs"] = ref
    state = create_train_state(actor_params=fns.actor_params, actor_optimizer=optax.sgd(1.0))
    new, metrics = updates.grpo_update(
        state, full, actor_logprobs=fns.actor_logprobs, actor_optimizer=optax.sgd(1.0),
        group_size=B, kl_coef=kl_coef, entropy_coef=entropy_coef,
        actor_logprobs_entropy=fns.actor_logprobs_entropy)
    reference = ref if with_ref else batch["logprobs"]
    grad = jax.grad(lambda p: _reference_regularised_loss(graph, p, rest, batch, adv, reference,
                                                          kl_coef, entropy_coef))(params)
    want = jax.tree.map(lambda p, g: p - g, params, grad)
    assert max_abs_diff(new.actor_params, want) < 1e-5
    if entropy_coef:
        assert "actor/entropy" in metrics
    if kl_coef:
        assert float(metrics["actor/kl_ref"]) > 0.0


def test_an_entropy_bonus_without_the_entropy_function_is_named():
    cfg = get_model_config("tiny", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, head_dim=16,
                           d_ff=64, vocab_size=VOCAB)
    fns = nnx_model_fns(Decoder(cfg, rngs=nnx.Rngs(0)), chunk_size=8)
    import optax

    state = create_train_state(actor_params=fns.actor_params, actor_optimizer=optax.sgd(1.0))
    batch = {**make_batch(), "is_recovery": jnp.zeros((B,), bool)}
    with pytest.raises(ValueError, match="entropy_coef=0.1 needs actor_logprobs_entropy"):
        updates.grpo_update(state, batch, actor_logprobs=fns.actor_logprobs,
                            actor_optimizer=optax.sgd(1.0), group_size=B, entropy_coef=0.1)
