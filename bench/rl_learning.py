"""RL learning benchmark: does the library's RL step raise the pass rate of the shipped Base?

The project's sanity check for changes to the RL path (issue 46): run by hand, not a timed test
(`tests/test_rl_learning.py` runs the `--quick` form: 2 batches, a few tasks, the files sane).

    base      the Base of RUN (`RUN/base`, a finished `experiments/base_policy.py` or main-job run
              directory; made there with `--base_variant` when RUN has none)
    before    val and test Pass@1 of the Base on the chosen families (temperature 0.6, top-p 0.95)
    batches   `--batches` rollout batches from `train`: `--tasks` tasks x `--group_size` rollouts at
              temperature 1 (strict reward: the verifier's pass), one library `grpo` update per
              batch (`tr.train.updates.grpo_update`, groups of `--group_size`, equal group weights,
              `--aggregation`, lr `--lr`); with `--dynamic_sampling`, uniform groups (all pass or
              all fail) are dropped and replaced from `--oversample` extra groups (DAPO)
    after     val and test Pass@1 again
    output    per batch on stdout and in WORKDIR/curve.json (rewritten after every batch,
              `"partial": true` until the end): the training pass rate, the
              family-balanced pass rate (each family present weighs the same, so a batch's family
              mix does not move it), groups dropped, approx KL, tokens per episode, wall seconds;
              WORKDIR/curve.png (matplotlib)

Run (from the repository root; the issue's single-family reference: 0.40 -> 0.69 in 18 updates):
    nice -n 5 .venv/bin/python bench/rl_learning.py --run=/tmp/rlb --workdir=/tmp/rlb/grpo-tm \
        --families=copy-keep --batches=18 --aggregation=token_mean
    --families=all: every training family.  --quick: the test's tiny form.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tr.rl.losses import AGGREGATIONS  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=pathlib.Path, required=True,
                   help="directory holding (or to hold) the Base stage `base/`")
    p.add_argument("--workdir", type=pathlib.Path, required=True, help="curve.json, curve.png")
    p.add_argument("--base_variant", default="default",
                   help="experiments/base_policy.py variant made in RUN when it has no Base")
    p.add_argument("--algo", default="grpo", choices=("grpo",))
    p.add_argument("--families", default="copy-keep",
                   help="comma-separated gym families, or 'all' (every training family)")
    p.add_argument("--batches", type=int, default=18)
    p.add_argument("--tasks", type=int, default=8, help="tasks per batch")
    p.add_argument("--group_size", type=int, default=8, help="rollouts per task")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--aggregation", default="token_mean", choices=AGGREGATIONS)
    p.add_argument("--aggregation_constant", type=float, default=0.0)
    p.add_argument("--dynamic_sampling", action="store_true")
    p.add_argument("--oversample", type=int, default=0, help="extra groups per batch (DAPO pool)")
    p.add_argument("--val_tasks", type=int, default=32)
    p.add_argument("--test_tasks", type=int, default=32)
    p.add_argument("--eval_temperature", type=float, default=0.6)
    p.add_argument("--max_turns", type=int, default=5)
    p.add_argument("--length", type=int, default=1024, help="row length of the update")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="2 batches of 2 tasks x 2 rollouts, 2 val/test tasks, Base variant quick")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.tasks, args.group_size = 2, 2, 2
        args.val_tasks = args.test_tasks = 2
        args.base_variant = "quick"
    for name in ("batches", "tasks", "group_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def families_of(spec: str) -> list[str]:
    """The training families `spec` names ('all': every family but the held-out one)."""
    from tr.envs import gym

    train = sorted(f for f in gym.FAMILIES if f != gym.HELDOUT_FAMILY)
    if spec == "all":
        return train
    names = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [n for n in names if n not in train]
    if bad or not names:
        raise SystemExit(f"error: --families={spec!r}: {bad or 'none'} not among the training "
                         f"families {train}")
    return names


def ensure_base(run: pathlib.Path, variant: str) -> None:
    """RUN/base (a finished Base stage), made with experiments/base_policy.py:VARIANT if absent."""
    if (run / "base" / "summary.json").exists():
        return
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))
    import base_policy  # pylint: disable=import-outside-toplevel

    from tr.stages import base

    print(f"no Base in {run}: making one (experiments/base_policy.py:{variant})", flush=True)
    run.mkdir(parents=True, exist_ok=True)
    config = base_policy.get_config(variant)
    config.seed = 0
    base.run(config, run)


def family_balanced(records) -> float | None:
    """Mean over the families present of each family's pass rate (counted episodes)."""
    by_family: dict[str, list[bool]] = {}
    for r in records:
        if r.status.counts:
            by_family.setdefault(r.family, []).append(bool(r.passed))
    return float(np.mean([np.mean(v) for v in by_family.values()])) if by_family else None


def pass_rate(records) -> float | None:
    xs = [bool(r.passed) for r in records if r.status.counts]
    return float(np.mean(xs)) if xs else None


def evaluate(rt, params, tasks, *, config, seed: int, name: str) -> dict:
    """Pass@1 (one episode per task) at the eval temperature, overall and per family."""
    from tr.agent.rollout import group_specs, run_rollouts
    from tr.stages import reterm

    rt.actor.set_params(params)
    policy = rt.actor.policy(temperature=float(config.eval.temperature),
                             top_p=float(config.eval.top_p), seed=seed, name=name)
    out = run_rollouts(group_specs(tasks, 1, seed=seed, prefix=name), policy, policy.layout,
                       reterm.rollout_config(config, policy, rt.system_prompt))
    by_family: dict[str, list[bool]] = {}
    for r in out.records:
        if r.status.counts:
            by_family.setdefault(r.family, []).append(bool(r.passed))
    return {"pass@1": pass_rate(out.records), "episodes": sum(map(len, by_family.values())),
            "by_family": {f: float(np.mean(v)) for f, v in sorted(by_family.items())}}


def rollout_groups(rt, params, tasks, *, config, group_size: int, seed: int, prefix: str):
    """`group_size` rollouts at temperature 1 of every task, as (kind, records) groups."""
    from tr.agent.rollout import group_specs, run_rollouts
    from tr.stages import reterm

    rt.actor.set_params(params)
    policy = rt.actor.policy(temperature=1.0, top_p=1.0, seed=seed, name=prefix)
    out = run_rollouts(group_specs(tasks, group_size, seed=seed, prefix=prefix), policy,
                       policy.layout, reterm.rollout_config(config, policy, rt.system_prompt))
    grouped: dict[str, list] = {}
    for rec in out.records:
        grouped.setdefault(rec.group_id, []).append(rec)
    return [("original", recs) for _, recs in sorted(grouped.items())]


def grpo_step(rt, args):
    from tr.stages.reterm import MICRO_BATCH_ROWS
    from tr.train.compile import build_steps
    from tr.train.updates import default_config

    cfg = default_config()
    cfg.micro_batch_rows = MICRO_BATCH_ROWS
    cfg.actor.optimizer.learning_rate = float(args.lr)
    cfg.grpo.update(group_size=int(args.group_size), aggregation=args.aggregation,
                    aggregation_constant=float(args.aggregation_constant))
    return build_steps(cfg, actor_logprobs=rt.fns.actor_logprobs).grpo


def run(args) -> dict:
    import jax
    import ml_collections

    from tr.agent.dynamic_sampling import has_signal, select_groups
    from tr.envs import gym
    from tr.stages import reterm
    from tr.stages.splits import iteration_tasks
    from tr.train.optim import make_optimizer
    from tr.train.state import create_train_state
    from tr.train.updates import default_config

    families = families_of(args.families)
    ensure_base(args.run, args.base_variant)
    args.workdir.mkdir(parents=True, exist_ok=True)
    config = ml_collections.ConfigDict({
        "concurrency": 16,
        "eval": {"temperature": args.eval_temperature, "top_p": 0.95, "max_turns": args.max_turns,
                 "max_output_tokens": 64, "context": 0}})
    rt = reterm.runtime(reterm.parent_manifest(args.run, "base"), concurrency=16,
                        max_output_tokens=64)
    params = reterm.load_params(args.run, "base", rt)
    opt = default_config().actor.optimizer
    opt.learning_rate = float(args.lr)
    state = create_train_state(actor_params=params, actor_optimizer=make_optimizer(opt),
                               seed=args.seed)
    step = grpo_step(rt, args)
    train = gym.split_tasks("train", None, seed=0, families=families)
    val = gym.split_tasks("val", args.val_tasks, seed=0, families=families)
    test = gym.split_tasks("test", args.test_tasks, seed=0, families=families)
    print(f"families {families}: {len(train)} train, {len(val)} val, {len(test)} test tasks; "
          f"{args.algo} aggregation={args.aggregation} lr={args.lr} "
          f"{args.tasks} tasks x {args.group_size} rollouts, {args.batches} batches", flush=True)
    t0 = time.monotonic()
    before = {"val": evaluate(rt, state.actor_params, val, config=config, seed=10_000, name="val0"),
              "test": evaluate(rt, state.actor_params, test, config=config, seed=20_000,
                               name="test0")}
    print(f"before: val {before['val']['pass@1']:.3f}  test {before['test']['pass@1']:.3f}",
          flush=True)
    curve = []
    extra = int(args.oversample) if args.dynamic_sampling else 0
    for b in range(args.batches):
        tb = time.monotonic()
        seed = args.seed * 7919 + b + 1
        picked = iteration_tasks(train, b, args.tasks + extra, args.seed)
        groups = rollout_groups(rt, state.actor_params, picked, config=config,
                                group_size=args.group_size, seed=seed, prefix=f"b{b}")
        records = [r for _, recs in groups for r in recs]
        uniform = sum(not has_signal(recs) for _, recs in groups)
        dropped_uniform = 0
        if args.dynamic_sampling:
            groups, dropped_uniform = select_groups(groups, args.tasks)
        batch, kept, dropped = reterm.group_rows(groups, length=args.length,
                                                 group_size=args.group_size,
                                                 rows=args.tasks * args.group_size)
        metrics = {}
        if batch is not None:
            state, m = step(state, batch)
            metrics = {k: float(v) for k, v in jax.device_get(m).items()}
        trained = [r for _, recs in kept for r in recs]
        line = {
            "batch": b + 1, "episodes": len(records), "pass": pass_rate(records),
            "pass_family_balanced": family_balanced(records),
            "trained_pass": pass_rate(trained), "groups_kept": len(kept),
            "groups_dropped": dropped, "groups_uniform": uniform,
            "groups_dropped_uniform": dropped_uniform,
            "tokens_per_episode": float(np.mean([sum(len(s.tokens) for s in r.segments
                                                     if s.kind == "action") for r in records]))
            if records else 0.0,
            "approx_kl": metrics.get("actor/approx_kl"), "grad_norm": metrics.get("actor/grad_norm"),
            "advantage_token_mean": metrics.get("actor/advantage"),
            "wall_s": time.monotonic() - tb,
        }
        curve.append(line)
        partial = {"args": _jsonable(vars(args)), "families": families, "before": before,
                   "curve": curve, "partial": True}
        (args.workdir / "curve.json").write_text(json.dumps(partial, indent=1, sort_keys=True))
        print(f"batch {b + 1:3d}: pass {line['pass']:.3f}  family-balanced "
              f"{line['pass_family_balanced']:.3f}  groups kept {len(kept)} "
              f"(uniform dropped {dropped_uniform})  kl {line['approx_kl']}  "
              f"{line['wall_s']:.0f} s", flush=True)
    after = {"val": evaluate(rt, state.actor_params, val, config=config, seed=10_000, name="val1"),
             "test": evaluate(rt, state.actor_params, test, config=config, seed=20_000,
                              name="test1")}
    print(f"after:  val {after['val']['pass@1']:.3f}  test {after['test']['pass@1']:.3f}",
          flush=True)
    result = {"args": _jsonable(vars(args)),
              "families": families, "base_summary": str(args.run / "base" / "summary.json"),
              "before": before, "after": after, "curve": curve, "wall_s": time.monotonic() - t0,
              "host": host()}
    (args.workdir / "curve.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    plot([result], args.workdir / "curve.png")
    return result


def _jsonable(args: dict) -> dict:
    return {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in args.items()}


def host() -> dict:
    cpu = ""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "load_1min": os.getloadavg()[0]}


def plot(results: list[dict], path: pathlib.Path) -> None:
    """Training pass rate per batch (solid) and family-balanced (dashed), one colour per run;
    val before/after as markers at the ends."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=90)
    for i, res in enumerate(results):
        colour = f"C{i}"
        xs = [c["batch"] for c in res["curve"]]
        label = f"{res['args']['algo']} {res['args']['aggregation']}"
        ax.plot(xs, [c["pass"] for c in res["curve"]], color=colour, label=f"{label} train")
        ax.plot(xs, [c["pass_family_balanced"] for c in res["curve"]], color=colour,
                linestyle="--", alpha=0.6)
        vb, va = res["before"]["val"]["pass@1"], res["after"]["val"]["pass@1"]
        if vb is not None and va is not None:
            ax.plot([0, xs[-1] if xs else 1], [vb, va], color=colour, marker="o", linestyle=":",
                    label=f"{label} val {vb:.2f}->{va:.2f}")
    ax.set_xlabel("update (rollout batch)")
    ax.set_ylabel("pass rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
