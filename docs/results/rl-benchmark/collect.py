"""Builds docs/results/rl-benchmark/curves.json and curves.png from the benchmark runs' stdout logs
(the runs were stopped before their end, so their own curve.json was never written)."""
import json, pathlib, re, sys  # noqa: E401
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from bench import rl_learning

out = pathlib.Path(__file__).resolve().parent
results = []
for agg in ("token_mean", "sequence_mean"):
    text = (out / f"grpo-{agg}.log").read_text()
    before = re.search(r"before: val ([\d.]+)  test ([\d.]+)", text)
    after = re.search(r"after:  val ([\d.]+)  test ([\d.]+)", text)
    curve = []
    for m in re.finditer(r"batch +(\d+): pass ([\d.]+)  family-balanced ([\d.]+)  groups kept (\d+) "
                         r"\(uniform dropped (\d+)\)  kl (\S+)  (\d+) s", text):
        curve.append({"batch": int(m[1]), "pass": float(m[2]), "pass_family_balanced": float(m[3]),
                      "groups_kept": int(m[4]), "approx_kl": float(m[6]), "wall_s": float(m[7])})
    ev = lambda m, i: {"pass@1": float(m[i]) if m else None}
    results.append({"args": {"algo": "grpo", "aggregation": agg, "families": "copy-keep",
                             "tasks": 8, "group_size": 8, "lr": 1e-4, "seed": 0,
                             "batches_planned": 14, "val_tasks": 32, "test_tasks": 32,
                             "eval_temperature": 0.6},
                    "before": {"val": ev(before, 1), "test": ev(before, 2)},
                    "after": {"val": ev(after, 1), "test": ev(after, 2)},
                    "curve": curve, "partial": after is None})
(out / "curves.json").write_text(json.dumps({"base": "c73a28c7 (default main job, seed 0)",
                                             "host": rl_learning.host(), "runs": results},
                                            indent=1, sort_keys=True))
rl_learning.plot(results, out / "curves.png")
for r in results:
    print(r["args"]["aggregation"], [c["pass"] for c in r["curve"]], r["before"], r["after"])
