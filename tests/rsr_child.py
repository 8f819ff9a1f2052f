"""A small RSR pipeline for the RSR stage tests, on gym tasks in local sandboxes.

    python tests/rsr_child.py --run_dir D [--stages rsr] [--tasks 4]

The parent `base` stands in for the gym's Base at test size: the gym model shape shrunk by
overrides, the gym's BPE tokenizer and system prompt, SFT'd from scratch for `--parent_steps`
updates on scripted reference demos of the first `--tasks` train tasks, with the plain prompt and
with the prompt carrying a runbook (so its own rollouts succeed on them, RSR has successes to
rewrite, and it can follow a runbook as an LLM would); it is written as a finished stage (kind `sft`)
whose manifest records model, tokenizer and system prompt, like `tr.stages.base`, with a fresh
critic. Then the pipeline runs `rsr-1` (actor and critic from base; the critic must pass through
unchanged). One episode at a time (concurrency 1) so a run is a pure
function of its seed. Prints `DONE <json of the summaries>`; killed and started again, it resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

SMALL = dict(n_layers=1, d_model=64, n_heads=2, n_kv_heads=1, head_dim=32, d_ff=128)


def train_parent(run_dir: pathlib.Path, tasks: int, steps: int, seed: int = 0) -> None:
    """The `base` stage: SFT on reference demos of the first `tasks` train tasks."""
    import jax
    from flax import nnx

    from tr.data.episodes import packed_batches
    from tr.models.config import get_model_config
    from tr.models.critic import CriticModel
    from tr.models.decoder import Decoder
    from tr.models import embedded
    from tr.train.checkpoint import StageStore
    from tr.train.compile import build_steps
    from tr.train.model_fns import nnx_model_fns
    from tr.train.optim import make_optimizer
    from tr.train.state import create_train_state
    from tr.train.updates import default_config

    if (run_dir / "base" / "summary.json").exists():
        return
    tokenizer = embedded.load_tokenizer()
    seqs = demo_sequences(tasks, tokenizer, seed) * 4
    model_config = get_model_config(embedded.MODEL, **SMALL)
    model = Decoder(model_config, rngs=nnx.Rngs(seed))
    fns = nnx_model_fns(model, CriticModel(model_config, rngs=nnx.Rngs(seed + 1)))
    train = default_config()
    train.actor.optimizer.learning_rate = 3e-3
    opt = make_optimizer(train.actor.optimizer)
    sft = build_steps(train, actor_logprobs=fns.actor_logprobs).sft
    state = create_train_state(actor_params=fns.actor_params, actor_optimizer=opt,
                               critic_params=fns.critic_params, seed=seed)
    data = iter(packed_batches(seqs, batch=4, length=512, pad_id=tokenizer.pad_id, seed=seed))
    for _ in range(steps):
        state, metrics = sft(state, next(data))
    print(f"parent: {len(seqs)} demo sequences, {steps} SFT updates, loss "
          f"{float(metrics['actor/loss']):.3f}", flush=True)
    loss = float(metrics["actor/loss"])
    state = state.replace(actor_opt_state=None)
    config = {**embedded.manifest_config(), "model": {"name": embedded.MODEL, "overrides": SMALL},
              "steps": steps, "demo_tasks": tasks}
    with StageStore(run_dir, "base", async_save=False) as store:
        store.create(kind="sft", config=config)
        manifest = store.finish(state)
    (run_dir / "base" / "summary.json").write_text(json.dumps(
        {"stage": "base", "retained_step": manifest["finished_step"], "loss": loss,
         "actor_hash": manifest["actor_hash_after"], "critic_hash": manifest["critic_hash_after"]}))
    jax.block_until_ready(state.step)


def demo_sequences(count: int, tokenizer, seed: int) -> list:
    """Reference demos of the first `count` train tasks, each with the plain prompt and with the
    prompt carrying the runbook of its own commands (the form RSR replays use): a stand-in for an
    LLM's ability to follow a runbook, which the embedded model has to be taught."""
    import dataclasses

    from tr.agent import runbook as rb
    from tr.agent.harness import Budgets, EpisodeSpec
    from tr.agent.records import episode_to_sequences
    from tr.agent.rollout import RolloutConfig, run_rollouts
    from tr.agent.transcript import ChatLayout
    from tr.envs import gym
    from tr.models import embedded
    from tr.stages import base

    tasks = gym.split_tasks("train", count)
    specs, plans = [], {}
    for task in tasks:
        commands = gym.solution_commands(task)
        runbook = rb.CommandListPlanner().plan(task, [rb.Step(c, "", 0) for c in commands])
        with_runbook = dataclasses.replace(rb.with_runbook(task, runbook), id=f"{task.id}@rb0")
        for t in (task, with_runbook):
            specs.append(EpisodeSpec(task=t, episode_id=f"demo-{t.id}", seed=seed))
            plans[f"demo-{t.id}"] = commands
    out = run_rollouts(specs, base.PlanPolicy(plans), ChatLayout(tokenizer), RolloutConfig(
        concurrency=1, progress=False, budgets=Budgets(max_turns=gym.MAX_TURNS),
        system_prompt=embedded.SYSTEM_PROMPT))
    records = sorted(out.records, key=lambda r: r.episode_id)
    assert all(r.passed for r in records), [r.episode_id for r in records if not r.passed]
    return [seq for r in records for seq in episode_to_sequences(r, 1.0)]


def pipeline_config(tasks: int, rsr: dict | None = None):
    import ml_collections

    return ml_collections.ConfigDict({
        "job": "pipeline",
        "stage_defaults": {
            "tasks": {"source": "gym", "count": tasks},
            "rollout": {"concurrency": 1, "max_output_tokens": 48, "max_turns": 3},
            "arrays": {"length": 512},
            "eval": {"count": 2, "every": 0},
            "train": {"logprob_chunk_size": 512},
        },
        "stages": [{"name": "rsr-1", "kind": "rsr", "actor_from": "base", "critic_from": "base",
                    "rsr": {"explore_k": 2, "replay_m": 2, "batch": 2, "epochs": 2,
                            **(rsr or {})}}],
    })


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run_dir", required=True)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--parent_steps", type=int, default=200)
    args = parser.parse_args()
    import jax

    if os.environ.get("TR_TEST_JAX_CACHE"):
        jax.config.update("jax_compilation_cache_dir", os.environ["TR_TEST_JAX_CACHE"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    from tr.stages import pipeline

    run_dir = pathlib.Path(args.run_dir)
    train_parent(run_dir, args.tasks, args.parent_steps)
    summaries = pipeline.run(pipeline_config(args.tasks), run_dir)
    print("DONE " + json.dumps(summaries, sort_keys=True, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
