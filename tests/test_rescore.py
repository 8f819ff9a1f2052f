"""Fixed-trajectory rescoring: metrics against a loop reference, the FDR→SPR audit on a realistic
synthetic set, and the `python -m tr.rewards.rescore` command (subprocess and main())."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tr.rewards import profile, rescore

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "rewards"


def synthetic_trajectories(seed=0, n=3000, n_families=10):
    """A seeded audit-like set: per family a fixed number of scenario checks, a success rate, a
    typical length; failures make partial progress, a few pass every executed check but miss the
    strict gate (a hidden required check), some carry penalty units (negative P possible)."""
    rng = np.random.default_rng(seed)
    checks = rng.integers(4, 25, n_families)
    p_success = rng.uniform(0.15, 0.6, n_families)
    p_gate_miss = np.where(rng.random(n_families) < 0.6, rng.uniform(0.02, 0.08, n_families), 0.0)
    base_turns = rng.uniform(5, 60, n_families)
    rows = []
    for _ in range(n):
        f = int(rng.integers(n_families))
        executed = int(checks[f])
        success = bool(rng.random() < p_success[f])
        if success:
            matched = executed - int(rng.binomial(2, 0.15))  # optional checks may fail
        else:
            draw = rng.random()
            if draw < p_gate_miss[f]:
                matched = executed
            elif draw < p_gate_miss[f] + 0.08:
                matched = executed - 1
            else:
                matched = int(rng.binomial(executed, rng.beta(2, 3)))
            if rng.random() < 0.1:
                matched -= int(rng.integers(1, 4))
        turns = int(max(1, rng.poisson(base_turns[f] * (1.0 if success else 1.3))))
        rows.append({"family": f"family_{f:02d}", "matched": matched, "executed": executed,
                     "strict_pass": success, "turns": turns})
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def linear_quantile(values, q):
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


def reference_report(rows, d, d_prime):
    """Rewards and the report written the obvious way, one trajectory at a time, in float64."""
    out = {}
    for formula in ("fdr", "spr"):
        scored = []
        for r in rows:
            p, s = r["matched"], r["strict_pass"]
            if formula == "fdr":
                reward = max(p / d[r["family"]], 0.0)
            else:
                reward = float(s) + max(p, 0) / (max(p, 0) + d_prime[r["family"]])
            scored.append((reward, s, p == r["executed"] and r["executed"] > 0))
        fails = [x for x, s, _ in scored if not s]
        wins = [x for x, s, _ in scored if s]
        out[formula] = {
            "failure_mass_share": sum(fails) / sum(x for x, _, _ in scored),
            "failures_ge_1": sum(1 for x in fails if x >= 1.0),
            "all_checks_failures": sum(1 for _, s, a in scored if not s and a),
            "mean_success": sum(wins) / len(wins),
            "mean_failure": sum(fails) / len(fails),
            "n_success": len(wins),
            "n_failure": len(fails),
        }
    return out


def assert_reports_close(actual, expected):
    assert set(actual) == set(expected)
    for formula in expected:
        assert set(actual[formula]) == set(rescore.METRIC_KEYS)
        for key, value in expected[formula].items():
            if isinstance(value, int):
                assert actual[formula][key] == value, (formula, key)
            else:
                assert actual[formula][key] == pytest.approx(value, rel=1e-5), (formula, key)


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    rows = synthetic_trajectories()
    path = write_jsonl(tmp_path_factory.mktemp("audit") / "audit.jsonl", rows)
    return rows, path


# ---------------------------------------------------------------- metrics


def test_reward_metrics_on_a_hand_checked_example():
    rewards = np.float32([1.5, 0.9, 1.2, 0.0, 2.0])
    strict = np.array([True, False, False, False, True])
    matched = np.array([4, 3, 5, 0, 6])
    executed = np.array([4, 5, 5, 0, 6])
    report = rescore.reward_metrics(rewards, strict, matched, executed)
    assert report == {
        "failure_mass_share": pytest.approx(2.1 / 5.6, rel=1e-6),
        "failures_ge_1": 1,
        "all_checks_failures": 1,  # 5 == 5; 0 == 0 executed nothing and does not count
        "mean_success": pytest.approx(1.75),
        "mean_failure": pytest.approx(0.7, rel=1e-6),
        "n_success": 2,
        "n_failure": 3,
    }


def test_reward_metrics_without_failures_or_mass_report_none():
    report = rescore.reward_metrics(np.float32([0.0, 0.0]), [True, True], [0, 0], [1, 1])
    assert report["failure_mass_share"] is None
    assert report["mean_failure"] is None and report["mean_success"] == 0.0


def test_unknown_formula_is_rejected(audit):
    rows, path = audit
    trajectories, _ = profile.read_trajectories([path])
    table = profile.build_scale_table(trajectories)
    with pytest.raises(ValueError, match="unknown formula 'dense'"):
        rescore.formula_rewards(trajectories, table, "dense")


# ---------------------------------------------------------------- the audit


def test_profiling_pass_report_matches_loop_reference(audit):
    rows, path = audit
    trajectories, _ = profile.read_trajectories([path])
    table = profile.build_scale_table(trajectories)
    for family in table:
        counts = [r["matched"] for r in rows if r["family"] == family]
        assert table[family]["D"] == pytest.approx(max(1.0, linear_quantile(counts, 0.9)))
    metrics, rewards = rescore.rescore(trajectories, table)
    d = {f: e["D"] for f, e in table.items()}
    d_prime = {f: e["D_prime"] for f, e in table.items()}
    assert_reports_close(metrics, reference_report(rows, d, d_prime))
    assert all(r.dtype == np.float32 for r in rewards.values())


def test_spr_moves_mass_off_failures_and_no_failure_reaches_one(audit):
    rows, path = audit
    trajectories, _ = profile.read_trajectories([path])
    metrics, rewards = rescore.rescore(trajectories, profile.build_scale_table(trajectories))
    fdr, spr = metrics["fdr"], metrics["spr"]
    assert fdr["failure_mass_share"] > spr["failure_mass_share"] + 0.1
    assert fdr["failures_ge_1"] > 0
    assert spr["failures_ge_1"] == 0
    assert 0 < fdr["all_checks_failures"] <= fdr["failures_ge_1"]
    assert spr["mean_success"] >= 1.0 > spr["mean_failure"]
    success = trajectories.strict_pass
    assert rewards["spr"][success].min() >= 1.0 and rewards["spr"][~success].max() < 1.0
    assert fdr["n_failure"] == spr["n_failure"] == sum(not r["strict_pass"] for r in rows)


# ---------------------------------------------------------------- the command


def run_command(*args):
    return subprocess.run(
        [sys.executable, "-m", "tr.rewards.rescore", *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


def test_command_json_and_plot_in_a_subprocess(audit, tmp_path):
    rows, path = audit
    plot = tmp_path / "rewards.png"
    done = run_command(path, "--json", "--plot", plot)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    trajectories, _ = profile.read_trajectories([path])
    table = profile.build_scale_table(trajectories)
    d = {f: e["D"] for f, e in table.items()}
    d_prime = {f: e["D_prime"] for f, e in table.items()}
    assert_reports_close(report, reference_report(rows, d, d_prime))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000


def test_command_reports_bad_input_with_file_and_line_and_no_traceback(tmp_path):
    good = {"family": "a", "matched": 1, "executed": 2, "strict_pass": False, "turns": 3}
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(good) + "\n{not json\n")
    done = run_command(path)
    assert done.returncode == 2
    assert f"{path}:2: not valid JSON" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_main_prints_the_table_and_honours_formula(audit, capsys):
    rows, path = audit
    assert rescore.main([str(path)]) == 0
    out = capsys.readouterr().out
    for key in rescore.METRIC_KEYS:
        assert key in out
    assert "FDR" in out and "SPR" in out and "3000 trajectories" in out
    assert rescore.main([str(path), "--formula", "spr", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report) == ["spr"] and report["spr"]["failures_ge_1"] == 0


BAD_LINES = [
    ("not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"matched": 1, "executed": 2, "strict_pass": true, "turns": 1}', "missing field 'family'"),
    ('{"family": "a", "executed": 2, "strict_pass": true, "turns": 1}', "missing field 'matched'"),
    ('{"family": "a", "matched": 1, "strict_pass": true, "turns": 1}', "missing field 'executed'"),
    ('{"family": "a", "matched": 1, "executed": 2, "turns": 1}', "missing field 'strict_pass'"),
    ('{"family": "a", "matched": 1, "executed": 2, "strict_pass": true}', "missing field 'turns'"),
    ('{"family": "a", "matched": 1, "executed": -1, "strict_pass": true, "turns": 1}',
     "'executed' must be >= 0, got -1"),
    ('{"family": "a", "matched": "3", "executed": 2, "strict_pass": true, "turns": 1}',
     "'matched' must be a number"),
    ('{"family": "a", "matched": NaN, "executed": 2, "strict_pass": true, "turns": 1}',
     "'matched' must be finite"),
    ('{"family": "a", "matched": 1, "executed": 2.5, "strict_pass": true, "turns": 1}',
     "'executed' must be an integer"),
    ('{"family": "a", "matched": 1, "executed": 2, "strict_pass": "yes", "turns": 1}',
     "'strict_pass' must be a boolean"),
    ('{"family": 7, "matched": 1, "executed": 2, "strict_pass": true, "turns": 1}',
     "'family' must be a non-empty string"),
    ('{"family": "a", "matched": 1, "executed": 2, "strict_pass": true, "turns": -2}',
     "'turns' must be an integer >= 0"),
]


@pytest.mark.parametrize("line, message", BAD_LINES)
def test_main_rejects_each_kind_of_bad_line(tmp_path, capsys, line, message):
    good = '{"family": "a", "matched": 1, "executed": 2, "strict_pass": true, "turns": 1}'
    path = tmp_path / "t.jsonl"
    path.write_text(f"{good}\n\n{line}\n")
    assert rescore.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:3: ") and message in err


def test_main_skip_bad_reports_and_skips(tmp_path, capsys):
    rows = [{"family": "a", "matched": m, "executed": 4, "strict_pass": m == 4, "turns": 2}
            for m in (4, 2, 1)]
    lines = [json.dumps(r) for r in rows]
    bad = {"family": "a", "matched": 1, "executed": -3, "strict_pass": False, "turns": 1}
    lines.insert(1, json.dumps(bad))
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert rescore.main([str(path), "--skip-bad", "--json"]) == 0
    captured = capsys.readouterr()
    assert f"skipped {path}:2: field 'executed' must be >= 0, got -3" in captured.err
    assert json.loads(captured.out)["fdr"]["n_failure"] == 2


@pytest.mark.parametrize("content, message", [("", "empty file"), ("\n  \n", "empty file"),
                                              ("oops\n", "no valid trajectory")])
def test_main_rejects_files_without_trajectories(tmp_path, capsys, content, message):
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    args = [str(path), "--skip-bad"] if content.startswith("oops") else [str(path)]
    assert rescore.main(args) == 2
    assert f"error: {path}: {message}" in capsys.readouterr().err


def test_main_rejects_a_missing_file_and_a_family_without_scale(tmp_path, capsys):
    assert rescore.main([str(tmp_path / "absent.jsonl")]) == 2
    assert f"error: {tmp_path / 'absent.jsonl'}: cannot read" in capsys.readouterr().err
    path = write_jsonl(tmp_path / "t.jsonl", [
        {"family": "b", "matched": 1, "executed": 2, "strict_pass": False, "turns": 1}])
    scales = tmp_path / "scales.json"
    scales.write_text(json.dumps({"a": {"D": 2.0, "D_prime": 4.0}}))
    assert rescore.main([str(path), "--scales", str(scales)]) == 2
    assert "no scale for family/families ['b']" in capsys.readouterr().err


def test_main_reads_engine_episode_records(capsys):
    fixture = FIXTURES / "episode_records.jsonl"
    assert rescore.main([str(fixture), "--json"]) == 0
    captured = capsys.readouterr()
    assert f"excluded {fixture}:4: status 'infra_failure' has no agent outcome" in captured.err
    report = json.loads(captured.out)
    assert report["fdr"]["n_success"] == 2 and report["fdr"]["n_failure"] == 3
    assert report["fdr"]["all_checks_failures"] == 1
