"""Soak of the sandbox and verifier hardening: random combinations of the adversarial suite's
attacks, for as long as asked, on both backends (outside the test command).

    .venv/bin/python bench/soak_hardening.py [--minutes 30] [--backends local,docker] [--seed 0]

Each round starts a sandbox with the fixture task of ``tests/test_hardening.py`` (42 wanted, 41
left), plays 1-3 of its forgeries in random order, then the real protected verifier; every fifth
round is instead a whole episode whose agent sabotages the verifier (its error must count as a
failure).  Prints per-attack counts and exits 1 if any round forged a pass, let a payload run in
the verifier, left an agent process alive, or if the process leaves sandbox folders behind.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import test_hardening as th  # noqa: E402
from test_sandbox import leftovers  # noqa: E402

from tr.envs.backends import make_sandbox  # noqa: E402
from tr.envs.sandbox import SandboxConfig  # noqa: E402
from tr.envs.tasks.runner import prepare, sandbox_config, verify  # noqa: E402


def forgery_round(task, backend: str, names: list[str]) -> list[str]:
    """Problems found (empty: the attacks failed, as they must)."""
    problems = []
    config = sandbox_config(task, backend, SandboxConfig(**th.SMALL))
    with make_sandbox(backend, config) as box:
        prepare(task, box, backend)
        th.build_payload(box)
        token = th.unique_sleep()
        for name in names:
            script = th.FORGERIES[name].replace("TOKEN", token)
            th.agent(box, script, timeout_s=3 if "trap" in script else 60)
        box.run("echo 41 > /app/answer.txt")
        result = verify(task, box)
        if result.strict_pass:
            problems.append("forged pass")
        if box.read_file("/app/answer.txt") != b"41\n":
            problems.append("payload ran in the verifier")
        if th.host_pids_with(token):
            problems.append("agent process survived")
    return problems


def sabotage_round(root: Path, backend: str, name: str) -> list[str]:
    task = th.make_task(root, f"quick-{time.monotonic_ns()}", timeout_s=8)
    rec = th.says_episode(task, backend, [th.VERIFIER_SABOTAGE[name]])
    if not rec.status.counts or rec.passed:
        return [f"not counted as a failure: {rec.status.value} {rec.error}"]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--backends", default="local,docker")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    runs, bad = collections.Counter(), collections.Counter()
    deadline = time.monotonic() + 60 * args.minutes
    with tempfile.TemporaryDirectory(prefix="tr-soak-") as tmp:
        root = Path(tmp)
        task = th.make_task(root, "answer")
        rounds = 0
        while time.monotonic() < deadline:
            backend = rng.choice(backends)
            if rounds % 5 == 4:
                name = rng.choice(sorted(th.VERIFIER_SABOTAGE))
                key = f"{backend}: sabotage {name}"
                problems = sabotage_round(root, backend, name)
            else:
                names = rng.sample(sorted(th.FORGERIES), rng.randint(1, 3))
                key = f"{backend}: {' + '.join(names)}"
                problems = forgery_round(task, backend, names)
            runs[key] += 1
            for p in problems:
                bad[f"{key}: {p}"] += 1
                print(f"PROBLEM {key}: {p}", flush=True)
            rounds += 1
    left = leftovers(os.getpid())
    print(f"{rounds} rounds, {len(runs)} attack combinations, {sum(bad.values())} problems")
    for key, n in sorted(runs.items()):
        print(f"  {n:4d}  {key}")
    if any(left.values()):
        print(f"LEFT BEHIND: {left}")
    return 1 if bad or any(left.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
