"""Try real public tasks (Terminal-Bench 1 / Harbor layouts) as a user would: each task's reference
solution and the empty attempt, through `python -m tr.envs.tasks verify --json`.

    python bench/real_tasks.py DIR... [--backend docker] [--out results.jsonl] [--jobs 1]
                                      [--timeout-s 1200]

`--timeout-s` per `verify` call, raised to the task's agent + test budgets + 900 s (its build).

A DIR is a task folder or a folder of task folders.  Per task: `--attempt solution` (offline, as
tr runs agents; when it fails and a turn or the tests could not reach a host, again with
`--network`, as TB1's harness gives its agents the network), then `--attempt none` (must fail).
One JSON line per task to `--out` (appended; a task already there is skipped, so a killed run
resumes), then a markdown table: task, layout, reference, none, reason.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tr.envs.tasks import loader  # noqa: E402

BUILD_ALLOWANCE_S = 900.0      # an image build of a few hundred packages on shared cores
_UNREACHABLE = re.compile(r"could not reach|Could not resolve|Temporary failure (in name resolution|resolving)|"
                          r"Network is unreachable|Failed to establish a new connection")


def _verify(task_dir: Path, attempt: str, backend: str, network: bool, timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "tr.envs.tasks", "verify", str(task_dir), "--attempt", attempt,
           "--backend", backend, "--json"] + (["--network"] if network else [])
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        return {"rc": None, "error": f"timed out after {timeout_s:.0f} s",
                "stderr": (exc.stderr or b"")[-3000:].decode("utf-8", "replace")
                if isinstance(exc.stderr, bytes) else str(exc.stderr or "")[-3000:],
                "wall_s": time.monotonic() - start}
    row = {"rc": proc.returncode, "wall_s": round(time.monotonic() - start, 1),
           "stderr": proc.stderr[-3000:]}
    try:
        row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (json.JSONDecodeError, IndexError):
        row["stdout"] = proc.stdout[-3000:]
    return row


def _short(row: dict) -> str:
    if row.get("strict_pass"):
        return "pass"
    if row.get("rc") is None:
        return "timeout"
    if row.get("error"):
        return f"error:{row['error']}"
    return "fail"


def _reason(row: dict) -> str:
    """One line from the run's own messages: the environment error, the failing solution turn,
    the verifier log, else the CLI's stderr (image build output, errors)."""
    text = (row.get("error_detail") or "").strip()
    if text:
        return " ".join(text.splitlines()[-3:])[:300]
    for turn in row.get("turns", []):
        if turn.get("exit_code") not in (0, None) or turn.get("timed_out"):
            return ("solution turn: " + " ".join(turn.get("output", "").splitlines()[-3:]))[:300]
    for key in ("log", "stderr", "stdout"):
        lines = [ln for ln in (row.get(key) or "").splitlines()
                 if ln.strip() and not ln.startswith("[image]")]
        if lines:
            return " ".join(lines[-3:])[:300]
    return ""


def try_task(task_dir: Path, backend: str, timeout_s: float) -> dict:
    try:
        task = loader.load_task(task_dir)
        layout = task.layout
    except Exception as exc:  # pylint: disable=broad-except
        return {"task": task_dir.name, "layout": "?", "reference": "invalid", "none": "-",
                "reason": str(exc)[:300]}
    # never below the task's own budgets (agent + tests) plus a build allowance: a task that may
    # run for 30 minutes is not a failure at 20
    timeout_s = max(timeout_s, task.budgets.agent_timeout_s + task.budgets.verifier_timeout_s
                    + BUILD_ALLOWANCE_S)
    ref = _verify(task_dir, "solution", backend, False, timeout_s)
    network = False
    if not ref.get("strict_pass") and _UNREACHABLE.search(json.dumps(ref)):
        network = True
        ref = _verify(task_dir, "solution", backend, True, timeout_s)
    none = _verify(task_dir, "none", backend, network, timeout_s)
    return {"task": task_dir.name, "layout": layout, "reference": _short(ref), "none": _short(none),
            "network": network, "notes": ref.get("notes", []),
            "reason": "" if ref.get("strict_pass") else _reason(ref),
            "detail": {k: (ref.get(k) or "")[-1500:] if isinstance(ref.get(k), str) else ref.get(k)
                       for k in ("error", "error_detail", "log", "stderr")},
            "none_reason": "" if not none.get("strict_pass") else "the empty attempt passed",
            "wall_s": [ref.get("wall_s"), none.get("wall_s")]}


def table(rows: list[dict]) -> str:
    lines = ["| task | layout | reference | --attempt none | reason (when not passing) |",
             "|---|---|---|---|---|"]
    for r in rows:
        ref = r["reference"] + (" (--network)" if r.get("network") else "")
        reason = (r.get("reason") or r.get("none_reason") or "").replace("|", "/")
        lines.append(f"| {r['task']} | {r['layout']} | {ref} | {r['none']} | {reason} |")
    passed = sum(r["reference"] == "pass" for r in rows)
    none_failed = sum(r["none"] != "pass" for r in rows)
    lines.append(f"\n{passed}/{len(rows)} pass with their reference; "
                 f"{none_failed}/{len(rows)} fail with --attempt none")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+")
    p.add_argument("--backend", default="docker", choices=("local", "docker"))
    p.add_argument("--out", default="real_tasks.jsonl")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=1200.0)
    args = p.parse_args(argv)
    dirs: list[Path] = []
    for arg in args.dirs:
        path = Path(arg).absolute()      # a symlink's name is the task's name in the table
        dirs.extend(loader.task_dirs(path) or [path])
    out = Path(args.out)
    done = {}
    if out.is_file():
        for line in out.read_text().splitlines():
            row = json.loads(line)
            done[row["task"]] = row
    todo = [d for d in dirs if d.name not in done]
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for row in pool.map(lambda d: try_task(d, args.backend, args.timeout_s), todo):
            done[row["task"]] = row
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{row['task']}: {row['reference']} / none {row['none']}  {row.get('reason', '')[:150]}",
                  flush=True)
    print(table([done[d.name] for d in dirs if d.name in done]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
