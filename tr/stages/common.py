"""What every training stage needs: models from the config, task splits, rollouts of the current
actor (kept as record shards), rewards, training arrays, `val` evaluation, metrics lines.

Each piece is one named function or one small class, so a stage kind (`warmup.py`, `rpr.py`)
reads as set-up, then `tr.stages.loop.train_loop`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import sys
import time
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np

from tr.agent import evaluation
from tr.agent.records import EpisodeRecord, episode_to_sequences, read_shard, write_shard
from tr.agent.rollout import RolloutConfig, group_specs, run_rollouts
from tr.models import embedded
from tr.rewards import registry as reward_registry
from tr.stages import progress, scalars
from tr.stages.registry import ConfigError  # noqa: F401  (re-exported for the stage kinds)

SPLITS = ("train", "val", "test")


# ------------------------------------------------------------------------------------------------
# Config


def stage_defaults() -> ml_collections.ConfigDict:
    """The fields a training stage's config has (a stage entry of `config.stages` overrides them).

    Sizes are the papers' where one is given; tests and CPU runs shrink them.
    """
    from tr.train.updates import default_config  # pylint: disable=g-import-not-at-top

    return ml_collections.ConfigDict({
        "name": "",
        "kind": "",
        "actor_from": "",          # stage name (its retained step), "" = none
        "critic_from": "",         # stage name, "fresh", "" = none
        # A fresh critic's backbone: "random" (initialised) or "actor" (the actor parent's
        # retained weights, the value head zero: the usual start of an LLM critic)
        "critic_init": "random",
        "seed": 0,
        # "" = from the actor parent's manifest (`inherit_from_parent`), else the fallback below
        "model": {"name": "", "overrides": {}},   # fallback "tiny"
        "tokenizer": "",                          # 'byte' or a tokenizer.json path; fallback 'byte'
        "system_prompt": "",                      # fallback: the harness's SYSTEM_PROMPT
        "tasks": {"source": "suite", "suite": "", "ids": [], "count": 0, "seed": 0},
        "train": default_config(),
        "rollout": {
            "backend": "local",
            "concurrency": 4,
            "tasks_per_iteration": 8,   # distinct train tasks per rollout batch
            "group_size": 1,            # rollouts per task
            "oversample": 0,            # N' − N extra launched rollouts (keep-first N)
            "max_output_tokens": 64,
            "max_turns": 4,
            "temperature": 1.0,         # training rollouts: SPEC §2
            "top_p": 1.0,
            # active summarisation: 0 = off (as Base's evaluation), -1 = the policy's threshold
            # (fits the sampler's buckets: 256 tokens at a 1,024-token context), > 0 = this many
            "summarise_at_tokens": 0,
            # an episode's whole context (prompt + output tokens): 0 = the sampler's bucket rule
            # (512 + 64 at the gym model's 1,024), > 0 = this many, up to the model's max_seq_len
            # (`ModelPolicy.budgets(context=)`)
            "context": 0,
        },
        # pack_multiple: 0 = one context window per row (padded to `length`); m > 0 = windows
        # packed several to a row into the fewest rows, a multiple of m, that hold them
        # (`training_arrays`); m must divide `rows` and be a multiple of train.ppo.mini_batches
        "arrays": {"rows": 16, "length": 1024, "pack_multiple": 0},
        # wall_time_s: an evaluation episode's wall-clock cap, far above need, so a loaded machine
        # never changes an evaluation (turns and tokens end the episodes; 0 = the task's own)
        "eval": {"every": 1, "k": 1, "count": 0, "temperature": 0.6, "top_p": 0.95,
                 "at_start": True, "wall_time_s": 1800.0},
        "checkpoint": {"save_every": 1, "async_save": False},
    })


def resolve_stage_config(entry, defaults: ml_collections.ConfigDict | None = None
                         ) -> ml_collections.ConfigDict:
    """`defaults` (a stage kind's, else `stage_defaults()`) updated by `entry` (a ConfigDict or
    dict); an unknown field raises `ConfigError` naming it."""
    config = stage_defaults() if defaults is None else defaults
    entry = entry.to_dict() if hasattr(entry, "to_dict") else dict(entry)
    try:
        config.update_from_flattened_dict(_flatten(entry))
    except (KeyError, AttributeError) as error:
        raise ConfigError(f"stage {entry.get('name', '?')!r}: unknown config field {error}") from None
    if not config.name:
        raise ConfigError(f"a stage entry has no 'name': {entry}")
    return config


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in ("overrides",):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


# ------------------------------------------------------------------------------------------------
# Models


@dataclasses.dataclass
class Models:
    """The actor and critic graphs of a stage, their pure functions and initial parameters, and the
    tokenizer and system prompt its rollouts use."""

    config: Any
    tokenizer: Any
    actor: Any
    critic: Any
    fns: Any
    system_prompt: str = ""


FALLBACK_MODEL = "tiny"
FALLBACK_TOKENIZER = "byte"


def parent_model(manifest: dict) -> tuple[dict, str, str]:
    """`({name, overrides}, tokenizer spec, system prompt)` a stage manifest records.

    A stage of the loop records `config.model` as `{name, overrides}`; the gym's Base
    (`tr.stages.base`, `tr.models.embedded.manifest_config`) as the size's name. A manifest without
    a tokenizer or system prompt is an older byte-tokenizer stage: the fallbacks.
    """
    from tr.agent.harness import SYSTEM_PROMPT  # pylint: disable=g-import-not-at-top

    config = manifest.get("config") or {}
    model = config.get("model")
    if isinstance(model, str) and model:
        model = {"name": model, "overrides": {}}
    elif isinstance(model, dict) and model.get("name"):
        model = {"name": model["name"], "overrides": dict(model.get("overrides") or {})}
    else:
        raise ConfigError(f"stage manifest of {manifest.get('stage')!r}: config.model = {model!r} "
                          "names no model size; cannot rebuild its model")
    return (model, config.get("tokenizer") or FALLBACK_TOKENIZER,
            config.get("system_prompt") or SYSTEM_PROMPT)


def inherit_from_parent(config, run_dir) -> ml_collections.ConfigDict:
    """Fills the stage config's unset `model`, `tokenizer`, `system_prompt` (in place) from the
    manifest of its `actor_from` stage, else with the fallbacks (`tiny`, `byte`, the harness's
    prompt), so the stage's own manifest records what it runs with and its children can rebuild it.

    A `critic_from` stage whose model or tokenizer differs from the result raises `ConfigError`.
    """
    from tr.agent.harness import SYSTEM_PROMPT  # pylint: disable=g-import-not-at-top

    def manifest_of(stage):
        path = pathlib.Path(run_dir) / stage / "stage.json"
        if not path.exists():
            raise ConfigError(f"stage {config.name!r}: parent stage {stage!r} has no manifest {path}")
        return json.loads(path.read_text())

    if config.actor_from:
        model, tokenizer, prompt = parent_model(manifest_of(config.actor_from))
    else:
        model, tokenizer, prompt = ({"name": FALLBACK_MODEL, "overrides": {}}, FALLBACK_TOKENIZER,
                                    SYSTEM_PROMPT)
    if not config.model.name:
        config.model.name = model["name"]
        if not config.model.overrides:
            config.model.overrides = model["overrides"]
    config.tokenizer = config.tokenizer or tokenizer
    config.system_prompt = config.system_prompt or prompt
    if config.critic_from and config.critic_from not in ("fresh", config.actor_from):
        critic_model, critic_tokenizer, _ = parent_model(manifest_of(config.critic_from))
        mine = {"name": config.model.name, "overrides": dict(config.model.overrides)}
        # canonical: a stage run before the embedded assets moved recorded tr/stages/<file>
        if (critic_model, embedded.canonical(critic_tokenizer)) != (
                mine, embedded.canonical(config.tokenizer)):
            raise ConfigError(f"stage {config.name!r}: critic_from={config.critic_from!r} has model "
                              f"{critic_model} / tokenizer {critic_tokenizer!r}, the stage "
                              f"{mine} / {config.tokenizer!r}")
    return config


def build_models(model_config, *, seed: int = 0, chunk_size: int = 1024,
                 tokenizer: str = FALLBACK_TOKENIZER, system_prompt: str = "",
                 policy_temperature: float = 1.0) -> Models:
    """The named size with overrides, and the tokenizer `tokenizer` names ('byte' or a
    tokenizer.json path, repo-relative allowed); both recorded in the stage manifest."""
    from flax import nnx  # pylint: disable=g-import-not-at-top

    from tr.agent.harness import SYSTEM_PROMPT  # pylint: disable=g-import-not-at-top
    from tr.models.config import get_model_config  # pylint: disable=g-import-not-at-top
    from tr.models.critic import CriticModel  # pylint: disable=g-import-not-at-top
    from tr.models.decoder import Decoder  # pylint: disable=g-import-not-at-top
    from tr.models.tokenizer import ByteTokenizer  # pylint: disable=g-import-not-at-top
    from tr.train.model_fns import nnx_model_fns  # pylint: disable=g-import-not-at-top

    overrides = dict(model_config.overrides) if "overrides" in model_config else {}
    try:
        config = get_model_config(model_config.name or FALLBACK_MODEL, **overrides)
    except ValueError as error:
        raise ConfigError(f"config.model: {error}") from None
    if tokenizer in ("", "byte"):
        tok = ByteTokenizer(vocab_size=config.vocab_size)
    else:
        try:
            tok = embedded.load_tokenizer(tokenizer)
        except Exception as error:  # pylint: disable=broad-except
            raise ConfigError(f"config.tokenizer = {tokenizer!r}: {error}") from None
        if tok.vocab_size > config.vocab_size:
            raise ConfigError(f"config.tokenizer = {tokenizer!r} has {tok.vocab_size} ids > "
                              f"model {model_config.name!r} vocab_size {config.vocab_size}")
    actor = Decoder(config, rngs=nnx.Rngs(seed))
    critic = CriticModel(config, rngs=nnx.Rngs(seed + 1))
    fns = nnx_model_fns(actor, critic, chunk_size=min(chunk_size, config.max_seq_len),
                        temperature=policy_temperature)
    return Models(config, tok, actor, critic, fns, system_prompt or SYSTEM_PROMPT)


def check_on_policy(config) -> None:
    """The rollouts sample from the policy the updates train: `rollout.temperature` equals
    `train.policy_temperature` τ (the updates' log-probs are log softmax(logits / τ)), else PPO's
    ratio against the behaviour log-probs compares two different policies; ConfigError names both."""
    tau = float(config.train.get("policy_temperature", 1.0))
    if not tau > 0:
        raise ConfigError(f"stage {config.name!r}: train.policy_temperature must be > 0, got {tau}")
    if abs(float(config.rollout.temperature) - tau) > 1e-6:
        raise ConfigError(f"stage {config.name!r}: rollout.temperature = "
                          f"{config.rollout.temperature} but train.policy_temperature = {tau}: the "
                          "rollouts must sample from the policy the updates train (set both)")


def stage_models(config, *, seed: int | None = None, chunk_size: int | None = None) -> Models:
    """`build_models` from a stage config (after `inherit_from_parent`)."""
    return build_models(config.model, seed=int(config.seed if seed is None else seed),
                        chunk_size=int(chunk_size or config.train.logprob_chunk_size),
                        tokenizer=config.tokenizer, system_prompt=config.system_prompt,
                        policy_temperature=float(config.train.get("policy_temperature", 1.0)))


# ------------------------------------------------------------------------------------------------
# Tasks


def split_of(task_id: str) -> str:
    """A built-in-suite task's split: sha1 of its id, 3/5 train, 1/5 val, 1/5 test (stable)."""
    bucket = int(hashlib.sha1(task_id.encode()).hexdigest(), 16) % 5
    return "train" if bucket < 3 else ("val" if bucket == 3 else "test")


def stage_tasks(tasks_config, split: str) -> list:
    """The tasks of `split`: the gym's split (`source='gym'`) or the built-in suite's hash split."""
    if split not in SPLITS:
        raise ConfigError(f"split {split!r}: expected one of {SPLITS}")
    count = int(tasks_config.count) or None
    if tasks_config.source == "gym":
        try:
            from tr.envs import gym  # pylint: disable=g-import-not-at-top
        except ImportError:
            raise ConfigError("config.tasks.source = 'gym' but tr.envs.gym is not installed "
                              "in this checkout") from None
        return list(gym.split_tasks(split, count, seed=int(tasks_config.seed)))
    if tasks_config.source != "suite":
        raise ConfigError(f"config.tasks.source = {tasks_config.source!r}: expected 'suite' or 'gym'")
    from tr.envs.tasks import TaskError, load_suite  # pylint: disable=g-import-not-at-top

    try:
        tasks = load_suite(tasks_config.suite or None)
    except TaskError as error:
        raise ConfigError(f"config.tasks.suite = {tasks_config.suite!r}: {error}") from None
    if tasks_config.ids:
        unknown = sorted(set(tasks_config.ids) - {t.id for t in tasks})
        if unknown:
            raise ConfigError(f"config.tasks.ids names unknown task id(s) {unknown}")
        tasks = [t for t in tasks if t.id in set(tasks_config.ids)]
    tasks = [t for t in tasks if split_of(t.id) == split]
    return tasks[:count] if count else tasks


def iteration_tasks(tasks: Sequence, iteration: int, per_iteration: int, seed: int) -> list:
    """The tasks of rollout batch `iteration`: consecutive slices of per-pass permutations of
    `tasks` (pass `p` seeded `(seed, p)`), so every task is used once per pass."""
    if not tasks:
        raise ConfigError("no tasks in the train split")
    n = len(tasks)
    out = []
    start = iteration * per_iteration
    for position in range(start, start + per_iteration):
        epoch, index = divmod(position, n)
        order = np.random.default_rng([seed, epoch]).permutation(n)
        out.append(tasks[int(order[index])])
    return out


# ------------------------------------------------------------------------------------------------
# Rollouts


MIN_SLOTS = 16      # decode rows at least: fixed, so the sampler's shapes do not follow concurrency


def episode_sampler(model, tokenizer, *, concurrency: int, max_new_tokens: int):
    """The stages' sampler: an `EpisodeSampler` (episode KV caches across turns, continuous
    batching) with max(`MIN_SLOTS`, `concurrency`) decode rows, the model's whole context as each
    row's cache and
    batch-invariant prefill, so a request's tokens and log-probs depend only on the parameters,
    its prompt and its key (seed, episode id, turn): rollouts and evaluations are the same at any
    concurrency up to `MIN_SLOTS` and any timing of the sandboxes, and compiles do not follow the
    row count. Above `MIN_SLOTS` the row count follows the concurrency, and with it the float
    rounding of the decode (log-probs ~1e-6 apart at 32 rows; `tr.sampling.slots`)."""
    from tr.sampling.slots import EpisodeSampler  # pylint: disable=g-import-not-at-top

    cache_len = model.config.max_seq_len
    return EpisodeSampler(model, tokenizer, slots=max(MIN_SLOTS, int(concurrency)),
                          cache_len=cache_len,
                          min_capacity=cache_len, max_new_tokens=max_new_tokens,
                          batch_invariant=True)


class Actor:
    """The sampler over the current actor parameters: rollouts (kept as shards) and evaluation.
    A context manager: `close()` stops the sampler's engine thread."""

    def __init__(self, models: Models, rollout_config, eval_config=None):
        self.models = models
        self.config = rollout_config
        self._params, self._params_hash = None, None
        caps = [int(rollout_config.max_output_tokens)]
        if eval_config is not None and "max_output_tokens" in eval_config:
            caps.append(int(eval_config.max_output_tokens))
        self.sampler = episode_sampler(models.actor, models.tokenizer,
                                       concurrency=int(rollout_config.concurrency),
                                       max_new_tokens=max(caps))

    def sync(self, actor_params) -> None:
        """The sampler uses `actor_params` from now on (`EpisodeSampler.update_weights`: no
        recompile, every cached episode dropped)."""
        self.sampler.update_weights(actor_params)
        self._params, self._params_hash = actor_params, None

    def evaluation_key(self, tasks: Sequence, eval_config, *, seed: int) -> str:
        """sha256 of everything an evaluation (`evaluate_split`) is a function of: the synced
        parameters, the tasks, the seed, the evaluation's sampling and the rollout budgets (the
        sampler is batch-invariant, so concurrency and timing do not enter)."""
        from tr.train.checkpoint import tree_hash  # pylint: disable=g-import-not-at-top

        if self._params_hash is None:
            self._params_hash = tree_hash(self._params)
        cfg = self.config
        what = {"params": self._params_hash, "tasks": [t.id for t in tasks], "seed": int(seed),
                "k": int(eval_config.k), "temperature": float(eval_config.temperature),
                "top_p": float(eval_config.top_p),
                "wall_time_s": float(eval_config.get("wall_time_s", 0) or 0),
                "budgets": [int(cfg.max_output_tokens), int(cfg.max_turns),
                            int(cfg.get("context", 0)), int(cfg.get("summarise_at_tokens", 0))],
                "sampler_max_new_tokens": int(self.sampler.max_new_tokens),
                "model": self.models.config.name, "system_prompt": self.models.system_prompt,
                "backend": str(cfg.backend)}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    def close(self) -> None:
        self.sampler.close()

    def __enter__(self) -> "Actor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _policy(self, seed: int, temperature: float, top_p: float):
        from tr.agent.policies import ModelPolicy  # pylint: disable=g-import-not-at-top

        return ModelPolicy(self.sampler, self.models.tokenizer, temperature=temperature,
                           top_p=top_p, seed=seed, name=f"model:{self.models.config.name}")

    def rollouts(self, tasks: Sequence, *, seed: int, group_size: int = 1,
                 keep_first: int | None = None, temperature: float | None = None,
                 top_p: float | None = None, prefix: str = "ep",
                 wall_time_s: float | None = None) -> tuple[list[EpisodeRecord], dict]:
        """`group_size` rollouts of each task (specs seeded by `seed`), the first `keep_first` to
        finish kept (over-sampling). The policy's sampling seed is `seed` too, so without
        over-sampling one call is a pure function of the parameters and `seed` at any
        concurrency (`episode_sampler`)."""
        cfg = self.config
        policy = self._policy(seed, cfg.temperature if temperature is None else temperature,
                              cfg.top_p if top_p is None else top_p)
        summarise = int(cfg.get("summarise_at_tokens", 0))
        extra = {} if summarise < 0 else {"summarise_at_tokens": summarise or None}
        if wall_time_s:      # else the task's own agent timeout
            extra["wall_time_s"] = float(wall_time_s)
        budgets = policy.budgets(int(cfg.max_output_tokens), max_turns=int(cfg.max_turns),
                                 context=int(cfg.get("context", 0)), **extra)
        specs = group_specs(tasks, group_size, seed=seed, prefix=prefix)
        out = run_rollouts(specs, policy, policy.layout,
                           RolloutConfig(backend=cfg.backend, concurrency=int(cfg.concurrency),
                                         budgets=budgets, progress=False,
                                         system_prompt=self.models.system_prompt),
                           keep_first=keep_first)
        stats = {"launched": len(specs), "kept": len(out.records), "cancelled": len(out.cancelled),
                 "rollout_s": out.wall_s, "generation_s": out.generation_s}
        return sorted(out.records, key=lambda r: r.episode_id), stats


def cached_rollouts(path: pathlib.Path, collect) -> tuple[list[EpisodeRecord], dict]:
    """The records of `path` if a previous run wrote them, else `collect()` written there first
    (atomically, its stats beside it in `<name>.stats.json`): a resumed stage trains on exactly
    the data it had generated."""
    stats_path = path.with_suffix(".stats.json")
    if path.exists():
        stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
        return read_shard(path), {**stats, "cached": True}
    records, stats = collect()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = stats_path.with_name(stats_path.name + ".tmp")
    tmp.write_text(json.dumps(stats, sort_keys=True))
    tmp.replace(stats_path)           # the stats first: the shard marks the batch complete
    write_shard(records, path)
    return records, {**stats, "cached": False}


# ------------------------------------------------------------------------------------------------
# Rewards


def trajectory_row(record: EpisodeRecord) -> dict:
    """`{family, matched, executed, strict_pass, turns}` of a record (the profiling columns)."""
    return {"family": record.family or "unknown", "matched": float(record.matched or 0.0),
            "executed": int(record.executed or 0), "strict_pass": bool(record.passed),
            "turns": record.num_turns}


def profile_scales(records: Sequence[EpisodeRecord], path: pathlib.Path, *,
                   quantile: float = 0.9, failure_threshold: float = 1.0) -> dict:
    """The family scale table of `records` (SPEC §5, recalibrated), written to `path`; read back
    unchanged when `path` exists (scales are frozen within a stage, also across a resume)."""
    from tr.rewards import profile  # pylint: disable=g-import-not-at-top

    if path.exists():
        return profile.load_scale_table(path)
    rows = [trajectory_row(r) for r in records if r.status.counts]
    if not rows:
        raise ConfigError(f"{path}: no counted profiling rollouts to build a scale table from")
    table = profile.build_scale_table(rows, quantile=quantile, failure_threshold=failure_threshold)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(profile.dumps_scale_table(table))
    tmp.replace(path)
    return table


def episode_rewards(records: Sequence[EpisodeRecord], kind: str, scales: dict | None = None
                    ) -> np.ndarray:
    """Per-record rewards of the reward `kind` registers (`tr.rewards.registry`: `strict` S,
    `fdr` max(P/D_f, 0), `spr` S + P⁺/(P⁺ + D'_f)).

    A family missing from the table gets scale 1 (the floor of `D_f`).
    """
    reward = reward_kind(kind, "reward")
    rows = [trajectory_row(r) for r in records]
    strict = np.asarray([r["strict_pass"] for r in rows], np.float32)
    matched = np.asarray([r["matched"] for r in rows], np.float32)
    scale = None
    if reward.needs_scales:
        if scales is None:
            raise ConfigError(f"reward {kind!r} needs a family scale table")
        scale = np.asarray([float(scales.get(r["family"], {}).get(reward.scale_field, 1.0))
                            for r in rows], np.float32)
    return reward.fn(strict, matched, scale)


def reward_kind(kind: str, field: str) -> reward_registry.Reward:
    """The registered reward `kind` names; ConfigError naming the config `field` and the
    registered rewards otherwise."""
    if kind not in reward_registry.rewards():
        raise ConfigError(f"{field} = {kind!r}: expected one of {reward_registry.rewards()}")
    return reward_registry.reward(kind)


# ------------------------------------------------------------------------------------------------
# Training arrays


def training_arrays(records: Sequence[EpisodeRecord], rewards: Sequence[float], *, rows: int,
                    length: int, num_windows: int = 1, pack_multiple: int = 0
                    ) -> tuple[dict[str, np.ndarray], dict]:
    """`[rows, length]` SPEC §2 arrays of the counted records, one context window per row.

    With `pack_multiple = m > 0` the windows are packed several to a row (`pack_sequences`: first-
    fit decreasing, `segment_ids` and `positions` per window) and the batch has the fewest rows,
    a multiple of m, that hold them (at most `rows`): the same tokens, masks and targets in fewer
    rows, so an update costs what the tokens cost, not what the padding costs. Token-mean losses
    and the advantage recursion (cut at each window's done) do not change; at most `rows / m`
    batch shapes compile. Packing needs one window per episode (`num_windows = 1`).

    With `num_windows > 1` an episode split by summarisation keeps its reward and done on its last
    window only and its rows are linked (`window_ids`, `next_window_row`) so TB-GAE is carried
    across them; with 1, each window is scored by the episode outcome on its own. Rows past the
    data are padding (all masks false). Too many rows, a window longer than `length`, or more
    windows than `num_windows` raise, naming the config field.
    """
    from tr.agent.records import pack_sequences, pad_sequences  # pylint: disable=g-import-not-at-top

    if pack_multiple and (num_windows > 1 or rows % pack_multiple):
        raise ConfigError(f"arrays.pack_multiple={pack_multiple} needs train.ppo.num_windows = 1 "
                          f"(got {num_windows}) and divides arrays.rows={rows}")
    seqs, window_ids, next_row, stats = [], [], [], {"truncated_rows": 0}
    for record, reward in zip(records, rewards):
        if not record.status.counts:
            continue
        windows = episode_to_sequences(record, float(reward))
        if num_windows > 1:
            if len(windows) > num_windows:
                raise ConfigError(f"episode {record.episode_id} has {len(windows)} context windows "
                                  f"> train.ppo.num_windows={num_windows}")
            for w in windows[:-1]:
                w["rewards"][:] = 0.0
                w["dones"][:] = False
        first = len(seqs)
        for w, seq in enumerate(windows):
            seqs.append(seq)
            window_ids.append(w if num_windows > 1 else 0)
            linked = num_windows > 1 and w + 1 < len(windows)
            next_row.append(first + w + 1 if linked else -1)
    if len(seqs) > rows:
        raise ConfigError(f"{len(seqs)} context windows do not fit arrays.rows={rows}")
    too_long = [len(s["tokens"]) for s in seqs if len(s["tokens"]) > length]
    if too_long:
        raise ConfigError(f"a context window of {max(too_long)} tokens does not fit "
                          f"arrays.length={length}")
    if pack_multiple:
        # at most `rows`: the windows fit `rows` one to a row, and m divides `rows`
        batch, _ = pack_sequences(seqs, length, multiple=pack_multiple)
        packed_rows = batch["tokens"].shape[0]
        batch["window_ids"] = np.zeros(packed_rows, np.int32)
        batch["next_window_row"] = np.full(packed_rows, -1, np.int32)
    else:
        batch = pad_sequences(seqs, length) if seqs else pad_sequences([], length)
        pad = rows - len(seqs)
        batch = {k: np.concatenate([v, np.zeros((pad, length), v.dtype)]) for k, v in batch.items()}
        batch["window_ids"] = np.asarray(window_ids + [0] * pad, np.int32)
        batch["next_window_row"] = np.asarray(next_row + [-1] * pad, np.int32)
    tokens = int(sum(len(s["tokens"]) for s in seqs))
    stats.update(windows=len(seqs), action_tokens=int(batch["actor_mask"].sum()), tokens=tokens,
                 rows=int(batch["tokens"].shape[0]),
                 fill=round(tokens / batch["tokens"].size, 4))
    return batch, stats


# ------------------------------------------------------------------------------------------------
# Evaluation and metrics


def rollout_summary(records: Sequence[EpisodeRecord], rewards: Sequence[float]) -> dict:
    """Pass rate, mean reward, turns and statuses of one rollout batch."""
    counted = [i for i, r in enumerate(records) if r.status.counts]
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    return {
        "episodes": len(records),
        "pass_rate": (float(np.mean([bool(records[i].passed) for i in counted]))
                      if counted else None),
        "reward_mean": float(np.mean([rewards[i] for i in counted])) if counted else None,
        "turns_mean": (float(np.mean([records[i].num_turns for i in counted]))
                       if counted else None),
        "statuses": statuses,
    }


def evaluate_split(actor: Actor, tasks: Sequence, eval_config, *, seed: int,
                   cache_dir: pathlib.Path | None = None) -> dict:
    """Mean@k and Pass@1 of the current actor on `tasks` (`tr.agent.evaluation.summarise`),
    at the evaluation temperature and top-p (SPEC §6).

    With `cache_dir` (the run directory's `val-evaluations/`), a summary is kept under its
    `Actor.evaluation_key` and an evaluation of the same parameters on the same tasks, seed and
    settings reads it back instead of running again: a stage's step-0 actor is the retained actor
    its parent stage already evaluated (the outcome is the same, the sampler being
    batch-invariant)."""
    path = None
    if cache_dir is not None:
        path = pathlib.Path(cache_dir) / f"{actor.evaluation_key(tasks, eval_config, seed=seed)}.json"
        if path.exists():
            return {**json.loads(path.read_text()), "reused": True}
    records, _ = actor.rollouts(tasks, seed=seed, group_size=int(eval_config.k),
                                temperature=float(eval_config.temperature),
                                top_p=float(eval_config.top_p), prefix="eval",
                                wall_time_s=float(eval_config.get("wall_time_s", 0) or 0))
    summary = evaluation.summarise(records, tasks, int(eval_config.k))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(summary, sort_keys=True))
        tmp.replace(path)
    return summary


class MetricsLog:
    """`metrics.jsonl`: one JSON line per update, the same scalars as TensorBoard event files in
    the same folder (:class:`tr.stages.scalars.ScalarWriter`); a progress line on stderr per
    iteration (:func:`tr.stages.progress.line`: the run's stage i/N, and an ETA when given the
    iterations done and due).

    `truncate(iteration)` drops the lines of iterations ≥ `iteration` (written by a run killed
    after its update but before its checkpoint), so a resumed stage never repeats a line; the
    event files drop the same steps (TensorBoard's purge at the first dropped step).
    """

    def __init__(self, path: pathlib.Path, stream=None):
        self.path = path
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.monotonic()
        self.board = scalars.ScalarWriter(path.parent)
        self.start = 0      # iterations done before this process (set by truncate)

    def truncate(self, iteration: int) -> None:
        self.start = iteration
        if not self.path.exists():
            return
        kept, dropped = [], []
        for line in self.path.read_text().splitlines():
            if line.strip():
                parsed = json.loads(line)
                (kept.append(line) if parsed["iteration"] < iteration else dropped.append(parsed["step"]))
        if dropped:
            self.board.purge_step = min(dropped)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)

    def write(self, lines: Sequence[dict]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line, sort_keys=True) + "\n")
            f.flush()
        self.board.write(lines)

    def progress(self, text: str, *, done: int | None = None, total: int | None = None) -> None:
        """A line on stderr; `done` of `total` iterations adds tqdm's meter (its ETA counts the
        iterations past the resumed-from one given to :meth:`truncate`: those cost nothing here)."""
        self.stream.write(progress.line(text, time.monotonic() - self.t0, done=done, total=total,
                                        initial=self.start) + "\n")
        self.stream.flush()

    def close(self) -> None:
        self.board.close()


def read_metrics(path: pathlib.Path) -> list[dict]:
    """The lines of a `metrics.jsonl`."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# Instruction-set features that change XLA's CPU code (and so, through float rounding, a run's
# numbers: the same seed trains a different Base on another kind of machine).
_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile")


def machine_info() -> dict:
    """What a report records of the machine it ran on: CPU model, cores, the ISA features XLA's CPU
    code depends on, the JAX backend and versions (runs compare only within one machine kind)."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "isa": [f for f in _ISA_FLAGS if f in flags],
            "backend": jax.default_backend(), "jax": jax.__version__,
            "jaxlib": importlib.metadata.version("jaxlib")}


def to_host(metrics: dict) -> dict:
    return {k: float(v) for k, v in jax.device_get(metrics).items()}


def finite_or_none(value):
    """`value` as a float, or None where it is missing or not finite (an undefined EV: JSON has no
    NaN or infinity)."""
    return float(value) if value is not None and math.isfinite(value) else None
