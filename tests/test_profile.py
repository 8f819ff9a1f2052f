"""Family profiling: reading trajectory files (flat and engine records), the frozen scale table,
its deterministic JSON, and rewards reproduced from the written table."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tr.rewards import profile, rescore, shaping

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "rewards"


def profiling_rows(seed=1, n=600):
    """Seeded profiling rollouts over 6 families of different sizes, lengths and pass rates."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        f = int(rng.integers(6))
        executed = 3 + 2 * f
        success = bool(rng.random() < 0.3 + 0.1 * f)
        top = executed + 1 if f % 2 else executed - 1  # odd families: failures may pass all
        matched = executed if success else int(rng.integers(-2, top))
        turns = int(rng.integers(1, 10 + 15 * (f % 3)))
        rows.append({"family": f"fam{f}", "matched": matched, "executed": executed,
                     "strict_pass": success, "turns": turns})
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- reading


def test_reads_flat_lines_and_engine_records_from_the_fixture():
    trajectories, skipped = profile.read_trajectories([FIXTURES / "episode_records.jsonl"])
    assert trajectories.families == (
        "files-text", "files-text", "shell-repair", "db-migrate", "db-migrate")
    np.testing.assert_array_equal(trajectories.matched, np.float32([4, 2, -1, 5.5, 0]))
    np.testing.assert_array_equal(trajectories.executed, [4, 2, 3, 7, 0])
    np.testing.assert_array_equal(trajectories.strict_pass, [True, False, False, True, False])
    np.testing.assert_array_equal(trajectories.turns, [6, 2, 4, 12, 1])  # summary turn not counted
    assert [(s.line, s.excluded) for s in skipped] == [(4, True)]


def test_reads_a_record_written_by_the_rollout_engine(tmp_path):
    from tr.agent import records
    from tr.envs import verifier

    result = verifier.VerifierResult(checks=(), matched=3, executed=5, strict_pass=False)
    record = records.EpisodeRecord(
        episode_id="e", task_id="t", family="fam", status=records.EpisodeStatus.TURN_CAP,
        passed=False, matched=3, executed=5, verifier=result.to_dict(),
        turns=[records.TurnRecord(turn=i, kind="command", text="ls") for i in (1, 2, 3)],
    )
    path = tmp_path / "shard.jsonl"
    path.write_text(json.dumps(record.to_json()) + "\n")
    trajectories, _ = profile.read_trajectories([path])
    assert trajectories.families == ("fam",)
    assert (trajectories.matched[0], trajectories.executed[0]) == (3.0, 5)
    assert not trajectories.strict_pass[0] and trajectories.turns[0] == 3


def test_top_level_fields_win_over_nested_ones():
    parsed = profile.parse_trajectory({
        "family": "top", "matched": 1, "executed": 1, "strict_pass": True, "turns": 2,
        "task": {"family": "nested"}, "verifier": {"matched": 9, "executed": 9,
                                                   "strict_pass": False},
    })
    assert parsed == {"family": "top", "matched": 1, "executed": 1, "strict_pass": True,
                      "turns": 2}


def test_reading_several_files_concatenates_and_names_the_bad_one(tmp_path):
    rows = profiling_rows(n=20)
    first = write_jsonl(tmp_path / "a.jsonl", rows[:10])
    second = write_jsonl(tmp_path / "b.jsonl", rows[10:])
    trajectories, _ = profile.read_trajectories([first, second])
    assert trajectories.families == tuple(r["family"] for r in rows)
    (tmp_path / "c.jsonl").write_text(json.dumps(rows[0]) + "\n" + '{"family": ""}\n')
    with pytest.raises(profile.TrajectoryInputError) as error:
        profile.read_trajectories([first, tmp_path / "c.jsonl"])
    assert str(error.value).startswith(f"{tmp_path / 'c.jsonl'}:2: missing field 'family'")


# ---------------------------------------------------------------- the scale table


def test_scale_table_agrees_with_shaping_and_counts_by_hand():
    rows = profiling_rows()
    trajectories = shaping.as_trajectories(rows)
    table = profile.build_scale_table(trajectories)
    families = [r["family"] for r in rows]
    matched = [r["matched"] for r in rows]
    scales = shaping.family_scales(families, matched)
    rules = shaping.recalibration_rules(trajectories, scales)
    primes = shaping.recalibrate(trajectories, scales)
    assert sorted(table) == sorted(set(families))
    assert set(rules.values()) == {"failure_suppression", "long_low_reward", "none"}
    for family, entry in table.items():
        mine = [r for r in rows if r["family"] == family]
        fails = [r for r in mine if not r["strict_pass"]]
        assert entry["D"] == scales[family] and entry["D_prime"] == primes[family]
        assert entry["rule"] == rules[family] and entry["quantile"] == 0.9
        assert (entry["n"], entry["n_failure"]) == (len(mine), len(fails))
        assert entry["n_success"] == len(mine) - len(fails)
        assert entry["mean_turns"] == pytest.approx(np.mean([r["turns"] for r in mine]))
        fdr = [max(r["matched"] / scales[family], 0.0) for r in mine]
        assert entry["mean_reward_fdr"] == pytest.approx(np.mean(fdr), rel=1e-6)
        expected_max = max(max(r["matched"] / scales[family], 0.0) for r in fails)
        assert entry["max_failure_reward_fdr"] == pytest.approx(expected_max, rel=1e-6)
        if entry["rule"] == "failure_suppression":
            assert entry["max_failure_reward_fdr"] >= 1.0


def test_scale_table_threshold_and_quantile_are_arguments():
    rows = profiling_rows()
    loose = profile.build_scale_table(rows, 0.5, failure_threshold=100.0)
    assert all(e["rule"] != "failure_suppression" for e in loose.values())
    assert all(e["quantile"] == 0.5 for e in loose.values())
    scales = shaping.family_scales([r["family"] for r in rows], [r["matched"] for r in rows], 0.5)
    assert {f: e["D"] for f, e in loose.items()} == scales


def test_dumps_is_deterministic_and_sorted():
    table = profile.build_scale_table(profiling_rows())
    text = profile.dumps_scale_table(table)
    shuffled = {f: dict(reversed(list(e.items()))) for f, e in reversed(list(table.items()))}
    assert profile.dumps_scale_table(shuffled) == text
    assert list(json.loads(text)) == sorted(table)
    assert json.loads(text) == table


# ---------------------------------------------------------------- the command and the round trip


def test_command_writes_the_table_and_rescoring_with_it_reproduces_the_rewards(tmp_path, capsys):
    path = write_jsonl(tmp_path / "profile.jsonl", profiling_rows())
    out = tmp_path / "scales.json"
    done = subprocess.run(
        [sys.executable, "-m", "tr.rewards.profile", str(path), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "failure_suppression" in done.stdout and f"wrote {out}" in done.stdout
    first = out.read_bytes()
    assert profile.main([str(path), "--out", str(out)]) == 0
    assert out.read_bytes() == first  # byte-identical on a second run

    trajectories, _ = profile.read_trajectories([path])
    frozen = profile.load_scale_table(out)
    assert frozen == profile.build_scale_table(trajectories)
    for formula in rescore.FORMULAS:
        np.testing.assert_array_equal(
            rescore.formula_rewards(trajectories, frozen, formula),
            rescore.formula_rewards(trajectories, profile.build_scale_table(trajectories), formula),
        )
    capsys.readouterr()
    assert rescore.main([str(path), "--json"]) == 0
    profiled = capsys.readouterr().out
    assert rescore.main([str(path), "--json", "--scales", str(out)]) == 0
    assert capsys.readouterr().out == profiled


def test_command_without_out_prints_the_json(tmp_path, capsys):
    path = write_jsonl(tmp_path / "p.jsonl", profiling_rows(n=50))
    assert profile.main([str(path), "--quantile", "0.75"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert all(e["quantile"] == 0.75 for e in table.values())


def test_command_rejects_bad_input_and_a_bad_quantile(tmp_path, capsys):
    path = tmp_path / "p.jsonl"
    bad = {"family": "a", "matched": 1, "executed": -1, "strict_pass": True, "turns": 1}
    path.write_text(json.dumps(bad) + "\n")
    assert profile.main([str(path), "--out", str(tmp_path / "s.json")]) == 2
    assert f"error: {path}:1: field 'executed' must be >= 0, got -1" in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()
    with pytest.raises(SystemExit) as error:
        profile.main([str(path), "--quantile", "1.5"])
    assert error.value.code == 2


@pytest.mark.parametrize("content, message", [
    ("{", "not valid JSON"),
    ("[]", "must be a non-empty JSON object"),
    ('{"a": {"D": 2.0}}', "family 'a': 'D_prime' must be a number, got None"),
    ('{"a": {"D": 0, "D_prime": 1.0}}', "family 'a': 'D' must be finite and > 0, got 0"),
    ('{"a": 3.0}', "family 'a': expected an object"),
])
def test_bad_scale_tables_are_rejected_by_name(tmp_path, capsys, content, message):
    scales = tmp_path / "scales.json"
    scales.write_text(content)
    with pytest.raises(profile.TrajectoryInputError, match=message):
        profile.load_scale_table(scales)
    data = write_jsonl(tmp_path / "t.jsonl", [
        {"family": "a", "matched": 1, "executed": 2, "strict_pass": True, "turns": 1}])
    assert rescore.main([str(data), "--scales", str(scales)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {scales}") and message in err
