"""`termrl` (also `python -m tr`): one command for what users do with `tr`.

    termrl run CONFIG[:VARIANT] [--workdir W] [--config.x=y ...]   an experiment (experiments/main.py)
    termrl eval --checkpoint C --tasks T [--k K] [--json]          Pass@1 / Mean@k by family and tier
    termrl serve --checkpoint C [--host H] [--port P]              an OpenAI-compatible server
    termrl export --checkpoint W/STAGE --out DIR                   a Hugging Face folder
    termrl tasks ...                                               python -m tr.envs.tasks
    termrl gym ...                                                 python -m tr.envs.gym
    termrl aot --config=CONFIG[:VARIANT] --topology=T [--json]     python -m tr.train.aot

A checkpoint C is a stage of a run (`W/STAGE[@STEP]`), a Hugging Face folder (`hf:DIR`) or, for
`eval` only, an OpenAI-compatible endpoint (`openai:URL#MODEL`); every command loads the
checkpoint's own model config and tokenizer (`tr.stages.checkpoints`).  Tasks T: a task directory
or a suite of them, `builtin` (the built-in suite), or a gym split (`gym:test`, `gym:val`,
`gym:train`; `--count` instances).  Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

from tr.stages.registry import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXIT_USAGE = 2
DEFAULT_EVAL = {"k": 3, "temperature": 0.6, "top_p": 0.95, "max_turns": 5,
                "max_output_tokens": 64, "context": 0, "concurrency": 16}


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (`termrl SUB: error: ...`) and exit status 2."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


# ------------------------------------------------------------------------------------------------
# run


def experiment_path(config: str) -> tuple[pathlib.Path, str]:
    """(config file, ':variant' or '') of CONFIG[:VARIANT]; a relative file from the current
    folder, else from the repository root."""
    path_text, sep, variant = config.partition(":")
    path = pathlib.Path(path_text).expanduser()
    if not path.is_absolute() and not path.exists():
        path = ROOT / path_text
    if not path.is_file():
        raise UsageError(f"termrl: config file {path_text!r} does not exist (e.g. "
                         "experiments/terminal_rsi.py:quick)")
    return path.resolve(), (sep + variant) if sep else ""


def cmd_run(args, rest) -> int:
    """What launch/run.sh runs: experiments/main.py with the config, the workdir and the flags."""
    main_py = ROOT / "experiments" / "main.py"
    if not main_py.is_file():
        raise UsageError(f"termrl run: {main_py} is missing: `termrl run` needs a clone of the "
                         "repository installed with `pip install -e .`")
    bad = [a for a in rest if not a.startswith("--")]
    if bad:
        raise UsageError(f"termrl run: unexpected argument(s) {bad}; overrides are "
                         "--config.FIELD=VALUE")
    path, variant = experiment_path(args.config)
    name = path.stem + (f"_{variant[1:]}" if variant else "")
    workdir = args.workdir or os.environ.get("TR_WORKDIR") or str(ROOT / "workdir" / name)
    argv = [sys.executable, str(main_py), f"--config={path}{variant}", f"--workdir={workdir}", *rest]
    os.environ.setdefault("JAX_PLATFORMS", "cpu")   # as launch/run.sh: the CPU main job
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
    return 0  # not reached


# ------------------------------------------------------------------------------------------------
# eval


def load_tasks(spec: str, *, count: int, seed: int) -> list:
    """The tasks `spec` names: `gym:SPLIT` (`count` instances, `seed`), `builtin`, a task
    directory or a directory of task directories."""
    from tr.envs.tasks import TaskError, load_suite, load_task  # pylint: disable=g-import-not-at-top

    if spec.startswith("gym:"):
        from tr.envs import gym  # pylint: disable=g-import-not-at-top

        split = spec[4:]
        if split not in gym.SPLITS:
            raise UsageError(f"termrl eval: --tasks {spec!r}: gym split must be one of "
                             f"{', '.join('gym:' + s for s in gym.SPLITS)}")
        return list(gym.split_tasks(split, count or None, seed=seed))
    if spec == "builtin":
        return load_suite(None)
    path = pathlib.Path(spec).expanduser()
    if not path.is_dir():
        raise UsageError(f"termrl eval: --tasks {spec!r}: no such directory (a task directory, a "
                         "suite of them, 'builtin', or gym:test / gym:val)")
    try:
        if any((path / name).exists() for name in ("task.toml", "task.yaml", "instruction.md")):
            return [load_task(path)]
        tasks = load_suite(path)
    except TaskError as error:
        raise UsageError(f"termrl eval: --tasks {spec!r}: {' '.join(str(error).split())}") from None
    if not tasks:
        raise UsageError(f"termrl eval: --tasks {spec!r}: no task directories under it")
    return tasks


def headline(summary: dict, k: int) -> dict:
    """The `--json` object: Pass@1 and Mean@k overall, by family and by tier, and the counts."""
    def group(g):
        return {"pass_at_1": g["pass@1"], "mean_at_k": g[f"mean@{k}"], "tasks": g["tasks"],
                "tasks_scored": g["tasks_scored"]}

    return {"pass_at_1": summary["overall"]["pass@1"], "mean_at_k": summary["overall"][f"mean@{k}"],
            "k": k, "episodes": summary["episodes"],
            "by_family": {f: group(g) for f, g in summary["by_family"].items()},
            "by_tier": {t: group(g) for t, g in summary["by_tier"].items()},
            "infra_failures": summary["infra_failures"], "statuses": summary["statuses"]}


def cmd_eval(args) -> int:
    from tr.agent import evaluation  # pylint: disable=g-import-not-at-top
    from tr.stages import checkpoints  # pylint: disable=g-import-not-at-top
    from tr.stages import evaluate as evaluate_job  # pylint: disable=g-import-not-at-top

    if args.k < 1:
        raise UsageError(f"termrl eval: --k {args.k}: must be >= 1")
    if args.concurrency < 1:
        raise UsageError(f"termrl eval: --concurrency {args.concurrency}: must be >= 1")
    spec = checkpoints.parse(args.checkpoint)
    tasks = load_tasks(args.tasks, count=args.count, seed=args.task_seed)
    settings = {"k": args.k, "temperature": args.temperature, "top_p": args.top_p,
                "max_turns": args.max_turns, "max_output_tokens": args.max_output_tokens,
                "context": args.context, "concurrency": args.concurrency}
    out = pathlib.Path(args.out) if args.out else pathlib.Path(tempfile.mkdtemp(prefix="termrl-eval-"))
    name = "checkpoint"
    try:
        if spec.kind == "openai":
            from tr.agent.http_policy import HttpPolicy  # pylint: disable=g-import-not-at-top
            from tr.agent.harness import Budgets  # pylint: disable=g-import-not-at-top

            policy = HttpPolicy(spec.url, spec.model, temperature=args.temperature, top_p=args.top_p,
                                max_parallel=args.concurrency, name=name, source="policy")
            budgets = Budgets(max_output_tokens=args.max_output_tokens, max_turns=args.max_turns,
                              summarise_at_tokens=None)
            summary = evaluation.evaluate({name: policy}, tasks, k=args.k, workdir=out,
                                          backend=args.backend, concurrency=args.concurrency,
                                          budgets=budgets, seed=args.seed, progress=False)[name]
            source = {"spec": spec.text, "kind": "openai"}
        else:
            loaded = checkpoints.load(spec)
            print(f"loaded {checkpoints.describe(loaded)}", file=sys.stderr, flush=True)
            summary = evaluate_job.evaluate_loaded(loaded, tasks, settings, workdir=out,
                                                   seed=args.seed, name=name, backend=args.backend)
            source = dict(loaded.source)
    finally:
        if not args.out:
            import shutil  # pylint: disable=g-import-not-at-top

            shutil.rmtree(out, ignore_errors=True)
    result = {**headline(summary, args.k), "checkpoint": source, "tasks": args.tasks,
              "task_ids": [t.id for t in tasks], "settings": {**settings, "seed": args.seed}}
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(evaluation.format_table({spec.text: summary}))
        if args.out:
            print(f"wrote {out / 'eval.json'} and the episode records", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------------------
# serve, export


def cmd_serve(args) -> int:
    """The checkpoint behind `tr.agent.server.ChatServer` (its own tokenizer and chat layout)."""
    from tr.agent.server import ChatServer  # pylint: disable=g-import-not-at-top
    from tr.stages import checkpoints  # pylint: disable=g-import-not-at-top

    loaded = checkpoints.load(args.checkpoint)
    policy = checkpoints.model_policy(loaded, concurrency=args.slots,
                                      max_new_tokens=args.max_output_tokens,
                                      temperature=args.temperature, top_p=args.top_p,
                                      seed=args.seed, name=args.model_name or loaded.source["spec"])
    try:
        server = ChatServer(policy, policy.layout, host=args.host, port=args.port,
                            model_name=args.model_name or policy.name,
                            max_output_tokens=args.max_output_tokens)
    except OSError as error:
        policy.sampler.close()
        raise UsageError(f"termrl serve: cannot listen on {args.host}:{args.port}: {error}") from None
    print(f"serving {checkpoints.describe(loaded)} as model {server.model_name!r} at {server.url}",
          file=sys.stderr, flush=True)
    try:
        server.serve_until_interrupted()
    finally:
        policy.sampler.close()
    return 0


def cmd_export(args) -> int:
    from tr.stages import checkpoints  # pylint: disable=g-import-not-at-top

    spec = checkpoints.parse(args.checkpoint)
    if spec.kind != "stage":
        raise UsageError(f"termrl export: --checkpoint {args.checkpoint!r}: export takes a stage "
                         "of a run (W/STAGE[@STEP])")
    out = pathlib.Path(args.out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"termrl export: --out {args.out!r} exists and is not an empty folder")
    loaded = checkpoints.load(spec)
    files = checkpoints.export_hf(loaded, out)
    print(f"exported {checkpoints.describe(loaded)} to {out}: {', '.join(files)}; load it back "
          f"as hf:{out}")
    return 0


# ------------------------------------------------------------------------------------------------
# the parser and dispatch


PASSTHROUGH = {"tasks": ("tr.envs.tasks.__main__", "validate, verify and list task directories "
                         "(python -m tr.envs.tasks)"),
               "gym": ("tr.envs.gym.__main__", "write gym instances as task directories, list the "
                       "families (python -m tr.envs.gym)"),
               "rollout": ("tr.agent.rollout", "roll a policy or a checkpoint out over a task "
                           "suite into a record shard (python -m tr.agent.rollout)")}


def build_parser() -> Parser:
    parser = Parser(prog="termrl", description="tr: train, evaluate, export and serve LLM terminal "
                    "agents (Terminal-RSI, ReTerm).",
                    epilog="Checkpoints: W/STAGE[@STEP] (a stage of a run), hf:DIR (a Hugging Face "
                    "folder), openai:URL#MODEL (eval only).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    run = sub.add_parser("run", help="run an experiment config (what launch/run.sh runs)",
                         description="Run experiments/main.py on CONFIG[:VARIANT]; more absl flags "
                         "(--config.FIELD=VALUE, --print_config) are passed through.")
    run.add_argument("config", help="experiments/X.py[:variant]")
    run.add_argument("--workdir", help="outputs (default: $TR_WORKDIR, else workdir/<config name>)")

    ev = sub.add_parser("eval", help="Pass@1 / Mean@k of a checkpoint on tasks, by family and tier",
                        description="Evaluate a checkpoint (W/STAGE[@STEP], hf:DIR, openai:URL#MODEL) "
                        "on tasks (a task directory or suite, 'builtin', gym:test, gym:val).")
    ev.add_argument("--checkpoint", required=True)
    ev.add_argument("--tasks", required=True)
    ev.add_argument("--k", type=int, default=DEFAULT_EVAL["k"], help="attempts per task (Mean@k)")
    ev.add_argument("--count", type=int, default=64, help="gym: instances of the split (0 = default)")
    ev.add_argument("--task-seed", type=int, default=0, help="gym: which instances")
    ev.add_argument("--seed", type=int, default=0, help="episode and sampling seed")
    ev.add_argument("--temperature", type=float, default=DEFAULT_EVAL["temperature"])
    ev.add_argument("--top-p", type=float, default=DEFAULT_EVAL["top_p"])
    ev.add_argument("--max-turns", type=int, default=DEFAULT_EVAL["max_turns"])
    ev.add_argument("--max-output-tokens", type=int, default=DEFAULT_EVAL["max_output_tokens"])
    ev.add_argument("--context", type=int, default=DEFAULT_EVAL["context"],
                    help="an episode's whole context in tokens (0: the sampler's bucket rule)")
    ev.add_argument("--concurrency", type=int, default=DEFAULT_EVAL["concurrency"])
    ev.add_argument("--backend", default="local", help="sandbox backend: local or docker")
    ev.add_argument("--out", help="keep eval.json and the episode records here")
    ev.add_argument("--json", action="store_true", help="print one JSON object")

    serve = sub.add_parser("serve", help="serve a checkpoint as an OpenAI-compatible chat endpoint",
                           description="Serve a checkpoint (W/STAGE[@STEP] or hf:DIR) with "
                           "tr.agent.server.ChatServer.")
    serve.add_argument("--checkpoint", required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--model-name", default="", help="the model id clients send (default: the spec)")
    serve.add_argument("--max-output-tokens", type=int, default=256)
    serve.add_argument("--temperature", type=float, default=DEFAULT_EVAL["temperature"])
    serve.add_argument("--top-p", type=float, default=DEFAULT_EVAL["top_p"])
    serve.add_argument("--slots", type=int, default=16, help="decode rows (requests at once)")
    serve.add_argument("--seed", type=int, default=0)

    export = sub.add_parser("export", help="a stage's actor as a Hugging Face folder",
                            description="Write W/STAGE[@STEP]'s actor as model.safetensors + "
                            "config.json + tokenizer.json (+ tr.json), loadable as hf:DIR.")
    export.add_argument("--checkpoint", required=True)
    export.add_argument("--out", required=True)

    for name, (_, text) in PASSTHROUGH.items():
        sub.add_parser(name, help=text, add_help=False)

    aot = sub.add_parser("aot", help="compile every step of an experiment for a TPU topology "
                         "(python -m tr.train.aot)",
                         description="Ahead-of-time compile each step an experiment config runs "
                         "for a TPU topology; per-chip memory against HBM (tr/train/aot.py).")
    aot.add_argument("--config", required=True, help="experiments/X.py[:variant]")
    aot.add_argument("--topology", default=None, help="v5p-128, v5e-64, v5p:4x4x4, cpu, ...")
    aot.add_argument("--json", action="store_true", help="print the JSON report")
    aot.add_argument("--steps", default="", help="only these steps (comma-separated)")
    return parser


def passthrough(name: str, argv: list[str]) -> int:
    """Today's CLIs, unchanged: their own parsers, help and exit codes."""
    if name == "tasks":
        from tr.envs.tasks.__main__ import main as tasks_main  # pylint: disable=g-import-not-at-top
        return tasks_main(argv)
    if name == "rollout":
        from tr.agent.rollout import main as rollout_main  # pylint: disable=g-import-not-at-top
        return rollout_main(argv, load_checkpoint=rollout_checkpoint)
    from tr.envs.gym.__main__ import main as gym_main  # pylint: disable=g-import-not-at-top
    return gym_main(argv)


def rollout_checkpoint(spec: str, expect_model, concurrency: int, seed: int):
    """`termrl rollout --checkpoint`: (a model policy over the checkpoint's own weights, tokenizer
    and model config, its system prompt); a loader refusal is a ValueError."""
    from tr.stages import checkpoints  # pylint: disable=g-import-not-at-top
    loaded = checkpoints.load(spec, expect_model=expect_model)  # CheckpointError is a ValueError
    policy = checkpoints.model_policy(loaded, concurrency=concurrency, max_new_tokens=256, seed=seed)
    return policy, loaded.system_prompt


def load_experiment(config: str):
    """The ConfigDict of CONFIG[:VARIANT] (its `get_config(variant)`)."""
    import importlib.util  # pylint: disable=g-import-not-at-top

    path, variant = experiment_path(config)
    spec = importlib.util.spec_from_file_location(f"termrl_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        return module.get_config(*([variant[1:]] if variant else []))
    except (ValueError, KeyError, AttributeError) as error:
        raise UsageError(f"termrl: --config={config}: {' '.join(str(error).split())}") from None


def cmd_aot(args) -> int:
    """Each step the experiment runs, compiled for the topology's described devices (tr/train/aot.py),
    with the shapes the recipe's own config implies (`tr.stages.pod_plan.experiment_plan`)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")   # TPU devices are described, not owned
    from tr.stages import pod_plan  # pylint: disable=g-import-not-at-top
    from tr.train import aot  # pylint: disable=g-import-not-at-top

    config = load_experiment(args.config)
    plan = pod_plan.experiment_plan(config)
    topology = args.topology or (plan.aot.topology if "aot" in plan else None)
    if not topology:
        raise UsageError("termrl aot: give --topology (or config.aot.topology)")
    only = tuple(s for s in args.steps.split(",") if s)
    current = []

    def on_step(name):
        current[:] = [name.split(":")[0]]
        print(f"compiling {name} ...", file=sys.stderr, flush=True)

    try:
        report = aot.compile_report(plan, topology, only=only, on_step=on_step)
    except aot.AotError as error:
        raise UsageError(f"termrl aot: {' '.join(str(error).split())}") from None
    except ValueError as error:   # JAX: a shape the mesh cannot split (IndivisibleError), ...
        step = current[0] if current else "?"
        raise UsageError(f"termrl aot: step {step} on {topology}: "
                         f"{' '.join(str(error).split())[:400]}") from None
    report["shapes"] = plan.shapes.to_dict()
    report["model"] = plan.model if isinstance(plan.model, str) else plan.model.to_dict()
    print(json.dumps(report, indent=2) if args.json else aot.format_report(report))
    return 0


def dispatch(argv: list[str]) -> int:
    if argv and argv[0] in PASSTHROUGH:
        return passthrough(argv[0], argv[1:])
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if rest and args.command != "run":
        raise UsageError(f"termrl {args.command}: unrecognized arguments: {' '.join(rest)} "
                         f"(see termrl {args.command} --help)")
    if args.command == "run":
        return cmd_run(args, rest)
    return {"eval": cmd_eval, "serve": cmd_serve, "export": cmd_export,
            "aot": cmd_aot}[args.command](args)


def main(argv=None) -> int:
    """The `termrl` console script."""
    try:
        return dispatch(list(sys.argv[1:] if argv is None else argv))
    except (UsageError, ConfigError) as error:   # checkpoints.CheckpointError is a ConfigError
        sys.stderr.write(f"error: {' '.join(str(error).split())}\n")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
