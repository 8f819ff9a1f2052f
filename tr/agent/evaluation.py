"""Evaluation (SPEC §6): run a suite ``k`` times per policy, report Mean@k and Pass@1 by family and
tier, write ``eval.json`` and a readable ``eval.txt`` to the work directory.

Definitions (infrastructure failures are excluded from every denominator and counted apart):

* ``Mean@k`` = (1/|T|) Σ_x (1/k_x) Σ_r S(x, r): each task's success rate over its ``k`` attempts
  (``k_x`` valid ones), averaged over tasks — the paper's "success rate Mean@3".
* ``Pass@1`` = (1/|T|) Σ_x S(x, r_x): the first valid attempt of each task.

``S`` is the verifier's strict pass on the final state, whatever ended the episode (DONE or a
budget).  Breakdowns average over the tasks of one family / one tier.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from tr.agent.harness import Budgets, EpisodeSpec
from tr.agent.policies import Policy
from tr.agent.policies import ScriptedPolicy, load_model_policy
from tr.agent.records import EpisodeRecord, write_shard
from tr.agent.rollout import RolloutConfig, run_rollouts
from tr.agent.transcript import ChatLayout
from tr.envs.tasks import load_suite
from tr.models.tokenizer import ByteTokenizer


def eval_specs(tasks: Sequence, k: int, *, seed: int = 0) -> list[EpisodeSpec]:
    """``k`` attempts per task, attempt ``r`` seeded ``seed + r``; run-major order."""
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    return [EpisodeSpec(task=t, episode_id=f"eval-{t.id}-{r}", group_id=f"eval-{t.id}",
                        rollout_index=r, seed=seed + r)
            for r in range(k) for t in tasks]


def summarise(records: Sequence[EpisodeRecord], tasks: Sequence, k: int) -> dict:
    """Mean@k and Pass@1 overall / by family / by tier, plus counts (pure: records in, dict out)."""
    by_task: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for r in records:
        by_task[r.task_id].append(r)
    per_task = {}
    for t in tasks:
        recs = sorted(by_task.get(t.id, []), key=lambda r: r.rollout_index)
        valid = [r for r in recs if r.status.counts]
        passes = [bool(r.passed) for r in valid]
        per_task[t.id] = {
            "family": t.family, "tier": t.tier, "attempts": len(recs), "valid": len(valid),
            "passes": passes, "statuses": [r.status.value for r in recs],
            "mean_at_k": sum(passes) / len(passes) if passes else None,
            "pass_at_1": float(passes[0]) if passes else None,
            "mean_turns": (sum(r.num_turns for r in valid) / len(valid)) if valid else None,
            "mean_matched": (sum((r.matched or 0.0) for r in valid) / len(valid)) if valid else None,
        }

    def group(ids: list[str]) -> dict:
        scored = [per_task[i] for i in ids if per_task[i]["valid"] > 0]
        n = len(scored)
        return {
            "tasks": len(ids), "tasks_scored": n,
            f"mean@{k}": sum(s["mean_at_k"] for s in scored) / n if n else None,
            "pass@1": sum(s["pass_at_1"] for s in scored) / n if n else None,
        }

    families = sorted({t.family for t in tasks})
    tiers = [x for x in ("easy", "medium", "hard", "extreme") if any(t.tier == x for t in tasks)]
    statuses = Counter(r.status.value for r in records)
    valid = [r for r in records if r.status.counts]
    return {
        "k": k,
        "overall": group([t.id for t in tasks]),
        "by_family": {f: group([t.id for t in tasks if t.family == f]) for f in families},
        "by_tier": {x: group([t.id for t in tasks if t.tier == x]) for x in tiers},
        "episodes": len(records),
        "infra_failures": statuses.get("infra_failure", 0),
        "statuses": dict(sorted(statuses.items())),
        "format_errors": sum(r.format_errors for r in records),
        "mean_turns": sum(r.num_turns for r in valid) / len(valid) if valid else None,
        "tasks": per_task,
        "infra_errors": sorted({((r.error or "").splitlines() or [""])[0] for r in records
                                if r.status.value == "infra_failure"})[:20],
    }


def _default_layout() -> ChatLayout:
    return ChatLayout(ByteTokenizer())


def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def format_table(results: Mapping[str, dict]) -> str:
    """A readable table: one block per policy, rows overall / family / tier.  ``tasks`` reads
    ``scored/all`` when some tasks had only infrastructure failures (excluded)."""
    lines = []
    for name, res in results.items():
        k = res["k"]
        lines.append(f"policy: {name}   (k={k}, episodes={res['episodes']}, "
                     f"infra failures={res['infra_failures']}, format errors={res['format_errors']})")
        lines.append(f"  {'group':<28} {'tasks':>7}  {f'Mean@{k}':>8}  {'Pass@1':>7}")
        rows = [("overall", res["overall"])]
        rows += [(f"family {f}", v) for f, v in res["by_family"].items()]
        rows += [(f"tier {t}", v) for t, v in res["by_tier"].items()]
        for label, v in rows:
            scored = f"{v['tasks_scored']}/{v['tasks']}" if v["tasks_scored"] != v["tasks"] else str(v["tasks"])
            lines.append(f"  {label:<28} {scored:>7}  {_pct(v[f'mean@{k}']):>8}  {_pct(v['pass@1']):>7}")
        lines.append(f"  statuses: {res['statuses']}")
        lines.append("")
    return "\n".join(lines)


def evaluate(
    policies: Policy | Mapping[str, Policy],
    tasks: Sequence,
    *,
    k: int = 3,
    workdir: str | os.PathLike,
    layout: ChatLayout | None = None,
    backend: str = "local",
    concurrency: int = 4,
    budgets: Budgets | Mapping[str, Budgets] = Budgets(),
    seed: int = 0,
    progress: bool | None = None,
    sandbox_config=None,
    docker_endpoints: Sequence[str] = (),
    system_prompt: str | None = None,
) -> dict:
    """Evaluates each policy on ``tasks`` (``k`` attempts each) with its budgets (one ``Budgets`` for
    all, or a mapping policy name → ``Budgets``); writes ``workdir/eval.json``
    (all numbers + per task), ``workdir/eval.txt`` (the table) and the episode records
    ``workdir/episodes-<policy>.jsonl``.  ``system_prompt``: the episodes' system message (None:
    the harness's ``SYSTEM_PROMPT``).  ``docker_endpoints``: the Docker engines to spread
    sandboxes over (:class:`RolloutConfig`).  Returns ``{policy name: summary}``."""
    if not tasks:
        raise ValueError("evaluate: no tasks")
    if not isinstance(policies, Mapping):
        policies = {policies.name: policies}
    os.makedirs(workdir, exist_ok=True)
    results = {}
    for name, policy in policies.items():
        if isinstance(budgets, Mapping) and name not in budgets:
            raise ValueError(f"evaluate: no budgets for policy {name!r} (have {sorted(budgets)})")
        config = RolloutConfig(backend=backend, concurrency=concurrency, progress=progress,
                               budgets=budgets[name] if isinstance(budgets, Mapping) else budgets,
                               sandbox_config=sandbox_config,
                               docker_endpoints=tuple(docker_endpoints))
        if system_prompt is not None:
            config.system_prompt = system_prompt
        policy_layout = getattr(policy, "layout", None) or layout or _default_layout()
        out = run_rollouts(eval_specs(tasks, k, seed=seed), policy, policy_layout, config)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        write_shard(out.records, os.path.join(workdir, f"episodes-{safe}.jsonl"))
        res = summarise(out.records, tasks, k)
        res["wall_s"] = out.wall_s
        res["backend"] = backend
        results[name] = res
    write_results(results, workdir)
    return results


def write_results(results: Mapping[str, dict], workdir: str | os.PathLike) -> None:
    """``workdir/eval.json`` (all numbers + per task) and ``workdir/eval.txt`` (the table)."""
    with open(os.path.join(workdir, "eval.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, sort_keys=True)
    with open(os.path.join(workdir, "eval.txt"), "w", encoding="utf-8") as f:
        f.write(format_table(results))


def build_policies(names: Sequence[str], tasks: Sequence, *, seed: int = 0,
                   max_turns: int | None = None, model_max_turns: int | None = None,
                   model_output_tokens: int = 256) -> tuple[dict[str, Policy], dict[str, Budgets]]:
    """Policies by name with the budgets each needs: 'scripted' (the reference-solution teacher,
    the task's own turn cap unless `max_turns`) or a model size such as 'tiny' (untrained; budgets
    that fit its sampler, turns capped at `model_max_turns`, else `max_turns`)."""

    policies, budgets = {}, {}
    for name in names:
        if name == "scripted":
            policies[name] = ScriptedPolicy(tasks, seed=seed)
            budgets[name] = Budgets(max_turns=max_turns)
        else:
            policy = load_model_policy(name, seed=seed)
            policies[name] = policy
            budgets[name] = policy.budgets(model_output_tokens,
                                           max_turns=model_max_turns or max_turns)
    return policies, budgets


def main(argv=None) -> int:
    """``python -m tr.agent.evaluation --policies scripted tiny --k 3 --workdir DIR``."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m tr.agent.evaluation",
                                description="Mean@k / Pass@1 of policies on a task suite")
    p.add_argument("--policies", nargs="+", default=["scripted", "tiny"],
                   help="'scripted' (reference-solution teacher) and/or a model size ('tiny', untrained)")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--workdir", required=True)
    p.add_argument("--suite", default=None, help="task suite directory (default: built-in)")
    p.add_argument("--tasks", nargs="*", default=None, help="only these task ids")
    p.add_argument("--backend", default="local", choices=("local", "docker"))
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=None, help="cap on turns (default: the task's)")
    p.add_argument("--model-output-tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    tasks = load_suite(args.suite)
    if args.tasks:
        unknown = sorted(set(args.tasks) - {t.id for t in tasks})
        if unknown:
            p.error(f"--tasks: unknown task id(s) {unknown}")
        tasks = [t for t in tasks if t.id in set(args.tasks)]
    policies, budgets = build_policies(args.policies, tasks, seed=args.seed,
                                       max_turns=args.max_turns,
                                       model_output_tokens=args.model_output_tokens)
    results = evaluate(policies, tasks, k=args.k, workdir=args.workdir,
                       backend=args.backend, concurrency=args.concurrency, budgets=budgets,
                       seed=args.seed)
    print(format_table(results))
    print(f"wrote {os.path.join(args.workdir, 'eval.json')} and eval.txt", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
