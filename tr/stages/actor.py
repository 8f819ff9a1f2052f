"""The current actor as a sampler: the stages' batch-invariant `episode_sampler`, `Actor`
(rollouts of the synced parameters, the key of an evaluation) and `cached_rollouts` (a resumed
stage trains on the data it had generated)."""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Sequence

from tr.agent.policies import ModelPolicy
from tr.agent.records import EpisodeRecord, read_shard, write_shard
from tr.agent.rollout import RolloutConfig, group_specs, run_rollouts
from tr.sampling.slots import EpisodeSampler
from tr.stages.stage_models import Models
from tr.train.checkpoint import tree_hash


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
