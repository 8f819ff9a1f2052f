"""Task splits of a stage (`train`, `val`, `test`): the gym's, or the built-in suite's hash split,
and the tasks of each rollout batch."""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from tr.envs import gym
from tr.envs.tasks import TaskError, load_suite
from tr.stages.registry import ConfigError


SPLITS = ("train", "val", "test")


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
        return list(gym.split_tasks(split, count, seed=int(tasks_config.seed)))
    if tasks_config.source != "suite":
        raise ConfigError(f"config.tasks.source = {tasks_config.source!r}: expected 'suite' or 'gym'")
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
