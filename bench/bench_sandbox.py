"""Sandbox speed per backend: medians, and local/docker ratios on the same work.

    .venv/bin/python bench/bench_sandbox.py [--backends local,docker] [--repeats N]

Rows: start -> first output (``start()`` + ``run("echo hi")``), trivial command round trip
(``run("true")``), snapshot + restore of a 50 MB workspace (first: all copied; next: after a
one-line edit, unchanged files shared with the previous snapshot), snapshot of a workspace of
20,000 empty files (first and next), and episodes per second for a 5-command episode (start, 5
commands, close) with 1 and with 8 sandboxes at once (threads).
Targets for local on the 2-core dev machine: start < 50 ms, round trip < 5 ms, 50 MB snapshot +
restore < 100 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tr.envs.backends import make_sandbox  # noqa: E402
from tr.envs.sandbox import SandboxConfig  # noqa: E402

EPISODE = ["echo start", "cd /tmp && ls -la > /dev/null", "export X=1; echo $X",
           "cat /etc/hostname", "true"]


def median_ms(samples) -> float:
    return statistics.median(samples) * 1000


def bench_start(backend: str, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        box = make_sandbox(backend, SandboxConfig()).start()
        try:
            r = box.run("echo hi")
            times.append(time.perf_counter() - t0)
            assert r.output == "hi\n", r
        finally:
            box.close()
    return median_ms(times)


def bench_round_trip(backend: str, n: int) -> float:
    with make_sandbox(backend, SandboxConfig()) as box:
        box.run("true")
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            box.run("true")
            times.append(time.perf_counter() - t0)
    return median_ms(times)


def bench_snapshot_restore(backend: str, n: int) -> tuple[float, float]:
    """(first snapshot + restore: everything copied, then: unchanged files shared), medians."""
    first, later = [], []
    for _ in range(max(2, n // 2)):
        with make_sandbox(backend, SandboxConfig(disk_mb=256)) as box:
            r = box.run("mkdir -p /app/data && for i in $(seq 1 50); do "
                        "head -c 1048576 /dev/urandom > /app/data/f$i; done; du -sm /app/data",
                        timeout_s=120)
            assert r.output.split()[0] in ("50", "51"), r.output
            for i in range(n):
                box.run("echo edit >> /app/data/f1")     # a small change between rounds
                t0 = time.perf_counter()
                snap = box.snapshot()
                box.restore(snap)
                (first if i == 0 else later).append(time.perf_counter() - t0)
    return median_ms(first), median_ms(later)


def bench_many_files(backend: str, n: int) -> tuple[float, float]:
    """(first snapshot, next snapshot after touching one file) of 20,000 empty files, medians."""
    first, later = [], []
    for _ in range(max(1, n // 2)):
        with make_sandbox(backend, SandboxConfig()) as box:
            r = box.run("mkdir /app/many && cd /app/many && python3 -c \"for i in range(20000): "
                        "open(str(i), 'w')\" && ls | wc -l", timeout_s=300)
            assert r.output.split() == ["20000"], r.output
            for i in range(n):
                box.run(f"echo {i} > /app/many/0")
                t0 = time.perf_counter()
                box.snapshot()
                (first if i == 0 else later).append(time.perf_counter() - t0)
    return median_ms(first), median_ms(later)


def episode(backend: str) -> None:
    with make_sandbox(backend, SandboxConfig()) as box:
        for command in EPISODE:
            r = box.run(command)
            assert r.exit_code == 0, r


def bench_episodes(backend: str, parallel: int, count: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda _: episode(backend), range(count)))
    return count / (time.perf_counter() - t0)


def run(backend: str, repeats: int) -> dict:
    heavy = 1 if backend == "local" else 4     # docker is slow: fewer samples
    episode(backend)   # warm caches (etc template, base image, seed)
    return {
        "start -> first output (ms)": bench_start(backend, max(3, repeats // heavy)),
        "round trip `true` (ms)": bench_round_trip(backend, 10 * repeats // heavy),
        **dict(zip(("snapshot+restore 50 MB, first (ms)", "snapshot+restore 50 MB, next (ms)"),
                   bench_snapshot_restore(backend, max(3, repeats // 4 // heavy)))),
        **dict(zip(("snapshot 20k empty files, first (ms)", "snapshot 20k empty files, next (ms)"),
                   bench_many_files(backend, max(3, repeats // 4 // heavy)))),
        "episodes/s, 1 at a time": bench_episodes(backend, 1, max(4, repeats // heavy)),
        "episodes/s, 8 at once": bench_episodes(backend, 8, max(8, 2 * repeats // heavy)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="local,docker")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    results = {}
    for b in backends:
        try:
            results[b] = run(b, args.repeats)
        except Exception as e:  # noqa: BLE001 - report and go on with the other backend
            print(f"{b}: not measured ({type(e).__name__}: {e})", file=sys.stderr)
    if not results:
        return 1
    rows = next(iter(results.values())).keys()
    header = f"| {'metric':<36} | " + " | ".join(f"{b:>9}" for b in results)
    if {"local", "docker"} <= results.keys():
        header += " | local/docker"
    print(header)
    print("|" + "-" * (len(header) - 1))
    for row in rows:
        line = f"| {row:<36} | " + " | ".join(f"{results[b][row]:>9.2f}" for b in results)
        if {"local", "docker"} <= results.keys():
            line += f" | {results['local'][row] / results['docker'][row]:>11.3f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
