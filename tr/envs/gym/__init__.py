"""A procedurally generated gym of short terminal tasks (issue 11): families x seeds -> tasks.

    from tr.envs import gym
    gym.FAMILIES["follow-pointer"]        # Family(name, tier, observes, undo, generate)
    task = gym.make_task("follow-pointer", 7)     # a tr-layout Task (directory in the gym cache)
    tasks = gym.split_tasks("val", 64)            # deterministic, round-robin over the families
    gym.repair_commands(task), gym.mistake_commands(task)

An instance is a pure function of `(family, seed)`.  Its split is a function of its *content*
(`fingerprint`: family, instruction and initial files), so two seeds that happen to generate the
same task always land in the same split: `train`, `val` and `test` are disjoint by construction.
`HELDOUT_FAMILY` never appears in `train` (its instances go to `val` and `test`: transfer).
Instances are written as task directories in the project's own layout (tr/envs/tasks/LAYOUT_TR.md)
under the gym cache (`$TR_GYM_DIR`, default `~/.cache/tr/gym`), so they load, validate and verify
like any other task; `python -m tr.envs.gym write DIR ...` writes them anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from tr.envs.gym.families import FAMILY_LIST, Family, Instance
from tr.envs.tasks import load_task
from tr.envs.tasks.model import Task

GYM_VERSION = 3
FAMILIES: Mapping[str, Family] = {f.name: f for f in FAMILY_LIST}
HELDOUT_FAMILY = "uid-lookup"
SPLITS = ("train", "val", "test")
SEED_STRIDE = 1_000_000          # split_tasks(seed=s) draws instance seeds from s * SEED_STRIDE on
DEFAULT_PER_FAMILY = 16          # split_tasks(count=None): this many per family
# Buckets of the content fingerprint (0..99): train < 80 <= val < 90 <= test; the held-out
# family's instances split between val (< 50) and test.
TRAIN_BUCKETS, VAL_BUCKETS = 80, 90
AGENT_TIMEOUT_S, MAX_TURNS, VERIFIER_TIMEOUT_S = 60, 8, 30

__all__ = ["FAMILIES", "HELDOUT_FAMILY", "SPLITS", "Family", "Instance", "fingerprint", "instance",
           "make_task", "mistake_commands", "repair_commands", "split_of", "split_tasks",
           "task_seed", "write_task"]


def _family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown gym family {name!r}; choose one of {sorted(FAMILIES)}")
    return FAMILIES[name]


def instance(family: str, seed: int) -> Instance:
    """The instance of `family` for `seed` (pure: the same pair always gives the same task)."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"gym seed must be a non-negative int, got {seed!r}")
    return _family(family).generate(random.Random(f"{family}:{seed}"))


def fingerprint(family: str, inst: Instance) -> str:
    """sha256 of what the agent faces: family, instruction, initial files."""
    blob = json.dumps([family, inst.instruction, sorted(inst.files.items())], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def split_of(family: str, seed: int) -> str:
    """The split an instance belongs to: a function of its content fingerprint only."""
    bucket = int(fingerprint(family, instance(family, seed))[:8], 16) % 100
    if family == HELDOUT_FAMILY:
        return "val" if bucket < 50 else "test"
    return "train" if bucket < TRAIN_BUCKETS else "val" if bucket < VAL_BUCKETS else "test"


def task_id(family: str, seed: int) -> str:
    return f"{family}-{seed}"


def cache_dir() -> Path:
    root = os.environ.get("TR_GYM_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tr", "gym")
    return Path(root) / f"v{GYM_VERSION}"


def _toml(family: Family, seed: int) -> str:
    return (f'version = "1.0"\n\n[metadata]\nfamily = "{family.name}"\ntier = "{family.tier}"\n'
            f'tags = ["gym", "seed-{seed}"]\nauthor = "tr gym v{GYM_VERSION}"\n\n'
            f"[agent]\ntimeout_sec = {AGENT_TIMEOUT_S}\nmax_turns = {MAX_TURNS}\n\n"
            f'[verifier]\ntimeout_sec = {VERIFIER_TIMEOUT_S}\nfinal_gate = "test_final_gate"\nrunner = "stdlib"\n')


def _turns(commands: Sequence[str]) -> str:
    return "#!/usr/bin/env bash\n\n" + "\n\n".join(commands) + "\n"


def write_task(family: str, seed: int, root: Path | str) -> Path:
    """Write the instance as a tr-layout task directory `root/<family>-<seed>` (atomically; an
    existing directory of that name is kept as it is) and return its path."""
    fam, inst = _family(family), instance(family, seed)
    root = Path(root)
    dest = root / task_id(family, seed)
    if dest.is_dir():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{dest.name}.{os.getpid()}.{os.urandom(4).hex()}"
    files = {"task.toml": _toml(fam, seed), "instruction.md": inst.instruction + "\n",
             "solution/solve.sh": _turns(inst.solution),
             "solution/partial.sh": _turns(inst.partial),
             "tests/test_checks.py": inst.test_source(),
             **{f"environment/files/{rel}": text for rel, text in inst.files.items()}}
    for rel, text in files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    try:
        os.rename(tmp, dest)
    except OSError:                      # another process wrote it first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def make_task(family: str, seed: int) -> Task:
    """The instance as a loaded tr-layout Task (materialised once in the gym cache)."""

    return load_task(write_task(family, seed, cache_dir()))


def _seeds(family: str, split: str, start: int) -> Iterable[int]:
    seen = set()
    s = start
    while True:
        if split_of(family, s) == split:
            fp = fingerprint(family, instance(family, s))
            if fp not in seen:           # two seeds, one task: keep the first
                seen.add(fp)
                yield s
        s += 1


def split_seeds(split: str, count: int | None = None, *, seed: int = 0,
                families: Sequence[str] | None = None) -> list[tuple[str, int]]:
    """(family, instance seed) pairs of a split: round-robin over the families (sorted), each
    family's seeds in order from `seed * SEED_STRIDE`; deterministic."""
    if split not in SPLITS:
        raise ValueError(f"unknown gym split {split!r}; choose one of {SPLITS}")
    names = sorted(families) if families else sorted(FAMILIES)
    for name in names:
        _family(name)
    if split == "train":
        if families and HELDOUT_FAMILY in families:
            raise ValueError(f"family {HELDOUT_FAMILY!r} is held out of the train split")
        names = [n for n in names if n != HELDOUT_FAMILY]
    if count is None:
        count = DEFAULT_PER_FAMILY * len(names)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    gens = {n: _seeds(n, split, seed * SEED_STRIDE) for n in names}
    return [(names[i % len(names)], next(gens[names[i % len(names)]])) for i in range(count)]


def split_tasks(split: str, count: int | None = None, *, seed: int = 0,
                families: Sequence[str] | None = None) -> list[Task]:
    """`count` tasks of `split` (default DEFAULT_PER_FAMILY per family), see `split_seeds`."""
    return [make_task(f, s) for f, s in split_seeds(split, count, seed=seed, families=families)]


def task_seed(task: Task) -> int:
    """The instance seed of a gym task (its `seed-N` tag)."""
    for tag in task.tags:
        if tag.startswith("seed-") and tag[5:].isdigit():
            return int(tag[5:])
    raise ValueError(f"task {task.id} is not a gym task (no seed-N tag)")


def repair_commands(task: Task) -> list[str]:
    """Commands that reach the goal from the initial state or any state the family's plausible
    mistakes leave (the embedded teacher)."""
    return list(instance(task.family, task_seed(task)).repair)


def mistake_commands(task: Task) -> list[str]:
    """Plausible wrong first actions of the task's family."""
    return list(instance(task.family, task_seed(task)).mistakes)


def solution_commands(task: Task) -> list[str]:
    return list(instance(task.family, task_seed(task)).solution)


def partial_commands(task: Task) -> list[str]:
    return list(instance(task.family, task_seed(task)).partial)

