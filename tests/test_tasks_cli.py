"""`python -m tr.envs.tasks`: validate, verify, list — run as a real subprocess."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
TASKS = FIXTURES / "tasks"
MALFORMED = FIXTURES / "malformed"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tr.envs.tasks", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def assert_no_traceback(proc):
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_validate_good_tasks_exits_zero():
    proc = cli("validate", TASKS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "10 valid, 0 invalid" in proc.stdout
    assert "installs pytest over the network" in proc.stdout  # the offline replacement is noted


def test_validate_reports_every_malformed_task_with_file_and_field():
    proc = cli("validate", MALFORMED, TASKS / "tr-count-errors")
    assert proc.returncode == 1
    assert_no_traceback(proc)
    dirs = sorted(p for p in MALFORMED.iterdir() if p.is_dir())
    assert f"1 valid, {len(dirs)} invalid" in proc.stdout
    for task_dir in dirs:
        expected = (task_dir / "EXPECTED").read_text().strip()
        block = proc.stdout.split(f"FAIL {task_dir}\n", 1)[1].split("\nFAIL ", 1)[0]
        assert expected in block, (task_dir.name, block)


def test_validate_missing_directory_is_an_error_not_a_traceback():
    proc = cli("validate", "no/such/task")
    assert proc.returncode == 1 and "does not exist" in proc.stdout
    assert_no_traceback(proc)


def test_list_prints_family_and_tier_table():
    proc = cli("list", TASKS)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["id", "family", "tier", "layout"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:-1]}
    assert rows == {
        "harbor-archive-logs": ["system-administration", "easy", "harbor"],
        "harbor-csv-total": ["data-processing", "medium", "harbor"],
        "harbor-dedupe-lines": ["text-processing", "easy", "harbor"],
        "tb1-py-inventory": ["software-engineering", "easy", "tb1"],
        "tb1-greet-summary": ["scripting", "easy", "tb1"],
        "tb1-fix-config": ["system-administration", "medium", "tb1"],
        "tb1-word-count": ["file-operations", "easy", "tb1"],
        "tb1-compose-shelf": ["text-processing", "easy", "tb1"],
        "tb1-heredoc-rota": ["text-processing", "easy", "tb1"],
        "tr-count-errors": ["log-analysis", "easy", "tr"],
    }
    assert lines[-1] == "10 tasks"


def test_list_defaults_to_the_built_in_suite():
    proc = cli("list")
    assert_no_traceback(proc)
    suite = ROOT / "tr" / "envs" / "suite"
    ids = sorted(p.name for p in suite.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    listed = [line.split()[0] for line in proc.stdout.splitlines()[1:-1]]
    assert listed == ids


def test_list_marks_invalid_tasks():
    proc = cli("list", MALFORMED)
    assert proc.returncode == 1 and "INVALID" in proc.stdout
    assert_no_traceback(proc)


@pytest.mark.parametrize("attempt, strict, code", [("solution", True, 0), ("none", False, 1),
                                                   ("partial", False, 1)])
def test_verify_json_reports_the_verdict(attempt, strict, code):
    proc = cli("verify", TASKS / "tr-count-errors", "--attempt", attempt, "--json")
    assert proc.returncode == code, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    for key in ("task_id", "family", "tier", "strict_pass", "matched", "executed", "checks"):
        assert key in data
    assert (data["task_id"], data["family"], data["tier"]) == ("tr-count-errors", "log-analysis",
                                                              "easy")
    assert data["strict_pass"] is strict and data["error"] is None
    expected = {"solution": (3, 3), "none": (0, 3), "partial": (1, 3)}[attempt]
    assert (data["matched"], data["executed"]) == expected
    assert len(data["turns"]) == {"solution": 3, "none": 0, "partial": 1}[attempt]


def test_verify_human_output_for_a_reward_file_task():
    proc = cli("verify", TASKS / "harbor-archive-logs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS    reward" in proc.stdout and "strict S=1" in proc.stdout


def test_verify_invalid_task_or_missing_attempt_exits_2_without_traceback():
    proc = cli("verify", MALFORMED / "unknown-tier")
    assert proc.returncode == 2 and "unknown tier 'legendary'" in proc.stderr
    assert_no_traceback(proc)
    proc = cli("verify", TASKS / "tb1-word-count", "--attempt", "partial")
    assert proc.returncode == 2 and "has no partial attempt" in proc.stderr
    assert_no_traceback(proc)


def test_verify_docker_only_task_on_local_says_to_use_docker(tmp_path):
    task_dir = tmp_path / "needs-apt"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "tests").mkdir()
    (task_dir / "task.toml").write_text('[metadata]\ndifficulty = "easy"\n')
    (task_dir / "instruction.md").write_text("Use jq.\n")
    (task_dir / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    (task_dir / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nRUN apt-get install -y tr-no-such-pkg\n")
    proc = cli("verify", task_dir, "--attempt", "none", "--backend", "local")
    assert proc.returncode == 2 and "--backend docker" in proc.stderr
    assert_no_traceback(proc)
    validate = cli("validate", task_dir)  # valid as a task; the note says where it runs
    assert validate.returncode == 0 and "runs on the Docker backend only" in validate.stdout


def test_bad_arguments_are_usage_errors():
    proc = cli("verify", TASKS / "tr-count-errors", "--attempt", "best")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    assert_no_traceback(proc)


def _failing_solution_task(tmp_path) -> Path:
    task_dir = tmp_path / "fails-loudly"
    for d in ("solution", "tests"):
        (task_dir / d).mkdir(parents=True)
    (task_dir / "task.toml").write_text('[metadata]\ndifficulty = "easy"\n')
    (task_dir / "instruction.md").write_text("Write /app/out.\n")
    (task_dir / "solution" / "solve.sh").write_text(
        "#!/bin/bash\necho first-step-ran\necho missing-tool-marker >&2\n"
        "curl -sS https://tr-no-such-host.invalid/get-pip.py\nexit 7\n")
    (task_dir / "tests" / "test_outputs.py").write_text(
        "def test_out():\n    print('verifier-log-marker')\n    assert open('/app/out').read()\n")
    return task_dir


def test_verify_shows_a_failing_solution_commands_output_and_the_verifier_log(tmp_path):
    task_dir = _failing_solution_task(tmp_path)
    proc = cli("verify", task_dir)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "--- turn 1: /bin/bash /solution/solve.sh  (exit code 7)" in proc.stdout
    assert "first-step-ran" in proc.stdout and "missing-tool-marker" in proc.stdout
    assert "--- verifier log" in proc.stdout and "verifier-log-marker" in proc.stdout
    assert ("note: turn 1 could not reach tr-no-such-host.invalid: the agent's runtime is offline "
            "by default; rerun with --network") in proc.stdout
    data = json.loads(cli("verify", task_dir, "--json").stdout)
    assert "missing-tool-marker" in data["turns"][0]["output"]


def test_verify_verbose_shows_passing_commands_too():
    quiet = cli("verify", TASKS / "tb1-py-inventory")
    assert quiet.returncode == 0 and "--- turn" not in quiet.stdout, quiet.stdout
    loud = cli("verify", TASKS / "tb1-py-inventory", "--verbose")
    assert loud.returncode == 0, loud.stdout + loud.stderr
    assert "--- turn 3: python summarize.py  (exit code 0)" in loud.stdout
    assert "\n21\n" in loud.stdout and "--- verifier log" in loud.stdout


def test_verify_says_when_the_tests_wanted_a_server_the_agent_started(tmp_path):
    task_dir = tmp_path / "needs-server"
    for d in ("solution", "tests"):
        (task_dir / d).mkdir(parents=True)
    (task_dir / "task.toml").write_text('[metadata]\ndifficulty = "easy"\n')
    (task_dir / "instruction.md").write_text("Serve port 8765.\n")
    (task_dir / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nnohup python3 -m http.server 8765 >/dev/null 2>&1 &\nsleep 1\n")
    (task_dir / "tests" / "test_outputs.py").write_text(
        "import urllib.request\n\ndef test_served():\n"
        "    urllib.request.urlopen('http://localhost:8765/', timeout=5)\n")
    proc = cli("verify", task_dir)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "note: the tests expect a service on this machine" in proc.stdout, proc.stdout
