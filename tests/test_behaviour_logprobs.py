"""Training rollouts store the log-probs of the distribution they were sampled from: a real rollout
of the tiny model in real sandboxes, then the PPO update's ratio on its first step is exactly 1
(up to float32 rounding between the sampler's cached decode and the trainer's full forward), while
evaluation-temperature log-probs would not be."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tr.agent.policies import load_model_policy
from tr.agent.records import episode_to_sequences, pad_sequences
from tr.agent.rollout import RolloutConfig, group_specs, run_rollouts
from tr.models.config import get_model_config
from tr.models.critic import CriticModel
from tr.models.decoder import Decoder
from tr.train.compile import build_steps
from tr.train.model_fns import nnx_model_fns
from tr.train.optim import make_optimizer
from tr.train.updates import default_config
from tr.train.state import create_train_state


@pytest.fixture(scope="module")
def task():
    from tr.envs.tasks import load_suite

    return sorted(load_suite(), key=lambda t: (t.tier != "easy", t.id))[0]


def _rollout_batch(task, sampling: str, **overrides):
    config = get_model_config("tiny", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16,
                              d_ff=128, max_seq_len=2048)
    policy = load_model_policy(model=Decoder(config, rngs=nnx.Rngs(0)), seed=0, sampling=sampling,
                               **overrides)
    cfg = RolloutConfig(concurrency=2, budgets=policy.budgets(24, max_turns=2), progress=False)
    out = run_rollouts(group_specs([task], 2, seed=1), policy, policy.layout, cfg)
    assert len(out.records) == 2 and all(r.status.counts for r in out.records), [r.error for r in out.records]
    assert policy.sampler.cached_episodes() == {}  # the engine ended every episode: caches freed
    seqs = [s for r in out.records for s in episode_to_sequences(r, reward=float(r.rollout_index))]
    length = -(-max(len(s["tokens"]) for s in seqs) // 128) * 128
    batch = {k: jnp.asarray(v) for k, v in pad_sequences(seqs, length).items()}
    assert int(batch["loss_mask"].sum()) > 0
    return policy, batch


def test_ppo_ratio_is_one_on_the_first_update_of_a_training_rollout(task):
    policy, batch = _rollout_batch(task, "train")
    assert (policy.temperature, policy.top_p) == (1.0, 1.0)
    actor = nnx.merge(policy.sampler.graphdef, policy.sampler.state)
    critic = CriticModel(actor.config, rngs=nnx.Rngs(1))
    fns = nnx_model_fns(actor, critic, chunk_size=256)
    config = default_config()
    steps = build_steps(config, actor_logprobs=fns.actor_logprobs, critic_values=fns.critic_values)
    state = create_train_state(actor_params=fns.actor_params, critic_params=fns.critic_params,
                               actor_optimizer=make_optimizer(config.actor.optimizer),
                               critic_optimizer=make_optimizer(config.critic.optimizer))
    mask = np.asarray(batch["loss_mask"])
    ratio = np.exp(np.asarray(jax.jit(fns.actor_logprobs)(fns.actor_params, batch)) - np.asarray(batch["logprobs"]))
    assert np.max(np.abs(ratio[mask] - 1.0)) < 1e-4
    _, metrics = steps.ppo(state, batch)
    assert float(metrics["actor/ratio"]) == pytest.approx(1.0, abs=1e-5)
    assert float(metrics["actor/approx_kl"]) < 1e-8 and float(metrics["actor/clip_frac"]) == 0.0


def test_evaluation_sampling_logprobs_would_not_give_ratio_one(task):
    """The check above can fail: log-probs recorded at temperature 0.6 / top-p 0.95 are not the
    model's, and the same ratio is far from 1."""
    policy, batch = _rollout_batch(task, "eval")
    assert (policy.temperature, policy.top_p) == (0.6, 0.95)
    actor = nnx.merge(policy.sampler.graphdef, policy.sampler.state)
    fns = nnx_model_fns(actor, chunk_size=256)
    mask = np.asarray(batch["loss_mask"])
    ratio = np.exp(np.asarray(jax.jit(fns.actor_logprobs)(fns.actor_params, batch)) - np.asarray(batch["logprobs"]))
    assert np.max(np.abs(ratio[mask] - 1.0)) > 0.1


def test_a_tempered_policy_is_on_policy_for_rollouts_at_its_temperature(task):
    """`train.policy_temperature` τ: rollouts sampled at temperature τ, top-p 1 record the log-probs
    of softmax(logits / τ), which is what the updates' actor function computes at τ (ratio 1, and
    equal to a log-softmax of the full forward's logits / τ written out here); the raw model's
    log-probs (τ = 1) are not."""
    tau = 0.6
    policy, batch = _rollout_batch(task, "train", temperature=tau)
    assert (policy.temperature, policy.top_p) == (tau, 1.0)
    actor = nnx.merge(policy.sampler.graphdef, policy.sampler.state)
    mask = np.asarray(batch["loss_mask"])
    behaviour = np.asarray(batch["logprobs"])
    tempered = nnx_model_fns(actor, chunk_size=256, temperature=tau)
    logp = np.asarray(jax.jit(tempered.actor_logprobs)(tempered.actor_params, batch))
    assert np.max(np.abs(np.exp(logp - behaviour)[mask] - 1.0)) < 1e-4
    # the reference: log softmax(logits / τ) at each next token, from one plain forward
    tokens = np.asarray(batch["tokens"])
    logits = np.asarray(actor(batch["tokens"], batch.get("positions"), batch.get("segment_ids")),
                        np.float64) / tau
    ref = logits - logits.max(-1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(-1, keepdims=True))
    ref_next = np.take_along_axis(ref[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    assert np.max(np.abs(logp[:, 1:][mask[:, 1:]] - ref_next[mask[:, 1:]])) < 1e-3
    raw = nnx_model_fns(actor, chunk_size=256)
    raw_logp = np.asarray(jax.jit(raw.actor_logprobs)(raw.actor_params, batch))
    assert np.max(np.abs(np.exp(raw_logp - behaviour)[mask] - 1.0)) > 0.05
    with pytest.raises(ValueError, match="temperature"):
        nnx_model_fns(actor, temperature=0.0)
