"""The gym (tr/envs/gym): families, splits, and every family's attempts run for real.

Each family, for `TR_GYM_SEEDS` seeds (default 2; the report's soak ran more), in real local
sandboxes through the real protected verifier: the reference and the repair commands pass
strictly, from the initial state and after the family's plausible mistake; doing nothing passes no
scenario check; the partial attempt and the mistake alone land strictly in between.
"""

import json
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tr.envs import gym
from tr.envs.backends import make_sandbox
from tr.envs.tasks import TIERS, load_suite, load_task, prepare, sandbox_config, verify
from tr.envs.tasks import model as task_model

SEEDS = int(os.environ.get("TR_GYM_SEEDS", "2"))
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="module")
def gym_cache(tmp_path_factory):
    old = os.environ.get("TR_GYM_DIR")
    os.environ["TR_GYM_DIR"] = str(tmp_path_factory.mktemp("gym-cache"))
    yield
    if old is None:
        os.environ.pop("TR_GYM_DIR")
    else:
        os.environ["TR_GYM_DIR"] = old


def test_families_cover_tiers_observation_and_undo():
    fams = list(gym.FAMILIES.values())
    assert len(fams) >= 8
    assert {f.tier for f in fams} == set(TIERS)
    assert sum(f.observes for f in fams) >= 3
    assert sum(f.undo for f in fams) >= 2
    assert gym.HELDOUT_FAMILY in gym.FAMILIES


@pytest.mark.parametrize("family", sorted(gym.FAMILIES))
def test_instances_are_short_and_have_checks(family):
    for seed in range(20):
        inst = gym.instance(family, seed)
        assert len(inst.instruction.encode()) <= 300
        assert 1 <= len(inst.solution) <= 4 and 1 <= len(inst.repair) <= 4
        assert inst.mistakes and inst.partial
        task = gym.make_task(family, seed)
        assert task.instruction.strip() == inst.instruction
        assert task_model.split_turns(task.solution.read_text()) == list(inst.solution)
        names = task_model.test_functions(task.tests_dir / "test_checks.py")
        scenario = [n for n in names if not n.startswith("test_penalty_")]
        assert "test_final_gate" in scenario and len(scenario) >= 4    # >= 3 checks + the gate
        assert task.verifier.final_gate == "test_final_gate"
        assert gym.instance(family, seed) == inst                     # pure in (family, seed)


def test_splits_are_disjoint_deterministic_and_hold_a_family_out():
    pairs = {s: gym.split_seeds(s, 160) for s in gym.SPLITS}
    prints = {s: {gym.fingerprint(f, gym.instance(f, n)) for f, n in p} for s, p in pairs.items()}
    assert all(len(v) == 160 for v in prints.values())             # no duplicate inside a split
    for a in gym.SPLITS:
        for b in gym.SPLITS:
            if a < b:
                assert not prints[a] & prints[b], (a, b)
    assert gym.HELDOUT_FAMILY not in {f for f, _ in pairs["train"]}
    assert gym.HELDOUT_FAMILY in {f for f, _ in pairs["test"]}
    assert gym.split_seeds("val", 40) == pairs["val"][:40]          # a prefix, deterministic
    assert Counter(f for f, _ in pairs["val"]) == Counter({f: 20 for f in gym.FAMILIES})
    other = gym.split_seeds("test", 16, seed=1)
    assert all(n >= gym.SEED_STRIDE for _, n in other)
    with pytest.raises(ValueError, match="held out"):
        gym.split_seeds("train", 4, families=[gym.HELDOUT_FAMILY])
    with pytest.raises(ValueError, match="unknown gym family"):
        gym.split_seeds("val", 4, families=["nope"])


def _play(task, commands):
    with make_sandbox("local", sandbox_config(task)) as box:
        prepare(task, box)
        for command in commands:
            box.run(command, timeout_s=20)
        return verify(task, box)


def _describe(name, result):
    checks = ", ".join(f"{c.name}={c.outcome}" for c in result.checks)
    return f"{name}: P={result.matched} S={result.strict_pass} err={result.error} [{checks}]\n{result.log[-600:]}"


@pytest.mark.parametrize("family", sorted(gym.FAMILIES))
def test_reference_passes_partial_between_nothing_nothing(family):
    jobs = []
    for seed in range(SEEDS):
        task = gym.make_task(family, seed)
        inst = gym.instance(family, seed)
        mistake = [inst.mistakes[seed % len(inst.mistakes)]]
        attempts = {"solution": inst.solution, "repair": inst.repair, "none": (),
                    "partial": inst.partial, "mistake": mistake,
                    "mistake+repair": mistake + gym.repair_commands(task)}
        jobs += [(task, name, list(cmds)) for name, cmds in attempts.items()]
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda j: _play(j[0], j[2]), jobs))
    by_task = {}
    for (task, name, _), result in zip(jobs, results):
        assert result.error is None, _describe(name, result)
        by_task.setdefault(task.id, {})[name] = result
    for tid, r in by_task.items():
        for name in ("solution", "repair", "mistake+repair"):
            assert r[name].strict_pass and r[name].matched == r[name].executed, _describe(name, r[name])
        assert r["none"].matched == 0 and not r["none"].strict_pass, _describe("none", r["none"])
        assert all(c.passed for c in r["none"].checks if c.penalty)
        for name in ("partial", "mistake"):
            assert not r[name].strict_pass, _describe(name, r[name])
        assert 0 < r["partial"].matched < r["solution"].matched, _describe("partial", r["partial"])
        if gym.FAMILIES[family].undo:   # the mistake destroyed an input: a penalty check fails
            assert any(c.penalty and not c.passed for c in r["mistake"].checks), \
                _describe("mistake", r["mistake"])


def test_cli_writes_dirs_the_task_tools_accept(tmp_path):
    out = tmp_path / "tasks"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = lambda *a: subprocess.run([sys.executable, *a], capture_output=True, text=True, env=env,
                                    cwd=ROOT, timeout=120)
    proc = run("-m", "tr.envs.gym", "write", str(out), "--split", "test", "--count", "16")
    assert proc.returncode == 0, proc.stderr
    tasks = load_suite(out)
    assert len(tasks) == 16 and {t.family for t in tasks} == set(gym.FAMILIES)
    assert {(t.family, gym.task_seed(t)) for t in tasks} == set(gym.split_seeds("test", 16))
    proc = run("-m", "tr.envs.tasks", "validate", str(out))
    assert proc.returncode == 0 and "16 valid, 0 invalid" in proc.stdout, proc.stdout
    proc = run("-m", "tr.envs.tasks", "list", str(out))
    assert proc.returncode == 0 and "restore-latest" in proc.stdout
    one = sorted(out.iterdir())[0]
    proc = run("-m", "tr.envs.tasks", "verify", str(one), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["strict_pass"] is True
    proc = run("-m", "tr.envs.gym", "write", str(tmp_path / "one"), "--split", "val", "--count",
               "3", "--family", "find-max", "--seed", "2")
    assert proc.returncode == 0, proc.stderr
    assert [load_task(p).family for p in sorted((tmp_path / "one").iterdir())] == ["find-max"] * 3
    proc = run("-m", "tr.envs.gym", "write", str(tmp_path / "bad"), "--split", "train",
               "--family", gym.HELDOUT_FAMILY)
    assert proc.returncode == 2 and "held out" in proc.stderr
