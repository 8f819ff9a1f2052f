"""The `base` job: a Base policy for the gym that starts low but not at zero (issue 11).

    demos     the scripted teacher plays `train` tasks in real sandboxes: clean reference runs,
              runs that open with a plausible mistake then repair it, truncated runs (the
              reference cut short, then DONE) and runbook runs (the reference, with the runbook of
              its commands after the instruction, as RSR's replays see a task); each demo's
              actions are SFT targets, except a mistake demo's wrong first action (context only,
              unless `demos.learn_mistakes`)
    init      the embedded model (`tr.models.embedded`) from `init`: the shipped weights that
              already copy names and numbers in context (300 updates of `copy_batches`, made once by
              `python -m tr.stages.embedded pretrain`), or "" for a random init then
              `copy.steps` copy updates in the run
    sft       a fixed number of updates (`tr.train.compile.build_steps` SFT step), evaluated on `val` at update
              `eval_start` and every `eval_every` updates after it (and at the last); the demos run
              in the sandboxes while the model is set up and its update compiled
    select    the checkpoint whose val Pass@1 is closest to `target` among those inside `band`
              with successes in at least half the families (closest overall if none qualifies)
    report    the selected actor on `test` (Pass@1 by family and tier) -> WORKDIR/base.json,
              base-test.txt; the actor is stage `base` (kind sft, no critic) of the stage store

Sampling for evaluation is the papers' (temperature 0.6, top-p 0.95).  Seeded by `config.seed`:
the demo mixture, the instances, initialisation and data order, so the demos and every update are
reproducible.  Evaluation is bit-reproducible too (`Evaluator`): each request's key depends only on
(seed, episode id, turn) and the sampler's numerics not on which requests share a call, so the same
parameters give the same episodes at any concurrency.
"""

from __future__ import annotations

import concurrent.futures
import json
import pathlib
import random
import shutil
import time

import numpy as np

from tr.agent import evaluation, runbook as rb
from tr.agent.harness import Budgets, EpisodeSpec
from tr.agent.harness import format_action
from tr.agent.policies import ModelPolicy
from tr.agent.records import episode_to_sequences
from tr.agent.rollout import RolloutConfig, run_rollouts
from tr.agent.transcript import ChatLayout
from tr.agent.transcript import Generation
from tr.data.episodes import packed_batches
from tr.envs import gym
from tr.models import embedded
from tr.models.decoder import Decoder
from tr.models.tokenizer import ENDOFTEXT, IM_END, IM_START, PAD
from tr.stages import handoff
from tr.stages import scalars
from tr.stages.actor import episode_sampler
from tr.stages.registry import ConfigError
from tr.train.checkpoint import STAGE_NAME, StageStore
from tr.train.compile import build_steps
from tr.train.model_fns import nnx_model_fns
from tr.train.optim import make_optimizer
from tr.train.state import create_train_state
from tr.train.updates import default_config


class PlanPolicy:
    """A teacher that plays a fixed list of commands per episode (then DONE): the demos."""

    def __init__(self, plans: dict[str, list[str]], name: str = "teacher"):
        self.plans, self.name = plans, name

    def generate(self, requests):
        out = []
        for req in requests:
            plan = self.plans[req.episode_id]
            k = sum(m["role"] == "assistant" for m in req.messages)
            text = (format_action(embedded.ACT_THOUGHT, plan[k]) if k < len(plan)
                    else format_action(embedded.DONE_THOUGHT, None))
            out.append(Generation(text=text, source="teacher"))
        return out


def demo_plans(tasks, *, seed: int, p_mistake: float, p_truncate: float,
               p_runbook: float = 0.0) -> dict[str, tuple]:
    """episode id -> (kind, commands): 'mistake' = a plausible wrong first action then the repair
    commands, 'truncated' = the reference without its last command (a one-command reference is
    replaced by the family's partial attempt), 'runbook' = the reference, played on the task whose
    instruction carries the runbook of those commands (`runbook_task`), else 'clean' = the
    reference."""

    rng = random.Random(f"demos:{seed}")
    plans = {}
    for i, task in enumerate(tasks):
        u = rng.random()
        solution = gym.solution_commands(task)
        if u < p_mistake:
            mistakes = gym.mistake_commands(task)
            plan = ("mistake", [rng.choice(mistakes)] + gym.repair_commands(task))
        elif u < p_mistake + p_truncate:
            plan = ("truncated", solution[:-1] if len(solution) > 1 else gym.partial_commands(task))
        elif u < p_mistake + p_truncate + p_runbook:
            plan = ("runbook", solution)
        else:
            plan = ("clean", solution)
        plans[f"demo-{i}-{task.id}"] = plan
    return plans


def runbook_task(task, commands):
    """`task` as an RSR replay sees it: its instruction followed by the embedded planner's runbook
    of `commands` (`tr.agent.runbook.CommandListPlanner`, `with_runbook`).  Base demos on such
    prompts teach the policy to read a runbook, so RSR's replays can succeed (SPEC §6)."""

    steps = [rb.Step(command, "", 0) for command in commands]
    return rb.with_runbook(task, rb.CommandListPlanner().plan(task, steps))


def make_demos(config, tokenizer, layout):
    """Run the demos; returns (sequences, stats)."""

    tasks = gym.split_tasks("train", config.demos.tasks, seed=config.seed)
    plans = demo_plans(tasks, seed=config.seed, p_mistake=config.demos.p_mistake,
                       p_truncate=config.demos.p_truncate, p_runbook=config.demos.p_runbook)
    specs = [EpisodeSpec(task=runbook_task(t, plan[1]) if plan[0] == "runbook" else t,
                         episode_id=eid, seed=config.seed)
             for t, (eid, plan) in zip(tasks, plans.items())]
    rc = RolloutConfig(concurrency=config.concurrency, progress=False, batch_window_s=0.0,
                       budgets=Budgets(max_turns=gym.MAX_TURNS),
                       system_prompt=config.get("system_prompt", embedded.SYSTEM_PROMPT))
    t0 = time.monotonic()
    out = run_rollouts(specs, PlanPolicy({k: v[1] for k, v in plans.items()}), layout, rc)
    wall = time.monotonic() - t0
    records = sorted(out.records, key=lambda r: r.episode_id)
    seqs, dropped = [], 0
    for rec in records:
        if not rec.status.counts:
            dropped += 1
            continue
        for seq in episode_to_sequences(rec, float(bool(rec.passed))):
            if plans[rec.episode_id][0] == "mistake" and not config.demos.learn_mistakes:
                seq = mask_first_action(seq)
            if len(seq["tokens"]) <= config.sft.length:
                seqs.append(seq)
            else:
                dropped += 1
    kinds = [v[0] for v in plans.values()]
    stats = {"episodes": len(records), "sequences": len(seqs), "dropped": dropped,
             "passed": sum(bool(r.passed) for r in records), "wall_s": wall,
             "episodes_per_s": len(records) / wall if wall else None,
             "kinds": {k: kinds.count(k) for k in sorted(set(kinds))},
             "mean_tokens": float(np.mean([len(s["tokens"]) for s in seqs])) if seqs else 0.0}
    return seqs, stats


def mask_first_action(seq: dict) -> dict:
    """`seq` with no loss on its first action (`loss_mask ∧ turn_ids ≠ t_0`, t_0 the first actor
    turn): a mistake demo's wrong action stays in the context the repair is learned from, but is
    not itself a target, so the policy learns to repair mistakes, not to make them."""
    actor_turns = seq["turn_ids"][seq["actor_mask"]]
    if not len(actor_turns):
        return seq
    return {**seq, "loss_mask": seq["loss_mask"] & (seq["turn_ids"] != actor_turns.min())}


def copy_batches(ordinary_ids: np.ndarray, *, batch: int, length: int, span: tuple[int, int],
                 prev_rows: int, seed: int):
    """Endless copy-only batches [batch, length] of random `ordinary_ids`: what a command needs to
    copy a name or number it has read ("/app/data/kelp.txt" in the instruction, "cp /app/data/" then
    "kelp" in the command).

    The first `prev_rows` rows repeat every token once (x₁x₁x₂x₂…, loss on each second token): a
    previous-token head.  The other rows pack segments s‖s of spans s with |s| ∈ [span₀, span₁]
    (loss on the repeat after its first token): an induction head, which matches the current token
    against earlier tokens' predecessors -- the previous-token head's output.  Both together form it
    within a few hundred updates at lr 1e-2; the span rows alone stay near 5 nats for 2,000 updates
    (issue 11's note).  Segment ids 1, 2, ... (attention stays inside a segment), 0 on padding."""
    rng = np.random.default_rng([seed, 7])
    lo, hi = span
    while True:
        out = {"tokens": np.zeros((batch, length), np.int32),
               "loss_mask": np.zeros((batch, length), bool),
               "segment_ids": np.zeros((batch, length), np.int32)}
        for r in range(batch):
            if r < prev_rows:
                out["tokens"][r] = np.repeat(rng.choice(ordinary_ids, size=(length + 1) // 2), 2)[:length]
                out["loss_mask"][r, 1::2] = True
                out["segment_ids"][r] = 1
                continue
            at, segment = 0, 1
            while True:
                n = int(rng.integers(lo, hi + 1))
                if at + 2 * n > length:
                    break
                s = rng.choice(ordinary_ids, size=n)
                out["tokens"][r, at:at + 2 * n] = np.concatenate([s, s])
                out["loss_mask"][r, at + n + 1:at + 2 * n] = True
                out["segment_ids"][r, at:at + 2 * n] = segment
                at, segment = at + 2 * n, segment + 1
        yield out


def with_copy_rows(data, *, rows: int, ordinary_ids: np.ndarray, span: tuple[int, int], seed: int):
    """`data`'s batches with `rows` span-copy rows (`copy_batches`) appended: keeps the copy
    warm-up's induction head while the demos are learned."""
    copies = None
    for batch in data:
        if rows:
            length = batch["tokens"].shape[1]
            copies = copies or copy_batches(ordinary_ids, batch=rows, length=length, span=span,
                                            prev_rows=0, seed=seed)
            extra = next(copies)
            batch = {key: np.concatenate([batch[key], extra[key]]) for key in batch}
        yield batch


def ordinary_ids(tokenizer) -> np.ndarray:
    """Every id of `tokenizer` except its chat specials (pad, end of text, turn markers)."""

    special = {tokenizer.special_id(name) for name in (PAD, ENDOFTEXT, IM_START, IM_END)}
    return np.asarray([i for i in range(tokenizer.vocab_size) if i not in special], np.int32)


class Evaluator:
    """Pass@1 of the current parameters on a fixed task list, on an `EpisodeSampler` (compiled
    once).  Each request's key is `fold_in(key(seed), crc32(episode id, episode seed, turn))`
    (`ModelPolicy.submit`), and the sampler's shapes are fixed (`actor.MIN_SLOTS` rows, the full cache
    length, batch-invariant prefill) and the episode's wall-clock cap is far above need
    (`eval.wall_time_s`), so an evaluation is a function of (parameters, tasks, seed): the same
    episodes at any concurrency and any timing of the sandboxes."""

    def __init__(self, config, model, tokenizer):
        self.config, self.model, self.tokenizer = config, model, tokenizer
        self.sampler = episode_sampler(model, tokenizer, concurrency=config.concurrency,
                                       max_new_tokens=config.eval.max_output_tokens)
        self.policy_cls = ModelPolicy

    def set_params(self, params) -> None:
        self.sampler.update_weights(params)

    def close(self) -> None:
        self.sampler.close()

    def __call__(self, tasks, workdir: pathlib.Path, *, concurrency: int | None = None) -> dict:
        ev = self.config.eval
        policy = self.policy_cls(self.sampler, self.tokenizer, temperature=ev.temperature,
                                 top_p=ev.top_p, seed=self.config.seed, name="base")
        budgets = policy.budgets(ev.max_output_tokens, max_turns=ev.max_turns,
                                 summarise_at_tokens=None, wall_time_s=ev.wall_time_s)
        return evaluation.evaluate({"base": policy}, tasks, k=1, workdir=workdir,
                                   concurrency=concurrency or self.config.concurrency,
                                   budgets=budgets, seed=self.config.seed, progress=False,
                                   system_prompt=self.config.system_prompt)["base"]


def pass_rate(summary: dict) -> tuple[float, dict]:
    by_family = {f: (v["pass@1"] or 0.0) for f, v in summary["by_family"].items()}
    return summary["overall"]["pass@1"] or 0.0, by_family


def select(evals: list[dict], *, target: float, band: tuple[float, float]) -> dict:
    """The eval closest to `target` among those in `band` with successes in >= half the
    families; if none qualifies, the closest overall (ties: the earlier step)."""
    def ok(e):
        fams = e["by_family"]
        return band[0] <= e["pass_at_1"] <= band[1] and 2 * sum(v > 0 for v in fams.values()) >= len(fams)

    pool = [e for e in evals if ok(e)] or evals
    return min(pool, key=lambda e: (abs(e["pass_at_1"] - target), e["step"]))


def table(summary: dict) -> str:
    lines = [f"{'group':<26} {'tasks':>5} {'Pass@1':>7}"]
    rows = [("overall", summary["overall"])]
    rows += [(f"family {f}", v) for f, v in summary["by_family"].items()]
    rows += [(f"tier {t}", v) for t, v in summary["by_tier"].items()]
    for label, v in rows:
        p = v["pass@1"]
        lines.append(f"{label:<26} {v['tasks']:>5} {'-' if p is None else f'{100 * p:6.1f}%':>7}")
    return "\n".join(lines)



# ------------------------------------------------------------------------------------------------
# Config: one set of defaults for the `base` job (experiments/base_policy.py) and stage kind.

VARIANTS = ("default", "fast", "quick", "smoke")
# About half the default's cost (half the demos, 2/3 of the updates, 3 val evaluations, 32 test
# tasks): a Base for pipelines whose whole budget is a few minutes (Terminal-RSI's main job).
FAST = {"demos.tasks": 672, "sft.steps": 120, "sft.warmup": 16, "sft.eval_start": 80,
        "sft.eval_every": 40, "eval.test_count": 32}
QUICK = {"demos.tasks": 24, "sft.steps": 6,
         "sft.eval_start": 3, "sft.eval_every": 3, "sft.batch": 4, "eval.val_count": 8,
         "eval.test_count": 8, "eval.max_turns": 2, "eval.max_output_tokens": 32}
# Smaller still than `quick` (one eval of two tasks, one turn): the pod form's local smoke run and
# the stage kind's test.
SMOKE = {**QUICK, "demos.tasks": 8, "sft.steps": 2, "sft.eval_start": 2,
         "sft.eval_every": 2, "sft.batch": 2, "eval.val_count": 2, "eval.test_count": 2, "eval.max_turns": 1,
         "eval.max_output_tokens": 16}
SECTIONS = ("demos", "copy", "sft", "eval", "select")
TOP_FIELDS = ("seed", "model", "tokenizer", "system_prompt", "concurrency", "init")


def defaults(variant: str = "default"):
    """The Base config: seed, stage, model, tokenizer, concurrency and the sections
    demos / sft / eval / select (the `base` stage kind's fields, too)."""
    import ml_collections

    if variant not in VARIANTS:
        raise ConfigError(f"Base variant {variant!r} is not known; choose one of {VARIANTS}")
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.stage = "base"
    config.model = embedded.MODEL                         # tr/models/embedded.py
    config.tokenizer = embedded.TOKENIZER                 # or "byte"
    config.system_prompt = embedded.SYSTEM_PROMPT         # demos, evaluation, the manifest
    # Initial weights (a safetensors file of `model`; "" = random init from `seed`): the shipped
    # copy-pretrained init (tr/models/assets/gym_init.safetensors), so the run's budget goes to the demos.
    config.init = embedded.INIT
    config.concurrency = 16                               # sandboxes at once = sampler batch
    config.demos = ml_collections.ConfigDict()
    # Train instances, one demo each.  Each demo is seen about twice in 120 updates of ~20 demos:
    # with 448 demos (8 passes) the model memorised them (loss 0.10 at update 160, val 0.09-0.16).
    # The demos are the run's critical path (~10 episodes/s with 16 sandboxes on 2 cores).
    config.demos.tasks = 1024
    config.demos.p_mistake = 0.3                          # mistake first, then repair
    config.demos.p_truncate = 0.1                         # reference cut short, then DONE
    config.demos.p_runbook = 0.2                          # reference, runbook in the prompt (RSR)
    config.demos.learn_mistakes = False                   # a mistake demo's wrong action: context only
    config.sft = ml_collections.ConfigDict()
    config.sft.steps = 120
    config.sft.batch = 8                                  # packed rows per update (~3 demos a row)
    config.sft.length = 512                               # row length (tokens); longer demos dropped
    config.sft.learning_rate = 3e-3
    config.sft.warmup = 20
    config.sft.eval_start = 80                            # val evaluations at 80 and 120
    config.sft.eval_every = 40
    # micro-batches of 2 rows (train.micro_batch_rows): an 8-row update 1.47 -> 1.16 s on 2 cores
    # (4 Dec; smaller activations), the same loss and gradient up to rounding
    config.sft.micro_batch_rows = 2
    # In-context copying (`copy_batches`), with its own optimizer: the demos teach each family's
    # commands, these updates the mechanism that fills names and numbers into them.  The shipped
    # `init` already had `embedded.INIT_COPY_STEPS` of them (same settings); with init "" the run
    # makes them itself (`copy.steps` 300: ~2 min on 2 cores).
    config.copy = ml_collections.ConfigDict()
    config.copy.steps = 0                                 # copy-only updates in the run (0: none)
    config.copy.learning_rate = 1e-2                      # at 3e-3 the induction head does not form
    config.copy.batch = 16
    config.copy.length = 128
    config.copy.span = (4, 24)                            # span lengths (tokens), inclusive
    config.copy.prev_rows = 4                             # previous-token rows per copy batch
    config.copy.rows = 1                                  # span-copy rows in each demo batch after
    config.eval = ml_collections.ConfigDict()
    config.eval.val_count = 32
    config.eval.test_count = 64
    config.eval.temperature = 0.6                         # the papers' evaluation sampling
    config.eval.top_p = 0.95
    config.eval.max_turns = 5                             # reference <= 3 commands + DONE
    config.eval.max_output_tokens = 64
    # An episode's wall-clock cap, far above what it needs: turns and tokens end the episodes, so
    # a loaded machine (or the first call's compile) never changes an evaluation.
    config.eval.wall_time_s = 1800.0
    config.select = ml_collections.ConfigDict()
    config.select.target = 0.20
    config.select.band = (0.10, 0.35)
    for key, value in {"fast": FAST, "quick": QUICK, "smoke": SMOKE}.get(variant, {}).items():
        section, field = key.split(".")
        config[section][field] = value
    return config


def check_config(config) -> None:
    """The value checks of a Base config (before anything runs); ConfigError names the field."""

    if not STAGE_NAME.match(config.stage or ""):
        raise ConfigError(f"config.stage / stage name {config.stage!r} must match "
                          f"{STAGE_NAME.pattern}")
    for field in ("tasks",):
        if config.demos[field] < 1:
            raise ConfigError(f"config.demos.{field} must be >= 1, got {config.demos[field]}")
    shares = {f: float(config.demos[f]) for f in ("p_mistake", "p_truncate", "p_runbook")}
    if min(shares.values()) < 0 or sum(shares.values()) > 1:
        raise ConfigError(f"config.demos shares {shares} must each be >= 0 and sum to <= 1 (the "
                          "rest are clean demos)")
    for field in ("steps", "batch", "length", "eval_every", "eval_start"):
        if config.sft[field] < 1:
            raise ConfigError(f"config.sft.{field} must be >= 1, got {config.sft[field]}")
    if config.copy.steps < 0:
        raise ConfigError(f"config.copy.steps must be >= 0, got {config.copy.steps}")
    if config.copy.steps and not 0 <= config.copy.prev_rows < config.copy.batch:
        raise ConfigError(f"config.copy.prev_rows = {config.copy.prev_rows} must be >= 0 and < "
                          f"config.copy.batch = {config.copy.batch} (span rows are needed)")
    lo, hi = config.copy.span
    if not 1 <= lo <= hi or 2 * hi > min(config.copy.length, config.sft.length):
        raise ConfigError(f"config.copy.span {tuple(config.copy.span)} must satisfy 1 <= lo <= hi and "
                          f"2 * hi <= config.copy.length / config.sft.length (a span and its repeat "
                          "fit a row)")
    if not 0 <= config.copy.rows < config.sft.batch:
        raise ConfigError(f"config.copy.rows = {config.copy.rows} must be >= 0 and < "
                          f"config.sft.batch = {config.sft.batch} (rows of demos are needed)")
    if embedded.canonical(config.init) == embedded.INIT and config.model != embedded.MODEL:
        raise ConfigError(f"config.init {config.init!r} holds weights of model {embedded.MODEL!r}, "
                          f"not {config.model!r}: set config.init='' (random init) or a file of "
                          "that model")
    if config.init and not embedded.repo_path(config.init).exists():
        raise ConfigError(f"config.init {config.init!r}: no such file or folder (`python -m "
                          "tr.stages.embedded pretrain` writes the embedded one; '' = random init)")
    lo, hi = config.select.band
    if not 0 <= lo <= config.select.target <= hi <= 1:
        raise ConfigError(f"config.select: need 0 <= band[0] <= target <= band[1] <= 1, got "
                          f"target {config.select.target}, band {config.select.band}")


# ------------------------------------------------------------------------------------------------
# Training, selection, report


def sft_stepper(fns, actor_params, *, learning_rate: float, warmup: int, steps: int, seed: int,
                micro_batch_rows: int = 0):
    """(compiled SFT update, train state) for `steps` updates of `actor_params` with a fresh AdamW:
    lr warms up for `warmup` updates, then cosine to a tenth at `steps`; `micro_batch_rows`: the
    train config's (0: one pass over each batch)."""

    train_cfg = default_config()
    train_cfg.micro_batch_rows = int(micro_batch_rows)
    opt = train_cfg.actor.optimizer
    opt.learning_rate, opt.schedule, opt.warmup_steps = learning_rate, "warmup_cosine", warmup
    opt.decay_steps, opt.end_learning_rate_factor = steps, 0.1
    step = build_steps(train_cfg, actor_logprobs=fns.actor_logprobs).sft
    state = create_train_state(actor_params=actor_params,
                               actor_optimizer=make_optimizer(opt), seed=seed)
    return step, state


def copy_warmup(config, fns, tokenizer, t_start: float):
    """`config.copy.steps` SFT updates on `copy_batches` with their own AdamW (lr
    `config.copy.learning_rate`, warm-up then cosine to a tenth); returns (actor params, stats)."""
    c = config.copy
    step, state = sft_stepper(fns, fns.actor_params, learning_rate=c.learning_rate,
                              warmup=min(20, c.steps), steps=c.steps, seed=config.seed)
    data = copy_batches(ordinary_ids(tokenizer), batch=c.batch, length=c.length, span=tuple(c.span),
                        prev_rows=c.prev_rows, seed=config.seed)
    t0, losses = time.monotonic(), []
    for i in range(1, c.steps + 1):
        state, metrics = step(state, next(data))
        if i % 50 == 0 or i == c.steps:
            losses.append({"step": i, "loss": float(metrics["actor/loss"])})
            print(f"[{time.monotonic() - t_start:5.0f}s] copy warm-up {i}/{c.steps}: loss "
                  f"{losses[-1]['loss']:.3f}", flush=True)
    wall = time.monotonic() - t0
    print(f"copy warm-up: {c.steps} steps in {wall:.0f}s", flush=True)
    return state.actor_params, {"steps": c.steps, "loss": losses[-1]["loss"], "curve": losses,
                                "wall_s": wall}


def train(config, run_dir: pathlib.Path, out_dir: pathlib.Path) -> dict:
    """Demos, SFT, val selection, test: stage `config.stage` of `run_dir`'s stage store (its
    `summary.json` too) and base.json / base-test.txt / base-metrics.jsonl / base-evals/ in
    `out_dir`.  Returns base.json's content."""
    import jax
    from flax import nnx

    check_config(config)
    t_start = time.monotonic()
    run_dir, out_dir = pathlib.Path(run_dir), pathlib.Path(out_dir)
    tokenizer = embedded.load_tokenizer(config.tokenizer)
    model_cfg = embedded.model_config(config.model)
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ConfigError(f"config.tokenizer {config.tokenizer!r} has {tokenizer.vocab_size} ids > "
                          f"model {config.model!r} vocab_size {model_cfg.vocab_size}")
    layout = ChatLayout(tokenizer)
    stage_dir = run_dir / config.stage
    if stage_dir.exists():         # an unfinished leftover (a finished stage is never re-run)
        shutil.rmtree(stage_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    init_digest = embedded.file_digest(config.init) if config.init else None

    # The demos are sandbox-bound, the set-up below compute-bound: run them side by side.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="demos") as pool:
        demos = pool.submit(make_demos, config, tokenizer, layout)
        try:
            model = embedded.load_init(Decoder(model_cfg, rngs=nnx.Rngs(config.seed)), config.init)
            fns = nnx_model_fns(model)
            actor_params, copy_stats = fns.actor_params, {"steps": 0}
            if config.copy.steps:
                actor_params, copy_stats = copy_warmup(config, fns, tokenizer, t_start)
            sft, state = sft_stepper(fns, actor_params, learning_rate=config.sft.learning_rate,
                                     warmup=config.sft.warmup, steps=config.sft.steps,
                                     seed=config.seed,
                                     micro_batch_rows=int(config.sft.micro_batch_rows))
            shape = (config.sft.batch, config.sft.length)
            jax.block_until_ready(sft(state, {"tokens": np.zeros(shape, np.int32),       # compile
                                              "loss_mask": np.zeros(shape, bool),
                                              "segment_ids": np.ones(shape, np.int32)}))
        except BaseException:
            demos.cancel()
            raise
        seqs, demo_stats = demos.result()
    print(f"demos: {json.dumps(demo_stats, sort_keys=True)}", flush=True)
    if not seqs:
        raise RuntimeError("no demo sequence fits config.sft.length")
    data = iter(packed_batches(seqs, batch=config.sft.batch - int(config.copy.rows),
                               length=config.sft.length, pad_id=tokenizer.pad_id, seed=config.seed))
    data = with_copy_rows(data, rows=int(config.copy.rows), ordinary_ids=ordinary_ids(tokenizer),
                          span=tuple(config.copy.span), seed=config.seed + 1)
    val_tasks = gym.split_tasks("val", config.eval.val_count, seed=config.seed)
    test_tasks = gym.split_tasks("test", config.eval.test_count, seed=config.seed)
    evaluator = Evaluator(config, model, tokenizer)
    evals, kept, metrics_log = [], {}, []
    t_train = t_eval = 0.0
    for step in range(1, config.sft.steps + 1):
        t0 = time.monotonic()
        state, metrics = sft(state, next(data))
        due = step >= config.sft.eval_start and (step - config.sft.eval_start) % config.sft.eval_every == 0
        if due or step == config.sft.steps:
            loss = float(metrics["actor/loss"])
            t_train += time.monotonic() - t0
            t0 = time.monotonic()
            evaluator.set_params(state.actor_params)
            summary = evaluator(val_tasks, out_dir / "base-evals" / f"val-{step}")
            p, fams = pass_rate(summary)
            evals.append({"step": step, "pass_at_1": p, "by_family": fams, "loss": loss,
                          "format_errors": summary["format_errors"]})
            kept[step] = state
            t_eval += time.monotonic() - t0
            print(f"[{time.monotonic() - t_start:5.0f}s] step {step}: loss {loss:.3f}  val Pass@1 "
                  f"{p:.3f}  families with a success {sum(v > 0 for v in fams.values())}/"
                  f"{len(fams)}  format errors {summary['format_errors']}  (train {t_train:.0f}s, "
                  f"eval {t_eval:.0f}s so far)", flush=True)
            metrics_log.append({"step": step, "loss": loss, "val_pass_at_1": p})
        else:
            jax.block_until_ready(state.step)
            t_train += time.monotonic() - t0
    chosen = select(evals, target=config.select.target, band=tuple(config.select.band))
    state = kept[chosen["step"]]
    kept.clear()

    evaluator.set_params(state.actor_params)
    t0 = time.monotonic()
    test = evaluator(test_tasks, out_dir / "base-evals" / "test")
    evaluator.close()
    t_eval += time.monotonic() - t0
    stage_config = {**embedded.manifest_config(), "model": config.model,
                    "tokenizer": embedded.pin_tokenizer(config.tokenizer),
                    "system_prompt": config.system_prompt,
                    "seed": config.seed,
                    "selected_step": chosen["step"], "steps": config.sft.steps,
                    "init": config.init, "init_digest": init_digest,
                    "copy": config.copy.to_dict()}
    wall = time.monotonic() - t_start
    result = {
        "stage": config.stage, "seed": config.seed, "selected_step": chosen["step"],
        "val": {"pass_at_1": chosen["pass_at_1"], "by_family": chosen["by_family"],
                "tasks": len(val_tasks)},
        "test": {"pass_at_1": test["overall"]["pass@1"] or 0.0,
                 "by_family": {f: v["pass@1"] or 0.0 for f, v in test["by_family"].items()},
                 "by_tier": {t: v["pass@1"] or 0.0 for t, v in test["by_tier"].items()},
                 "heldout_family": gym.HELDOUT_FAMILY, "tasks": len(test_tasks),
                 "format_errors": test["format_errors"]},
        "evals": evals, "demos": demo_stats, "copy": copy_stats,
        "wall_s": wall, "train_s": t_train, "eval_s": t_eval,
        "model": config.model, "tokenizer": config.tokenizer,
        "init": config.init, "init_digest": init_digest,
    }
    _write_json(out_dir / "base.json", result)
    text = (f"Base (seed {config.seed}, step {chosen['step']} of {config.sft.steps}): "
            f"val Pass@1 {chosen['pass_at_1']:.3f}, test Pass@1 {result['test']['pass_at_1']:.3f} "
            f"(held-out family: {gym.HELDOUT_FAMILY}); wall {wall:.0f}s\n" + table(test) + "\n")
    (out_dir / "base-test.txt").write_text(text)
    with open(out_dir / "base-metrics.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(m, sort_keys=True) + "\n" for m in metrics_log)
    board = scalars.ScalarWriter(out_dir, purge_step=0)   # a re-trained Base replaces its curve
    board.write(metrics_log)
    board.close()
    with StageStore(run_dir, config.stage, async_save=False) as store:
        store.create(kind="sft", config=stage_config)
        manifest = store.finish(state)
    # summary.json last: with the manifest's finished_step it marks the stage finished.
    summary = {"stage": config.stage, "kind": KIND, "finished_step": manifest["finished_step"],
               "retained_step": int(jax.device_get(state.step)), "actor_hash": manifest.get("actor_hash_after"),
               "critic_hash": None,
               **{k: result[k] for k in ("val", "test", "wall_s", "train_s", "eval_s", "seed",
                                         "model", "tokenizer")}}
    _write_json(stage_dir / "summary.json", summary)
    print(text, flush=True)
    return result


def _write_json(path: pathlib.Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    tmp.replace(path)


def _finished(run_dir: pathlib.Path, stage: str) -> dict | None:
    return handoff.finished_summary(run_dir, stage)


def run(config, workdir: pathlib.Path) -> dict:
    """The `base` job: stage `config.stage` of WORKDIR's store, WORKDIR/base.json and the rest.
    A finished stage is not trained again (its base.json is returned)."""
    workdir = pathlib.Path(workdir)
    if _finished(workdir, config.stage) is not None and (workdir / "base.json").exists():
        print(f"stage {config.stage!r} is finished in {workdir}; not run again", flush=True)
        return json.loads((workdir / "base.json").read_text())
    return train(config, workdir, workdir)


# ------------------------------------------------------------------------------------------------
# Stage kind `base` (tr.stages.pipeline)

KIND = "base"
# Fields of the pipeline's shared `stage_defaults` (tr.stages.stage_config.stage_defaults) that a Base
# stage has no use for: ignored when they reach it through the merge, not an error.
_SHARED_IGNORED = ("tasks", "critic_init", "train", "rollout", "arrays", "checkpoint", "eval.every",
                   "eval.k", "eval.count", "eval.at_start")


def stage_config(entry) -> "ml_collections.ConfigDict":
    """A pipeline entry (merged over `stage_defaults`) -> the Base config: `defaults(variant)`
    updated by the entry's seed, model, tokenizer, concurrency and demos / sft / eval / select
    fields; `name` becomes the stage.  An unknown field raises `ConfigError` naming it."""
    entry = entry.to_dict() if hasattr(entry, "to_dict") else dict(entry)
    name = entry.get("name")
    config = defaults(entry.get("variant") or "default")
    config.stage = name
    for parent in ("actor_from", "critic_from"):
        if entry.get(parent) not in (None, "", "fresh"):
            raise ConfigError(f"stage {name!r} (kind base) trains an actor from scratch: "
                              f"{parent}={entry[parent]!r} must be '' or 'fresh'")
    for field in ("model", "tokenizer", "system_prompt"):   # "": the hand-off's 'from a parent'
        if entry.get(field) == "":
            entry.pop(field)
    model = entry.get("model")
    if isinstance(model, dict):
        if model.get("overrides"):
            raise ConfigError(f"stage {name!r} (kind base): model.overrides "
                              f"{model['overrides']!r} cannot be recorded in the manifest; name a "
                              "size of tr/models/config.py")
        entry["model"] = model.get("name") or config.model
    for key, value in entry.items():
        if key in ("name", "kind", "variant", "actor_from", "critic_from") or key in _SHARED_IGNORED:
            continue
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"stage {name!r} (kind base): {key} must be a mapping, got {value!r}")
            for field, v in value.items():
                if f"{key}.{field}" in _SHARED_IGNORED:
                    continue
                if field not in config[key]:
                    raise ConfigError(f"stage {name!r} (kind base): unknown config field "
                                      f"{key}.{field}; known: {sorted(config[key])}")
                config[key][field] = tuple(v) if isinstance(v, list) else v
        elif key in TOP_FIELDS:
            config[key] = value
        else:
            raise ConfigError(f"stage {name!r} (kind base): unknown config field {key!r}; known: "
                              f"{sorted([*TOP_FIELDS, 'variant', *SECTIONS])}")
    return config


def run_stage(stage_config_entry, run_dir, **_) -> dict:
    """Stage kind `base`: the Base SFT as stage `run_dir/<name>/` (kind sft, actor only), its
    base.json / base-test.txt / base-evals inside the stage directory; returns `summary.json`
    (`retained_step` = the val-selected step, val / test Pass@1).  A finished stage is not re-run."""
    run_dir = pathlib.Path(run_dir)
    config = stage_config(stage_config_entry)
    done = _finished(run_dir, config.stage)
    if done is not None:
        return done
    train(config, run_dir, run_dir / config.stage)
    return _finished(run_dir, config.stage)
