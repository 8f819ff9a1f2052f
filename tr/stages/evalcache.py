"""`val` evaluation of the current actor, kept under the key of everything it is a function of, so
the same parameters on the same tasks and settings are evaluated once per run directory."""

from __future__ import annotations

import json
import pathlib
from typing import Sequence

from tr.agent import evaluation
from tr.stages.actor import Actor


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
