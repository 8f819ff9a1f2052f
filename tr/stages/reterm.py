"""ReTerm end to end on the gym (issue 15, SPEC §6): Base -> SFT -> GRPO -> ReTerm-GRPO.

Three pipeline stage kinds (`tr.stages.registry.STAGE_KINDS`), each `run(stage_config, run_dir)`
over the run's stage store (actor only, no critic; resumable; `summary.json` with the step
retained on `val`).  The model, tokenizer and system prompt come from the `actor_from` stage's
manifest (`tr.models.embedded.from_manifest`) and are recorded in the stage's own manifest:

    reterm_sft   data: the parent actor attempts `train` tasks N times (pre-verifier snapshots);
                 each failure is continued by the teacher (embedded: inspect + gym repair; or an
                 HTTP endpoint) from its restored s_f; four filters; JSONL shards in
                 `<stage>/data/` (kept on resume).  Then SFT on the kept rows: input
                 (x, h_f, r condensed), loss on teacher tokens only, mixed with scripted demos of
                 plain `train` tasks (`sft.plain_share` of the rows, the Base's demo code) so the
                 actor keeps doing tasks from scratch
    grpo         GRPO: (M_O + M_R) original groups of G per update (compute-matched with ReTerm)
    reterm_grpo  ReTerm-GRPO: M_O original + M_R recovery groups from the queue (front insert,
                 front-first sampling, capacity K, oldest evicted with its snapshot; a resumed
                 stage starts with an empty queue); rewards = strict pass, group-normalised
                 advantages (population std + δ), groups weighted by `grpo.group_weighting`
                 ("equal" by default; see tr.rl.losses); the clip range `grpo.eps_low/high` is a
                 config value (the paper gives none)

The `reterm` job (`experiments/reterm.py`) is a config of stages: `base` (stage kind `base`: the
gym Base SFT, tr/stages/base.py) -> `sft` (reterm_sft) ->
`grpo` and `reterm_grpo` (both from `sft`) [-> the queue sweep's reterm_grpo stages], then

    heldout      failure states collected once from the Base on `test` (fixed for Recovery@k):
                 `eval.heldout_states` of them, round-robin over the failed tasks' families
    report       per arm (the stage's retained step): Pass@1 on `test`, Recovery@k on the
                 held-out states (and by rule-based error category), mean turns and generated
                 tokens per episode; dataset counts and rejections per filter; queue counts; reward
                 curves of original and recovery groups -> report.json, report.md, reward_curves.png
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import random
import time

import ml_collections
import numpy as np

from tr.agent import recovery
from tr.agent.harness import Budgets
from tr.agent.http_policy import HttpPolicy
from tr.agent.policies import ModelPolicy
from tr.agent.records import episode_to_sequences, pad_sequences, write_shard
from tr.data.episodes import packed_batches
from tr.models import embedded
from tr.rl.losses import AGGREGATIONS
from tr.stages import progress, scalars
from tr.stages.registry import ConfigError
from tr.agent.recovery import (
    CONDENSED_PROMPT, EmbeddedTeacher, RecoveryQueue, episode_costs, failure_of_group, read_shards, recovery_at_k, sft_sequences,
)
from tr.agent.rollout import (
    RolloutConfig, discard_snapshot_ref, group_specs, recovery_specs, run_rollouts,
)
from tr.agent.transcript import ChatLayout
from tr.envs import gym
from tr.models.config import get_model_config
from tr.models.decoder import Decoder
from tr.models.weights import assign_params
from tr.stages import base
from tr.stages.actor import episode_sampler
from tr.stages.handoff import finish_stage, finished_summary
from tr.stages.machine import machine_info
from tr.stages.registry import stage_kind
from tr.stages.splits import iteration_tasks
from tr.stages.stage_config import resolve_stage_config
from tr.train import checkpoint as ckpt
from tr.train.checkpoint import StageStore
from tr.train.compile import CompileClock, build_steps, use_compilation_cache
from tr.train.model_fns import nnx_model_fns
from tr.train.optim import make_optimizer
from tr.train.state import abstract_state, create_train_state
from tr.train.updates import default_config

ARMS = ("base", "sft", "grpo", "reterm_grpo")
KINDS = ("reterm_sft", "grpo", "reterm_grpo")
# recovery.history_turns at CPU scale: a recovery (teacher rows, Recovery@k, ReTerm-GRPO groups)
# inherits the task prompt and the last N turns of h_f (`tr.agent.transcript.inherited_history`),
# so it fits the gym model's context with room to act; paper: 0 (the whole history).  Measured on
# 29 failures of the default Base on 16 train tasks (seed 0): the first recovery context (h_f + r)
# is median 593 / max 749 tokens with all of h_f (17 over the 512 prompt budget), 469 / 598 with
# N = 2 (5 over), 334 / 408 with N = 1 (none over; teacher rows median 530, max 674)
HISTORY_TURNS = 1
PLAIN_SHARE = 0.5       # sft.plain_share at CPU scale; paper: 0 (recovery rows only)
MICRO_BATCH_ROWS = 2    # sft / grpo .micro_batch_rows at CPU scale (train.micro_batch_rows)


# ----------------------------------------------------------------------------------------------
# Stage configs.

def defaults(kind: str) -> ml_collections.ConfigDict:
    """The fields of a `reterm_sft` / `grpo` / `reterm_grpo` stage entry (sizes: CPU scale; the
    paper's in comments)."""
    if kind not in KINDS:
        raise ConfigError(f"stage kind {kind!r}: expected one of {KINDS}")
    c = ml_collections.ConfigDict({
        "name": "", "kind": kind, "actor_from": "", "critic_from": "", "seed": 0,
        "concurrency": 16,                       # sandboxes at once = the sampler's batch
        "tasks": {"train_count": 48, "val_count": 32, "seed": 0},      # gym splits
        "eval": {"every": 0,                     # val Pass@1 every N updates (0: at the end only)
                 "at_start": False,              # also the handed-off actor (may be retained)
                 "temperature": 0.6, "top_p": 0.95, "max_turns": 5, "max_output_tokens": 64,
                 # an episode's context (prompt + output), 0: the sampler's bucket rule
                 # (`ModelPolicy.budgets`: 512 + 64 for the gym model)
                 "context": 0},
        "checkpoint": {"save_every": 1},
    })
    if kind == "reterm_sft":
        c.data = {"attempts": 2, "temperature": 1.0}
        # "embedded" (inspect + gym repair) or "http" (any OpenAI-compatible endpoint); its own
        # budgets (a text policy, not bound to the sampler); judge_url: the optional LLM judge
        # of flagged recoveries (compliance, efficiency), else a flag rejects
        # thoughts (embedded teacher): "student" = the embedded model's own THOUGHT phrases
        # (tr/models/embedded.py), so SFT teaches the recovery commands, not a new prose;
        # "teacher" = the teacher's descriptive ones (`recovery.EmbeddedTeacher.DEFAULT_THOUGHTS`)
        c.teacher = {"kind": "embedded", "thoughts": "student", "base_url": "", "model": "",
                     "max_turns": 8,
                     "max_output_tokens": 512, "max_context_tokens": 8192,
                     "judge_url": "", "judge_model": ""}
        # plain_share: the share of SFT rows that are scripted demos of plain `train` tasks
        # (`plain_rows`), the rest recovery rows
        c.sft = {"steps": 60, "batch": 8, "length": 1024,
                 "learning_rate": 2e-4,          # paper: 5e-6 at 9B, batch 16
                 "plain_share": PLAIN_SHARE,
                 # micro-batches of 2 rows (train.micro_batch_rows): an 8-row SFT update 1.47 ->
                 # 1.16 s on 2 cores (4 Dec); 0: one pass over the batch (the pod's setting)
                 "micro_batch_rows": MICRO_BATCH_ROWS}
        c.checkpoint.save_every = 10
    else:
        c.grpo = {"updates": 6, "group_size": 4,            # paper: 16
                  "m_original": 4, "m_recovery": 1,         # paper: 8, 2
                  "learning_rate": 3e-5,                    # paper: 5e-7 at 9B
                  "eps_low": 0.30, "eps_high": 5.00,        # not in the paper: SPEC §4 defaults
                  "std_eps": 1e-6,                          # δ of the group normalisation
                  "group_weighting": "equal",               # or "literal" (tr/rl/losses.py)
                  # how J_g aggregates a group's tokens (tr/rl/losses.py): the recipe's
                  # token_mean, pinned here whatever the library default
                  "aggregation": "token_mean", "aggregation_constant": 0.0,
                  "length": 1024,
                  "micro_batch_rows": MICRO_BATCH_ROWS}     # as sft.micro_batch_rows
        if kind == "reterm_grpo":
            c.queue = {"capacity": 16, "sampling": "front"}
    if kind in ("reterm_sft", "reterm_grpo"):
        c.recovery = {"history_turns": HISTORY_TURNS}   # turns of h_f a recovery sees (0: all)
    return c


def resolve(stage_config, kind: str) -> ml_collections.ConfigDict:
    fields = defaults(kind)
    fields.lock()                    # an unknown field (top level too) raises, naming it
    config = resolve_stage_config(stage_config, fields)
    if not config.actor_from:
        raise ConfigError(f"stage {config.name!r} ({kind}) needs actor_from (a stage name)")
    if config.critic_from:
        raise ConfigError(f"stage {config.name!r} ({kind}): critic_from = "
                          f"{config.critic_from!r}, but {kind} trains no critic")
    sections = {"reterm_sft": ("sft.steps", "sft.batch", "sft.length", "data.attempts"),
                "grpo": ("grpo.updates", "grpo.group_size", "grpo.m_original", "grpo.length")}
    for path in sections.get(kind, sections["grpo"]) + ("tasks.train_count", "concurrency"):
        node = config
        for p in path.split("."):
            node = node[p]
        if int(node) < 1:
            raise ConfigError(f"stage {config.name!r}: {path} must be >= 1, got {node}")
    if kind != "reterm_sft":
        if config.grpo.m_recovery < 0:
            raise ConfigError(f"stage {config.name!r}: grpo.m_recovery must be >= 0, got "
                              f"{config.grpo.m_recovery}")
        if config.grpo.group_weighting not in ("equal", "literal"):
            raise ConfigError(f"stage {config.name!r}: grpo.group_weighting = "
                              f"{config.grpo.group_weighting!r}: expected 'equal' or 'literal'")
        if config.grpo.aggregation not in AGGREGATIONS:
            raise ConfigError(f"stage {config.name!r}: grpo.aggregation = "
                              f"{config.grpo.aggregation!r}: expected one of {AGGREGATIONS}")
    if kind == "reterm_grpo":
        if config.queue.sampling not in ("front", "uniform"):
            raise ConfigError(f"stage {config.name!r}: queue.sampling = {config.queue.sampling!r}"
                              ": expected 'front' or 'uniform'")
        if config.queue.capacity < 1:
            raise ConfigError(f"stage {config.name!r}: queue.capacity must be >= 1, got "
                              f"{config.queue.capacity}")
    if kind in ("reterm_sft", "reterm_grpo") and int(config.recovery.history_turns) < 0:
        raise ConfigError(f"stage {config.name!r}: recovery.history_turns must be >= 0 (0 = the "
                          f"whole history), got {config.recovery.history_turns}")
    if kind == "reterm_sft" and not 0 <= float(config.sft.plain_share) < 1:
        raise ConfigError(f"stage {config.name!r}: sft.plain_share must be in [0, 1), got "
                          f"{config.sft.plain_share}")
    if kind == "reterm_sft":
        teacher_thoughts(config.teacher.thoughts)
    if kind == "reterm_sft" and config.teacher.kind not in ("embedded", "http"):
        raise ConfigError(f"stage {config.name!r}: teacher.kind = {config.teacher.kind!r}: "
                          "expected 'embedded' or 'http'")
    return config


def teacher_thoughts(kind: str) -> tuple[str, str, str]:
    """The embedded teacher's THOUGHT lines (inspect, repair, done) for `teacher.thoughts`."""

    if kind == "student":
        return (embedded.ACT_THOUGHT, embedded.ACT_THOUGHT, embedded.DONE_THOUGHT)
    if kind == "teacher":
        return EmbeddedTeacher.DEFAULT_THOUGHTS
    raise ConfigError(f"teacher.thoughts = {kind!r}: expected 'student' or 'teacher'")


# ----------------------------------------------------------------------------------------------
# The runtime: one model graph, sampler and compiled steps per (model, tokenizer) in a process,
# shared by the stages and the arms' evaluation (parameters are swapped in place).

class Actor:
    """The runtime's sampler (`actor.episode_sampler`: episode caches across turns, continuous
    batching, batch-invariant) and the policies over it; parameters are swapped in place.
    A policy's sampling seed is the `seed` it is asked for, nothing of the process's history, so an
    arm's evaluation samples the same in a resumed run or a lone re-evaluation."""

    def __init__(self, model, tokenizer, *, concurrency: int, max_output_tokens: int):
        self.model, self.tokenizer = model, tokenizer
        self.sampler = episode_sampler(model, tokenizer,
                                       concurrency=concurrency,
                                       max_new_tokens=max_output_tokens)

    def set_params(self, params) -> None:
        self.sampler.update_weights(assign_params(self.model, params))

    def policy(self, *, temperature: float, top_p: float, seed: int, name: str):
        return ModelPolicy(self.sampler, self.tokenizer, temperature=temperature, top_p=top_p,
                           seed=seed, name=name)


@dataclasses.dataclass
class Runtime:
    model_name: str
    tokenizer_spec: str
    system_prompt: str
    tokenizer: object
    fns: object
    actor: Actor
    steps: dict          # compiled update steps by their hyper-parameters


_RUNTIMES: dict = {}


def parent_manifest(run_dir, stage: str) -> dict:
    path = pathlib.Path(run_dir) / stage / "stage.json"
    if not path.exists():
        raise ConfigError(f"stage {stage!r} named as a parent has no manifest {path}")
    return json.loads(path.read_text())


def runtime(manifest: dict, *, concurrency: int, max_output_tokens: int) -> Runtime:
    """The model, tokenizer and system prompt a stage manifest names (`embedded.from_manifest`),
    built once per process."""
    from flax import nnx

    cfg = manifest.get("config") or {}
    try:
        model_config, tokenizer, system_prompt = embedded.from_manifest(manifest)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    key = (cfg["model"], cfg["tokenizer"], system_prompt, concurrency, max_output_tokens)
    if key not in _RUNTIMES:
        model = Decoder(model_config, rngs=nnx.Rngs(0))
        _RUNTIMES[key] = Runtime(cfg["model"], cfg["tokenizer"], system_prompt, tokenizer,
                                 nnx_model_fns(model),
                                 Actor(model, tokenizer, concurrency=concurrency,
                                       max_output_tokens=max_output_tokens), {})
    return _RUNTIMES[key]


def retained_step(run_dir, stage: str) -> int | None:
    """A stage's retained step (`summary.json`), else None (its latest checkpoint)."""
    path = pathlib.Path(run_dir) / stage / "summary.json"
    return json.loads(path.read_text()).get("retained_step") if path.exists() else None


def load_params(run_dir, stage: str, rt: Runtime, step: int | None = None):
    """The actor parameters of `stage` at `step` (default: its retained step, else latest)."""

    step = retained_step(run_dir, stage) if step is None else step
    with StageStore(run_dir, stage, read_only=True) as store:
        resolved = store.resolve_step(step)
        return store.restore_item("actor_params", rt.fns.actor_params, resolved)


@dataclasses.dataclass
class Opened:
    config: ml_collections.ConfigDict
    rt: Runtime
    state: object
    store: object
    stage_dir: pathlib.Path
    closed: bool = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.store.close()


def open_stage(config, run_dir, *, kind: str, optimizer_config) -> Opened:
    """The stage's state: resumed from its own checkpoints, else the parent's retained actor with
    a fresh optimizer (`tr.train.checkpoint.start_stage`); the manifest records the parent's
    model, tokenizer and system prompt."""

    parent = parent_manifest(run_dir, config.actor_from)
    rt = runtime(parent, concurrency=int(config.concurrency),
                 max_output_tokens=int(config.eval.max_output_tokens))
    optimizer = make_optimizer(optimizer_config)
    init = create_train_state(actor_params=rt.fns.actor_params, actor_optimizer=optimizer,
                              seed=int(config.seed))
    manifest_config = {**config.to_dict(), "model": rt.model_name, "tokenizer": rt.tokenizer_spec,
                       "system_prompt": rt.system_prompt}
    state, store = ckpt.start_stage(
        run_dir, config.name, kind=kind, target=abstract_state(init),
        actor=ckpt.Side(ckpt.StageRef(config.actor_from, retained_step(run_dir, config.actor_from)),
                        optimizer),
        config=manifest_config, seed=int(config.seed),
        store_options=ckpt.StoreOptions(save_every=int(config.checkpoint.save_every),
                                        async_save=False))
    return Opened(config, rt, state, store, pathlib.Path(run_dir) / config.name)


def rollout_config(config, policy, system_prompt: str, *, snapshot: bool = False):
    budgets = policy.budgets(int(config.eval.max_output_tokens), context=int(config.eval.context),
                             max_turns=int(config.eval.max_turns), summarise_at_tokens=None)
    return RolloutConfig(concurrency=int(config.concurrency), progress=False, batch_window_s=0.0,
                         budgets=budgets, snapshot_before_verify=snapshot,
                         system_prompt=system_prompt)


class ValLog:
    """`eval-val.jsonl`: one line per evaluated step (step, pass@1, episodes); the retained step
    is the best val Pass@1 (ties: the later step)."""

    def __init__(self, stage_dir: pathlib.Path):
        self.path = stage_dir / "eval-val.jsonl"

    def lines(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(x) for x in self.path.read_text().splitlines() if x.strip()]

    def evaluate(self, opened: Opened, step: int, params, tasks) -> None:
        if not tasks or any(line["step"] == step for line in self.lines()):
            return
        config, rt = opened.config, opened.rt
        rt.actor.set_params(params)
        policy = rt.actor.policy(temperature=float(config.eval.temperature),
                                 top_p=float(config.eval.top_p), seed=10_000 + int(config.seed),
                                 name=f"{config.name}-val")
        out = run_rollouts(group_specs(tasks, 1, seed=10_000 + int(config.seed), prefix="val"),
                           policy, policy.layout, rollout_config(config, policy, rt.system_prompt))
        counted = [r for r in out.records if r.status.counts]
        line = {"step": step, "pass@1": float(np.mean([bool(r.passed) for r in counted]))
                if counted else 0.0, "episodes": len(counted)}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
        print(f"[{config.name}] val at step {step}: pass@1 {line['pass@1']:.3f}", flush=True)

    def retained(self) -> dict | None:
        lines = self.lines()
        return max(lines, key=lambda x: (x["pass@1"], x["step"])) if lines else None


def _eval_due(step: int, total: int, every: int) -> bool:
    return step == total or (every > 0 and step % every == 0)


def _finish(opened: Opened, state, summary: dict, val: ValLog) -> dict:
    retained = val.retained()
    summary = {**summary, "val": val.lines(),
               "retained_step": None if retained is None else retained["step"],
               "retained_val_pass@1": None if retained is None else retained["pass@1"]}
    holder = dataclasses.make_dataclass("O", ["store", "stage_dir"])(opened.store, opened.stage_dir)
    opened.closed = True      # finish_stage closes the store
    return finish_stage(holder, state, summary)


def _truncate_metrics(path: pathlib.Path, step: int) -> None:
    """Drops the metrics lines past `step` (written by a run killed before its checkpoint)."""
    if path.exists():
        kept = [x for x in path.read_text().splitlines() if x.strip() and json.loads(x)["step"] <= step]
        path.write_text("".join(x + "\n" for x in kept))


def has_signal(group) -> bool:
    """Whether a group's counted rollouts differ in strict pass (else GRPO's advantage is 0 on
    every row: no gradient)."""
    return len({bool(r.passed) for r in group if r.status.counts}) > 1


def _read_lines(path: pathlib.Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _append(path: pathlib.Path, line: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def _optimizer_config(learning_rate: float):
    opt = default_config().actor.optimizer
    opt.learning_rate = float(learning_rate)
    return opt


# ----------------------------------------------------------------------------------------------
# Stage kind `reterm_sft`: the parent's failures, the teacher's recoveries, filters, SFT.

def collect_dataset(config, rt: Runtime, params, data_dir: pathlib.Path) -> dict:
    """The parent actor's failures on `train`, one teacher recovery each, four filters, JSONL
    shards under `data_dir` (+ `dataset.json`, the counts).  Read back when already written."""

    done = data_dir / "dataset.json"
    if done.exists():
        return json.loads(done.read_text())
    t0 = time.monotonic()
    layout = ChatLayout(rt.tokenizer)
    tasks = gym.split_tasks("train", int(config.tasks.train_count), seed=int(config.tasks.seed))
    by_id = {t.id: t for t in tasks}
    rt.actor.set_params(params)
    policy = rt.actor.policy(temperature=float(config.data.temperature), top_p=1.0,
                             seed=int(config.seed), name=f"{config.actor_from}")
    rc = rollout_config(config, policy, rt.system_prompt, snapshot=True)
    failures, collection = recovery.collect_failures(policy, tasks, int(config.data.attempts),
                                                     layout, rc, seed=int(config.seed))
    t = config.teacher
    try:
        if t.kind == "embedded":
            teacher = recovery.EmbeddedTeacher(tasks, thoughts=teacher_thoughts(t.thoughts))
        else:
            teacher = recovery.make_teacher("http", base_url=t.base_url, model=t.model)
        teacher_rc = dataclasses.replace(rc, budgets=Budgets(
            max_turns=int(t.max_turns), max_output_tokens=int(t.max_output_tokens),
            max_context_tokens=int(t.max_context_tokens)))
        recs = recovery.teacher_recoveries(teacher, failures, by_id, layout, teacher_rc,
                                           seed=int(config.seed),
                                           history_turns=int(config.recovery.history_turns))
    finally:
        recovery.discard_failures(failures)
    judge = None
    if t.judge_url:
        judge = recovery.HttpJudge(HttpPolicy(t.judge_url, t.judge_model, temperature=0.0,
                                              top_p=1.0, source="judge"))
    rows, counts = recovery.build_dataset(failures, recs, by_id, layout, judge=judge)
    shards = recovery.write_shards(rows, data_dir)
    counts = {**counts, "shards": len(shards), "collection": collection,
              "wall_s": time.monotonic() - t0}
    tmp = done.with_name(done.name + ".tmp")
    tmp.write_text(json.dumps(counts, indent=1, sort_keys=True))
    tmp.replace(done)
    return counts


def plain_count(n_recovery: int, share: float) -> int:
    """Plain rows to add to `n_recovery` recovery rows for a `share` of plain rows:
    round(share / (1 - share) * n_recovery)."""
    return int(round(share / (1.0 - share) * n_recovery)) if share > 0 else 0


def plain_rows(config, tokenizer, system_prompt: str, n: int) -> tuple[list[dict], dict]:
    """`n` scripted demos of plain `train` tasks for the recovery SFT, made by the Base's demo code
    (`tr.stages.base.make_demos`, real sandboxes): clean reference runs and, at the Base's
    `p_mistake`, a plausible mistake then the repair (the mistake masked); no truncated or runbook
    demos (they keep the Base low / serve RSR).  Fresh instances (seed `config.seed + 1`, not the
    Base's own demos).  Rows longer than `sft.length` are dropped (stats["dropped"])."""

    if n < 1:
        return [], {"episodes": 0, "sequences": 0, "dropped": 0}
    demo = base.defaults("default")
    demo.seed = int(config.seed) + 1
    demo.concurrency = int(config.concurrency)
    demo.system_prompt = system_prompt
    demo.demos.tasks = int(n)
    demo.demos.p_truncate, demo.demos.p_runbook = 0.0, 0.0
    demo.sft.length = int(config.sft.length)
    seqs, stats = base.make_demos(demo, tokenizer, ChatLayout(tokenizer))
    return seqs, stats


def _sft_step(rt: Runtime, learning_rate: float, micro_batch_rows: int = 0):
    key = ("sft", float(learning_rate), int(micro_batch_rows))
    if key not in rt.steps:
        train_cfg = default_config()
        train_cfg.actor.optimizer.learning_rate = float(learning_rate)
        train_cfg.micro_batch_rows = int(micro_batch_rows)
        rt.steps[key] = build_steps(train_cfg, actor_logprobs=rt.fns.actor_logprobs).sft
    return rt.steps[key]


def run_sft(stage_config, run_dir, **_) -> dict:
    """Stage kind `reterm_sft`: dataset from the parent's failures, then `sft.steps` SFT updates
    (loss on teacher tokens) on the recovery rows that fit `sft.length` mixed with
    `plain_count(rows, sft.plain_share)` plain demos (`plain_rows`); val Pass@1 at `eval.every`
    and the last step."""

    config = resolve(stage_config, "reterm_sft")
    done = finished_summary(run_dir, config.name)
    if done is not None:
        return done
    t0 = time.monotonic()
    opened = open_stage(config, run_dir, kind="reterm_sft",
                        optimizer_config=_optimizer_config(config.sft.learning_rate))
    try:
        rt, state, store = opened.rt, opened.state, opened.store
        start = int(state.step)
        data_dir = opened.stage_dir / "data"
        params0 = (state.actor_params if start == 0
                   else load_params(run_dir, config.actor_from, rt))
        dataset = collect_dataset(config, rt, params0, data_dir)
        seqs = [s for s in sft_sequences(read_shards(sorted(data_dir.glob("recoveries-*.jsonl"))))
                if len(s["tokens"]) <= config.sft.length]
        if not seqs:
            raise RuntimeError(f"stage {config.name!r}: no recovery row fits sft.length "
                               f"{config.sft.length} (dataset {dataset})")
        n_recovery = len(seqs)
        plain, plain_stats = plain_rows(config, rt.tokenizer, rt.system_prompt,
                                        plain_count(n_recovery, float(config.sft.plain_share)))
        seqs = seqs + plain
        val_tasks = gym.split_tasks("val", int(config.tasks.val_count) or None,
                                    seed=int(config.tasks.seed))
        val = ValLog(opened.stage_dir)
        metrics_path = opened.stage_dir / "metrics.jsonl"
        _truncate_metrics(metrics_path, start)
        board = scalars.ScalarWriter(opened.stage_dir, purge_step=start + 1)
        if start == 0 and config.eval.at_start:
            val.evaluate(opened, 0, state.actor_params, val_tasks)
        sft = _sft_step(rt, config.sft.learning_rate, int(config.sft.micro_batch_rows))
        data = iter(packed_batches(seqs, batch=int(config.sft.batch),
                                   length=int(config.sft.length), pad_id=rt.tokenizer.pad_id,
                                   seed=int(config.seed)))
        for _ in range(start):      # the data order of a resumed stage continues where it was
            next(data)
        total = int(config.sft.steps)
        for step in range(start + 1, total + 1):
            state, m = sft(state, next(data))
            line = {"step": step, "loss": float(m["actor/loss"])}
            _append(metrics_path, line)
            board.write([line])
            due = _eval_due(step, total, int(config.eval.every))
            store.save(state, force=due)
            if due:
                val.evaluate(opened, step, state.actor_params, val_tasks)
        board.close()
        losses = [json.loads(x)["loss"] for x in metrics_path.read_text().splitlines()]
        summary = {"kind": "reterm_sft", "rows": len(seqs), "recovery_rows": n_recovery,
                   "plain_rows": len(plain), "plain_share": float(config.sft.plain_share),
                   "plain_demos": plain_stats, "steps": total,
                   "loss_first": losses[0], "loss_last": losses[-1], "dataset": dataset,
                   "wall_s": time.monotonic() - t0}
        return _finish(opened, state, summary, val)
    finally:
        opened.close()


# ----------------------------------------------------------------------------------------------
# Stage kinds `grpo` and `reterm_grpo`.

def group_rows(groups, *, length: int, group_size: int, rows: int | None = None):
    """Rows of whole groups (one rollout per row, reward = strict pass on the last actor token) and
    `is_recovery`; a group with an uncounted episode, several windows, a row longer than `length`
    or other than `group_size` rollouts (one cancelled or lost) is dropped whole, so group `k`
    holds rows `[k·group_size, (k+1)·group_size)`, the rows `grpo_update` assigns it
    (`row // group_size`).  With `rows`, padded to that many rows (all masks false: no group,
    no loss; one compiled shape per stage).  Returns (batch | None, kept groups, dropped groups)."""

    seqs, is_rec, kept, dropped = [], [], [], 0
    for kind, recs in groups:
        if len(recs) != group_size:
            dropped += 1
            continue
        group = []
        for rec in sorted(recs, key=lambda r: r.rollout_index):
            s = episode_to_sequences(rec, float(bool(rec.passed))) if rec.status.counts else []
            if len(s) != 1 or len(s[0]["tokens"]) > length:
                group = None
                break
            group.append(s[0])
        if not group:
            dropped += 1
            continue
        seqs += group
        is_rec += [kind == "recovery"] * len(group)
        kept.append((kind, recs))
    if not seqs:
        return None, kept, dropped
    batch = pad_sequences(seqs, length)
    if rows is not None:
        if len(seqs) > rows:
            raise ValueError(f"group_rows: {len(seqs)} rows > rows={rows}")
        batch = {k: np.concatenate([v, np.zeros((rows - len(seqs),) + v.shape[1:], v.dtype)])
                 for k, v in batch.items()}
        is_rec += [False] * (rows - len(seqs))
    batch["is_recovery"] = np.asarray(is_rec, bool)
    return batch, kept, dropped


def _grpo_step(rt: Runtime, g):
    """The compiled GRPO step for these hyper-parameters (one compilation per process: the plain
    and ReTerm arms share it, same shapes)."""

    key = ("grpo", float(g.learning_rate), int(g.group_size), float(g.eps_low),
           float(g.eps_high), float(g.std_eps), str(g.group_weighting), int(g.micro_batch_rows),
           str(g.aggregation), float(g.aggregation_constant))
    if key not in rt.steps:
        train_cfg = default_config()
        train_cfg.micro_batch_rows = int(g.micro_batch_rows)
        train_cfg.actor.optimizer.learning_rate = float(g.learning_rate)
        train_cfg.grpo.group_size = int(g.group_size)
        train_cfg.grpo.eps_low = float(g.eps_low)    # not given by the paper: a config value
        train_cfg.grpo.eps_high = float(g.eps_high)
        train_cfg.grpo.std_eps = float(g.std_eps)
        train_cfg.grpo.group_weighting = str(g.group_weighting)
        train_cfg.grpo.aggregation = str(g.aggregation)
        train_cfg.grpo.aggregation_constant = float(g.aggregation_constant)
        rt.steps[key] = build_steps(train_cfg, actor_logprobs=rt.fns.actor_logprobs).grpo
    return rt.steps[key]


def run_grpo(stage_config, run_dir, *, kind: str = "grpo", **_) -> dict:
    """Stage kinds `grpo` (M_O + M_R original groups per update) and `reterm_grpo` (M_O original
    + up to M_R recovery groups from the queue, originals filling in while it is short: the same
    rollouts per update).  One checkpoint per update; val Pass@1 at `eval.every` and the last."""
    import jax

    config = resolve(stage_config, kind)
    done = finished_summary(run_dir, config.name)
    if done is not None:
        return done
    t0 = time.monotonic()
    g = config.grpo
    opened = open_stage(config, run_dir, kind=kind, optimizer_config=_optimizer_config(g.learning_rate))
    queue = (RecoveryQueue(int(config.queue.capacity), sampling=config.queue.sampling,
                           seed=int(config.seed)) if kind == "reterm_grpo" else None)
    try:
        rt, state, store = opened.rt, opened.state, opened.store
        start = int(state.step)
        grpo = _grpo_step(rt, g)
        tasks = gym.split_tasks("train", int(config.tasks.train_count), seed=int(config.tasks.seed))
        val_tasks = gym.split_tasks("val", int(config.tasks.val_count) or None,
                                    seed=int(config.tasks.seed))
        by_id = {t.id: t for t in tasks}
        val = ValLog(opened.stage_dir)
        metrics_path = opened.stage_dir / "metrics.jsonl"
        _truncate_metrics(metrics_path, start)
        board = scalars.ScalarWriter(opened.stage_dir, purge_step=start + 1)
        if start == 0 and config.eval.at_start:
            val.evaluate(opened, 0, state.actor_params, val_tasks)
        total, n_groups = int(g.updates), int(g.m_original) + int(g.m_recovery)
        earlier = _read_lines(metrics_path)       # a resumed stage keeps its counts
        sampled_recovery = sum(int(x.get("recovery_groups", 0)) for x in earlier)
        with_signal = sum(int(x.get("recovery_groups_with_signal", 0)) for x in earlier)
        for step in range(start + 1, total + 1):
            seed = int(config.seed) * 7919 + step
            rng = random.Random(seed)
            rt.actor.set_params(state.actor_params)
            policy = rt.actor.policy(temperature=1.0, top_p=1.0, seed=seed, name=config.name)
            rc = rollout_config(config, policy, rt.system_prompt, snapshot=queue is not None)
            parents = queue.pop(int(g.m_recovery)) if queue is not None else []
            picked = iteration_tasks(tasks, step - 1, n_groups, int(config.seed))
            picked = picked[:n_groups - len(parents)]
            specs = group_specs(picked, int(g.group_size), seed=step, prefix=f"{config.name}-{step}")
            for p in parents:
                specs += recovery_specs(by_id[p.task_id], p, int(g.group_size), seed=step,
                                        recovery_prompt=CONDENSED_PROMPT,
                                        history_turns=int(config.recovery.history_turns))
            out = run_rollouts(specs, policy, policy.layout, rc)
            grouped: dict[str, list] = {}
            for rec in out.records:
                grouped.setdefault(rec.group_id, []).append(rec)
            groups = [("recovery" if recs[0].kind == "recovery" else "original", recs)
                      for _, recs in sorted(grouped.items())]
            keep = set()
            if queue is not None:
                for group_kind, recs in groups:
                    if group_kind == "original":
                        f = failure_of_group(recs, rng)
                        if f is not None:
                            queue.push(f)
                            keep.add(f.episode_id)
                queue.release(parents)
            for rec in out.records + out.cancelled:
                if rec.episode_id not in keep:
                    discard_snapshot_ref(rec.snapshot_ref)
            batch, _, dropped = group_rows(groups, length=int(g.length),
                                           group_size=int(g.group_size),
                                           rows=n_groups * int(g.group_size))
            metrics = {}
            if batch is not None:
                state, m = grpo(state, batch)
                metrics = {k: float(v) for k, v in jax.device_get(m).items()}
            else:       # nothing to learn from: the step still counts (one checkpoint per update)
                state = state.replace(step=state.step + 1)

            signal = [has_signal(recs) for k, recs in groups if k == "recovery"]
            sampled_recovery += len(parents)
            with_signal += sum(signal)

            def mean_pass(which):
                xs = [bool(r.passed) for k, recs in groups if k == which for r in recs
                      if r.status.counts]
                return float(np.mean(xs)) if xs else None

            line = {
                "step": step, "update": step, "original_reward": mean_pass("original"),
                "recovery_reward": mean_pass("recovery"), "recovery_groups": len(parents),
                "recovery_groups_with_signal": sum(signal),
                "dropped_groups": dropped, "queue": len(queue) if queue is not None else 0,
                **({"queue_stats": queue.stats()} if queue is not None else {}), **metrics}
            _append(metrics_path, line)
            board.write([line])
            store.save(state, force=True)
            if _eval_due(step, total, int(config.eval.every)):
                val.evaluate(opened, step, state.actor_params, val_tasks)
        board.close()
        summary = {"kind": kind, "updates": total, "group_size": int(g.group_size),
                   "m_original": int(g.m_original), "m_recovery": int(g.m_recovery),
                   "group_weighting": g.group_weighting, "wall_s": time.monotonic() - t0}
        if queue is not None:
            summary["queue"] = queue.stats()
            summary["recovery_groups"] = {"sampled": sampled_recovery, "with_signal": with_signal}
        return _finish(opened, state, summary, val)
    finally:
        if queue is not None:
            queue.close()
        opened.close()


def run_reterm_grpo(stage_config, run_dir, **kw) -> dict:
    """Stage kind `reterm_grpo` (see :func:`run_grpo`)."""
    return run_grpo(stage_config, run_dir, kind="reterm_grpo", **kw)


def curve(run_dir, stage: str) -> list[dict]:
    """A GRPO stage's metrics lines (the reward curves of original and recovery groups)."""
    return _read_lines(pathlib.Path(run_dir) / stage / "metrics.jsonl")


# ----------------------------------------------------------------------------------------------
# The `reterm` job: the stages, then the arms on `test`.

def stage_entries(config) -> list[dict]:
    """The experiment as a list of pipeline stage entries (written to WORKDIR/stages.json)."""
    shared = {"seed": int(config.seed), "concurrency": int(config.concurrency),
              "tasks": {"train_count": int(config.data.train_tasks),
                        "val_count": int(config.eval.val_count), "seed": int(config.seed)},
              "eval": {"every": int(config.eval.val_every), "temperature": config.eval.temperature,
                       "top_p": config.eval.top_p, "max_turns": int(config.eval.max_turns),
                       "max_output_tokens": int(config.eval.max_output_tokens),
                       "context": int(config.eval.context)}}
    grpo = {**config.grpo.to_dict(), "length": int(config.sft.length)}
    grpo.pop("batch", None)
    recovery = {"history_turns": int(config.recovery.history_turns)}
    entries = [
        {"name": "base", "kind": "base", "variant": config.base.variant, "seed": int(config.seed),
         "concurrency": int(config.concurrency), **config.base.overrides.to_dict()},
        {**shared, "name": "sft", "kind": "reterm_sft", "actor_from": "base",
         "data": {"attempts": int(config.data.attempts)}, "teacher": config.teacher.to_dict(),
         "sft": config.sft.to_dict(), "recovery": recovery},
        {**shared, "name": "reterm_grpo", "kind": "reterm_grpo", "actor_from": "sft",
         "grpo": grpo, "queue": {"capacity": int(config.queue.capacity),
                                 "sampling": config.queue.sampling}, "recovery": recovery},
        {**shared, "name": "grpo", "kind": "grpo", "actor_from": "sft", "grpo": grpo},
    ]
    for capacity, sampling in (config.queue.sweep if config.variant == "queue" else ()):
        # beyond the paper: ReTerm-GRPO from the same SFT actor per (K, sampling)
        entries.append({**shared, "name": f"reterm_grpo-K{capacity}-{sampling}",
                        "kind": "reterm_grpo", "actor_from": "sft", "grpo": grpo,
                        "queue": {"capacity": int(capacity), "sampling": sampling},
                        "recovery": recovery})
    return entries


def evaluate_arm(rt: Runtime, params, name, config, test_tasks, heldout, by_id, workdir) -> dict:
    """Pass@1 on `test` (k = 1 per task), Recovery@k on the held-out failure states (each attempt
    sees the last `recovery.history_turns` turns of h_f, as in training), mean turns and
    generated tokens per episode."""

    rt.actor.set_params(params)
    ev = config.eval
    policy = rt.actor.policy(temperature=ev.temperature, top_p=ev.top_p, seed=config.seed, name=name)
    rc = rollout_config(config, policy, rt.system_prompt)
    out = run_rollouts(group_specs(test_tasks, 1, seed=config.seed, prefix=f"eval-{name}"),
                       policy, policy.layout, rc)
    counted = [r for r in out.records if r.status.counts]
    d = pathlib.Path(workdir) / "episodes"
    d.mkdir(parents=True, exist_ok=True)
    write_shard(out.records, d / f"test-{name}.jsonl")
    rec = recovery_at_k(policy, heldout, by_id, ev.k, policy.layout, rc, seed=config.seed,
                        history_turns=int(config.recovery.history_turns))
    write_shard(rec["records"], d / f"recovery-{name}.jsonl")
    return {"pass_at_1": float(np.mean([bool(r.passed) for r in counted])) if counted else 0.0,
            "passed": int(sum(bool(r.passed) for r in counted)),
            "episodes": len(counted), "recovery_at_k": rec["recovery_at_k"], "k": ev.k,
            **episode_costs(out.records),
            "recovery": {"by_category": rec["by_category"], "mean_turns": rec["mean_turns"],
                         "mean_tokens": rec["mean_tokens"], "states": rec["states"],
                         "recovered": int(round(rec["recovery_at_k"] * rec["states"]))}}


def check_config(config) -> None:
    """The value checks of a ReTerm stage config (before anything runs); ConfigError names the field."""
    for path in ("data.attempts", "data.train_tasks", "grpo.group_size", "grpo.updates",
                 "grpo.m_original", "queue.capacity", "eval.k", "eval.test_count", "sft.steps"):
        section, field = path.split(".")
        if int(config[section][field]) < 1:
            raise ConfigError(f"config.{path} must be >= 1, got {config[section][field]}")
    if config.grpo.m_recovery < 0:
        raise ConfigError(f"config.grpo.m_recovery must be >= 0, got {config.grpo.m_recovery}")
    if config.grpo.group_weighting not in ("equal", "literal"):
        raise ConfigError(f"config.grpo.group_weighting = {config.grpo.group_weighting!r}: "
                          "expected 'equal' or 'literal'")
    if config.queue.sampling not in ("front", "uniform"):
        raise ConfigError(f"config.queue.sampling = {config.queue.sampling!r}: expected 'front' "
                          "or 'uniform'")
    for i, entry in enumerate(config.queue.get("sweep", ())):
        if (len(entry) != 2 or int(entry[0]) < 1 or entry[1] not in ("front", "uniform")):
            raise ConfigError(f"config.queue.sweep[{i}] = {tuple(entry)!r}: expected (capacity >= 1, "
                              "'front' | 'uniform')")
    if config.teacher.kind not in ("embedded", "http"):
        raise ConfigError(f"config.teacher.kind = {config.teacher.kind!r}: expected 'embedded' "
                          "or 'http'")
    if int(config.recovery.history_turns) < 0:
        raise ConfigError(f"config.recovery.history_turns must be >= 0 (0 = the whole history), "
                          f"got {config.recovery.history_turns}")
    if not 0 <= float(config.sft.plain_share) < 1:
        raise ConfigError(f"config.sft.plain_share must be in [0, 1), got {config.sft.plain_share}")


def _say(text: str) -> None:
    print(f"[reterm] {text}", flush=True)


def run(config, workdir):
    check_config(config)
    if config.variant == "paper":
        return validate_paper(config, workdir)
    t_start = time.monotonic()
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    entries = stage_entries(config)
    (workdir / "stages.json").write_text(json.dumps(entries, indent=1, sort_keys=True))
    # Each arm is evaluated as soon as its stage is finished (arms.json grows arm by arm), on
    # held-out failure states collected once from the Base on test, fixed for every arm.

    use_compilation_cache(workdir / "jax-cache")
    summaries, results, heldout, t_eval, compile_s = {}, {}, [], 0.0, {}
    try:
        for i, entry in enumerate(entries):
            parent = entry.get("actor_from")
            if parent and parent not in summaries:
                raise ConfigError(f"stages[{i}] ({entry['name']}): actor_from={parent!r} is not "
                                  "an earlier stage")
            t0, clock = time.monotonic(), CompileClock()
            with progress.stage(i, len(entries), entry["name"], entry["kind"]):
                summaries[entry["name"]] = stage_kind(entry["kind"])(dict(entry), workdir)
            compile_s[entry["name"]] = clock.read()
            _say(f"stage {entry['name']} ({entry['kind']}) done in {time.monotonic() - t0:.0f}s")
            t0, clock = time.monotonic(), CompileClock()
            if entry["name"] == "base":
                rt = runtime(parent_manifest(workdir, "base"), concurrency=int(config.concurrency),
                             max_output_tokens=int(config.eval.max_output_tokens))
                test_tasks = gym.split_tasks("test", config.eval.test_count, seed=config.seed)
                by_id = {t.id: t for t in test_tasks}
                rt.actor.set_params(load_params(workdir, "base", rt))
                policy = rt.actor.policy(temperature=config.eval.temperature,
                                         top_p=config.eval.top_p, seed=config.seed + 1, name="base")
                heldout, held_stats = recovery.collect_failures(
                    policy, test_tasks, 1, policy.layout,
                    rollout_config(config, policy, rt.system_prompt, snapshot=True),
                    seed=config.seed + 1, prefix="heldout")
                heldout, rest = recovery.spread_by_family(heldout, int(config.eval.heldout_states))
                recovery.discard_failures(rest)
            results[entry["name"]] = evaluate_arm(rt, load_params(workdir, entry["name"], rt),
                                                  entry["name"], config, test_tasks, heldout, by_id,
                                                  workdir)
            t_eval += time.monotonic() - t0
            compile_s[f"eval_{entry['name']}"] = clock.read()
            (workdir / "arms.json").write_text(json.dumps(results, indent=1, sort_keys=True))
            r = results[entry["name"]]
            _say(f"arm {entry['name']}: Pass@1 {r['pass_at_1']:.3f} ({r['passed']}/"
                 f"{r['episodes']}), Recovery@{r['k']} {r['recovery_at_k']:.3f} "
                 f"({r['recovery']['recovered']}/{r['recovery']['states']})")
    finally:
        recovery.discard_failures(heldout)
    t_stages = time.monotonic() - t_start - t_eval
    stage_of = {"base": "base", "sft": "sft", "grpo": "grpo", "reterm_grpo": "reterm_grpo"}
    arms = {a: results[stage_of[a]] for a in ARMS}
    sweep = []
    for e in entries[4:]:
        ev, s = results[e["name"]], summaries[e["name"]]
        sweep.append({"capacity": e["queue"]["capacity"], "sampling": e["queue"]["sampling"],
                      "pass_at_1": ev["pass_at_1"], "recovery_at_k": ev["recovery_at_k"],
                      "mean_turns": ev["mean_turns"], "queue": s["queue"],
                      "retained_step": s["retained_step"], "wall_s": s["wall_s"]})

    dataset = summaries["sft"]["dataset"]
    reterm_summary = summaries["reterm_grpo"]
    report = {"experiment": "reterm", "variant": config.variant, "seed": config.seed,
              "wall_s": time.monotonic() - t_start, "arms": arms,
              "machine": machine_info(),
              "dataset": {k: dataset[k] for k in ("failures", "recoveries", "kept", "rejected_by",
                                                  "flagged", "shards", "collection")},
              "queue": {"capacity": config.queue.capacity, "sampling": config.queue.sampling,
                        "inserted": reterm_summary["queue"]["inserted"],
                        "evicted": reterm_summary["queue"]["evicted"],
                        "sampled": reterm_summary["queue"]["sampled"]},
              "recovery_groups": reterm_summary["recovery_groups"],
              "heldout": {"states": len(heldout), **held_stats},
              "queue_sweep": sweep,
              "curves": {"grpo": curve(workdir, "grpo"), "reterm_grpo": curve(workdir, "reterm_grpo")},
              "stages": summaries,
              "compile_s": compile_s,
              "timings": {"stages_s": t_stages, "eval_s": t_eval,
                          **{f"{n}_s": s.get("wall_s") for n, s in summaries.items()}},
              "config": {"group_weighting": config.grpo.group_weighting,
                         "eps_low": config.grpo.eps_low, "eps_high": config.grpo.eps_high,
                         "teacher": config.teacher.kind, "stages": [e["name"] for e in entries],
                         "history_turns": int(config.recovery.history_turns),
                         "plain_share": float(config.sft.plain_share)}}
    (workdir / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True, default=str))
    (workdir / "report.md").write_text(report_md(report))
    plot_curves(report, workdir / "reward_curves.png")
    print(report_md(report), flush=True)
    return report


def report_md(report: dict) -> str:
    lines = [f"# ReTerm ({report['variant']}, seed {report['seed']}, wall {report['wall_s']:.0f} s)",
             "", "| arm | Pass@1 (test) | episodes | Recovery@k | k | mean turns | mean tokens |",
             "|---|---|---|---|---|---|---|"]
    for a, v in report["arms"].items():
        lines.append(f"| {a} | {v['pass_at_1']:.3f} | {v['episodes']} | {v['recovery_at_k']:.3f} "
                     f"| {v['k']} | {v['mean_turns']:.2f} | {v['mean_tokens']:.1f} |")
    d, sft = report["dataset"], report["stages"]["sft"]
    turns = report["config"]["history_turns"]
    seen = "all of h_f" if not turns else f"the task and the last {turns} turn(s) of h_f"
    lines += ["", f"Dataset: {d['failures']} failures, {d['recoveries']} teacher recoveries, "
              f"{d['kept']} kept; rejected by " + ", ".join(f"{k} {v}" for k, v in
                                                           d["rejected_by"].items()) + ".",
              f"Recoveries see {seen}; SFT rows: {sft.get('recovery_rows')} recovery + "
              f"{sft.get('plain_rows')} plain (sft.plain_share {report['config']['plain_share']}).",
              f"Queue: capacity {report['queue']['capacity']} ({report['queue']['sampling']}), "
              f"{report['queue']['inserted']} inserted, {report['queue']['evicted']} evicted; "
              f"{report['recovery_groups']['sampled']} recovery groups trained on, "
              f"{report['recovery_groups']['with_signal']} with reward variance (a gradient).",
              "", "Recovery rate by rule-based error category of the held-out failure:", "",
              "| arm | " + " | ".join(
                  sorted({c for v in report["arms"].values() for c in v["recovery"]["by_category"]}))
              + " |"]
    cats = sorted({c for v in report["arms"].values() for c in v["recovery"]["by_category"]})
    lines.append("|---" * (len(cats) + 1) + "|")
    for a, v in report["arms"].items():
        bc = v["recovery"]["by_category"]
        lines.append(f"| {a} | " + " | ".join(
            f"{bc[c]['recovered']}/{bc[c]['states']}" if c in bc else "-" for c in cats) + " |")
    if report.get("queue_sweep"):
        lines += ["", "Queue sweep (ReTerm-GRPO from the same SFT actor):", "",
                  "| K | sampling | Pass@1 | Recovery@k | inserted | evicted |", "|---|---|---|---|---|---|"]
        for e in report["queue_sweep"]:
            lines.append(f"| {e['capacity']} | {e['sampling']} | {e['pass_at_1']:.3f} | "
                         f"{e['recovery_at_k']:.3f} | {e['queue']['inserted']} | "
                         f"{e['queue']['evicted']} |")
    return "\n".join(lines) + "\n"


def plot_curves(report: dict, path) -> None:
    """Figure 6's analogue: mean reward of original and recovery groups per update."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for arm, curve in report["curves"].items():
        for key, style in (("original_reward", "-"), ("recovery_reward", "--")):
            xs = [c["update"] for c in curve if c[key] is not None]
            ys = [c[key] for c in curve if c[key] is not None]
            if xs:
                ax.plot(xs, ys, style, marker="o", label=f"{arm} {key.split('_')[0]}")
    ax.set_xlabel("update")
    ax.set_ylabel("mean strict pass")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def validate_paper(config, workdir) -> dict:
    """The `paper` variant loads and validates only: the named model exists and the batch is
    (M_O + M_R) x G."""

    model = get_model_config(config.model)
    rows = (config.grpo.m_original + config.grpo.m_recovery) * config.grpo.group_size
    if rows != config.grpo.batch:
        raise ConfigError(f"config.grpo.batch = {config.grpo.batch} != (m_original + m_recovery) "
                          f"x group_size = {rows}")
    out = {"experiment": "reterm", "variant": "paper", "validated": True,
           "model": config.model, "params_d_model": model.d_model, "grpo_batch": rows}
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(workdir) / "report.json").write_text(json.dumps(out, indent=2))
    return out
