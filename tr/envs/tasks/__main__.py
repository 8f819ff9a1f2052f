"""`python -m tr.envs.tasks`: validate, verify and list task directories.

    validate DIR...                       every problem, with file and field; exit 1 if any is bad
    verify DIR [--attempt solution|partial|none] [--backend local|docker] [--json] [--verbose]
                                          exit 0 strict pass, 1 not strict, 2 could not verify;
                                          a failing solution command's output and the verifier
                                          log are printed (always with --verbose)
    list [DIR]                            id, family, tier, layout (default: the built-in suite)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tr.envs.backends import get_backend
from tr.envs.sandbox import SandboxConfig
from tr.envs.images.base import unreachable_hosts
from tr.envs.tasks import loader
from tr.envs.tasks import runner
from tr.envs.tasks.model import TaskError

EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


def _expand(paths: list[str]) -> list[Path]:
    """Each argument is a task directory or a directory of task directories."""
    out: list[Path] = []
    for arg in paths:
        path = Path(arg)
        dirs = loader.task_dirs(path) if path.is_dir() else [path]
        out.extend(dirs or [path])
    return out


_REFUSED = re.compile(r"Connection refused|\[Errno 111\]|ECONNREFUSED")
_LOCALHOST = re.compile(r"\blocalhost\b|127\.0\.0\.1")


def _tail(text: str, limit: int) -> str:
    text = (text or "").rstrip()
    return text if len(text) <= limit else "…" + text[-limit:]


def _local_notes(task) -> list[str]:
    try:
        plan = runner.local_plan(task)
    except runner.NeedsDocker as exc:
        return [f"runs on the Docker backend only: {exc}"]
    except runner.TaskEnvironmentError as exc:
        return [f"Dockerfile problem: {exc}"]
    return [f"local backend: {n}" for n in plan.notes] if plan is not None else []


def cmd_validate(args) -> int:
    dirs = _expand(args.dirs)
    bad = 0
    for task_dir in dirs:
        problems = loader.validate_task(task_dir)
        if problems:
            bad += 1
            print(f"FAIL {task_dir}")
            for problem in problems:
                print(f"  {problem}")
            continue
        task = loader.load_task(task_dir)
        print(f"ok   {task_dir}  ({task.layout}, {task.family}, {task.tier}, "
              f"{task.verifier.kind})")
        for note in (task.verifier.note, *_local_notes(task)):
            if note:
                print(f"  note: {note}")
    print(f"{len(dirs) - bad} valid, {bad} invalid")
    return EXIT_FAIL if bad else EXIT_OK


def cmd_verify(args) -> int:
    try:
        task = loader.load_task(args.dir)
    except TaskError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_ERROR
    try:
        base = None
        if args.network:
            base = SandboxConfig(network=True)
        result, turns = runner.run_task(task, args.attempt, args.backend, base_config=base)
    except runner.NeedsDocker as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as exc:  # e.g. no partial attempt for this task
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    notes = [n for n in (task.verifier.note, *result.notes) if n]
    if args.json:
        data = result.to_dict()
        data.update(attempt=args.attempt, backend=args.backend, layout=task.layout, notes=notes,
                    turns=[{"exit_code": t.exit_code, "timed_out": t.timed_out,
                            "output": _tail(t.output, 3000)} for t in turns])
        print(json.dumps(data, sort_keys=True))
    else:
        print(f"task {task.id}  family {task.family}  tier {task.tier}  layout {task.layout}  "
              f"attempt {args.attempt}  backend {args.backend}")
        print(f"turns: {len(turns)} (exit codes {[t.exit_code for t in turns]})")
        commands = runner.attempt_turns(task, args.attempt)
        for index, turn in enumerate(turns):
            failed = turn.timed_out or turn.exit_code != 0
            if failed or args.verbose:
                status = "timed out" if turn.timed_out else f"exit code {turn.exit_code}"
                command = commands[index] if index < len(commands) else "?"
                print(f"--- turn {index + 1}: {command.splitlines()[0][:120]}  ({status})")
                print(_tail(turn.output, 3000) or "(no output)")
                hosts = unreachable_hosts(turn.output.splitlines()) if failed else []
                if hosts and not args.network:
                    print(f"note: turn {index + 1} could not reach {', '.join(hosts)}: the agent's "
                          "runtime is offline by default; rerun with --network to give it one")
        for note in notes:
            print(f"note: {note}")
        for check in result.checks:
            mark = "PASS" if check.passed else check.outcome.upper()
            tags = ("penalty " if check.penalty else "") + ("required" if check.required else "")
            print(f"  {mark:7} {check.name}  {tags.strip()}")
        reward = f"  reward={result.reward:g}" if result.reward is not None else ""
        print(f"matched P={result.matched}  executed={result.executed}  "
              f"strict S={int(result.strict_pass)}{reward}  ({result.duration_s:.2f}s)")
        if result.error:
            print(f"verifier error: {result.error}: {result.error_detail}")
        if (result.error or not result.strict_pass or args.verbose) and result.log:
            print("--- verifier log (tail)")
            print(_tail(result.log, 4000))
            if (not result.strict_pass and _REFUSED.search(result.log)
                    and _LOCALHOST.search(result.log)):
                why = ("no process the agent left running listened there (the tests ran beside "
                       "its live processes)" if task.verifier.servers
                       and get_backend(args.backend).network_sibling else
                       "the protected verifier ended every process the agent started before "
                       "the tests ran, so a server the agent left running was gone" +
                       ("" if get_backend(args.backend).network_sibling else
                        " (--backend docker keeps them for tests that name a local server)"))
                print("note: the tests expect a service on this machine (connection refused on "
                      f"localhost): {why}")
            hosts = unreachable_hosts(result.log.splitlines())
            if hosts and not result.strict_pass:
                print(f"note: the tests could not reach {', '.join(hosts)} (the runtime is "
                      f"{'given the network' if args.network else 'offline; try --network'})")
    if result.error:
        return EXIT_ERROR
    return EXIT_OK if result.strict_pass else EXIT_FAIL


def cmd_list(args) -> int:
    root = Path(args.dir) if args.dir else loader.SUITE_DIR
    if not root.is_dir():
        print(f"error: {root} is not a directory", file=sys.stderr)
        return EXIT_ERROR
    rows, bad = [], 0
    for task_dir in loader.task_dirs(root):
        try:
            task = loader.load_task(task_dir)
            rows.append((task.id, task.family, task.tier, task.layout))
        except TaskError as exc:
            bad += 1
            rows.append((task_dir.name, "INVALID", "-", str(exc.problems[0])))
    header = ("id", "family", "tier", "layout")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)) + "  " + row[3])
    print(f"{len(rows) - bad} tasks" + (f", {bad} invalid" if bad else ""))
    return EXIT_FAIL if bad else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tr.envs.tasks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check task directories")
    p.add_argument("dirs", nargs="+", metavar="DIR")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("verify", help="lay a task down, play an attempt, run its verifier")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--attempt", choices=("solution", "partial", "none"), default="solution")
    p.add_argument("--backend", default="local",
                   help="local, docker, or a module defining a tr.envs.backends BACKEND")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--network", action="store_true",
                   help="give the agent's runtime the network (default: offline; a task's own "
                        "allow_internet wins; on Docker the mode is $TR_DOCKER_NETWORK, default "
                        "bridge)")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="print every solution command's output and the verifier log")
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("list", help="list tasks with family and tier")
    p.add_argument("dir", nargs="?", metavar="DIR")
    p.set_defaults(func=cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the CLI never shows a traceback
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
