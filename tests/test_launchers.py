"""Pod launchers: every experiment config carries the shared `pod` fragment, `--dry-run` of
launch/tpu_pod.sh and launch/xpk.sh prints every command (and runs none), and each config's pod form
(the exact entry-point command the launchers send to every host) runs here as a one-process
`jax.distributed` job on CPU."""

import importlib.util
import json
import os
import pathlib
import shlex
import shutil
import socket
import subprocess
import sys

import pytest

from tr.train import pod

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / "experiments").glob("*.py") if p.name != "main.py")
TPU_ENV = {"TPU_NAME": "my-v5p-128", "TPU_ZONE": "us-east5-a", "GCP_PROJECT": "proj"}
XPK_ENV = {"XPK_CLUSTER": "tr-cluster", "TPU_TYPE": "v5p-128", "GCP_PROJECT": "proj", "GCP_ZONE": "us-east5-a"}
WORKDIR = "gs://bucket/runs/demo-1"


def _module(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launch(script, *args, env=None, tmp_path=None):
    full_env = {**os.environ, **(env or {}), "TR_PYTHON": sys.executable}
    if tmp_path is not None:
        full_env["TMPDIR"] = str(tmp_path)
    return subprocess.run([shutil.which("bash"), str(ROOT / "launch" / script), *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120)


def commands(stdout):
    """The shell-quoted command lines a launcher printed (`+ ...`), split into words."""
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_has_the_shared_pod_fragment_and_a_smoke_run(path):
    module = _module(path)
    shared = pod.pod_config()
    for variant in getattr(module, "VARIANTS", ("default",)):
        config = module.get_config(variant)
        assert "pod" in config, f"{path.name}:{variant} lacks config.pod = tr.train.pod.pod_config()"
        assert set(config.pod.keys()) == set(shared.keys()), f"{path.name}:{variant}"
        assert set(config.pod.mesh.keys()) == set(shared.mesh.keys())
    assert isinstance(getattr(module, "SMOKE_FLAGS", None), tuple), (
        f"{path.name} must define SMOKE_FLAGS: overrides that make its pod form run in seconds on CPU")


def test_tpu_pod_dry_run_prints_every_command_and_runs_none(tmp_path):
    result = launch("tpu_pod.sh", "--dry-run", "experiments/gae_demo.py:unit_clock", WORKDIR,
                    "--config.long_log_repeat=3", env=TPU_ENV, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    git, scp, ssh = commands(out)
    assert git[:2] == ["git", "-C"] and "archive" in git
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-v5p-128"]
    assert "--zone=us-east5-a" in ssh and "--project=proj" in ssh
    remote = next(a for a in ssh if a.startswith("--command="))
    assert "TR_TPU=1 bash launch/setup.sh" in remote and "--config.pod.distributed=True" in remote
    assert "--config.long_log_repeat=3" in remote and f"--workdir={WORKDIR}" in remote
    config = json.loads(out[out.index("{"):out.index("\n}\n") + 2])  # the run's resolved config
    assert config["pod"]["distributed"] is True and config["long_log_repeat"] == 3
    assert f"workdir: {WORKDIR}" in out
    follow = [shlex.split(l) for l in out.splitlines() if l.startswith("  gcloud")]
    assert follow and follow[0][-1] == "--command=tail -F tr/logs/demo-1.log" and "--worker=0" in follow[0]
    assert "resume:" in out
    assert "(dry run: nothing was run)" in out
    assert not list(tmp_path.iterdir())  # not even the source archive was written


def test_xpk_dry_run_prints_one_workload_create(tmp_path):
    result = launch("xpk.sh", "--dry-run", "experiments/gae_demo.py", WORKDIR, env=XPK_ENV, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    (create,) = commands(result.stdout)
    assert create[:3] == ["xpk", "workload", "create"]
    for flag in ("--cluster=tr-cluster", "--tpu-type=v5p-128", "--workload=tr-demo-1", "--num-slices=1",
                 f"--script-dir={ROOT}"):
        assert flag in create
    command = next(a for a in create if a.startswith("--command="))
    assert "TR_TPU=1 bash launch/setup.sh &&" in command and "--config.pod.distributed=True" in command
    follow = [shlex.split(l) for l in result.stdout.splitlines() if l.startswith("  ")]
    assert ["kubectl", "logs", "-f"] in [f[:3] for f in follow]
    assert ["xpk", "workload", "delete"] in [f[:3] for f in follow]
    assert f"workdir: {WORKDIR}" in result.stdout and '"distributed": true' in result.stdout


@pytest.mark.parametrize("script, env", [("tpu_pod.sh", TPU_ENV), ("xpk.sh", XPK_ENV)])
def test_launchers_refuse_bad_input_before_launching(tmp_path, script, env):
    first = sorted(env)[0]
    result = launch(script, "--dry-run", "experiments/gae_demo.py", WORKDIR,
                    env={**{k: v for k, v in env.items() if k != first}, first: ""})
    assert result.returncode == 2 and first in result.stderr
    result = launch(script, "--dry-run", "experiments/gae_demo.py", "/tmp/local-dir", env=env)
    assert result.returncode == 2 and "gs://" in result.stderr
    result = launch(script, "--dry-run", "experiments/gae_demo.py", WORKDIR, "--config.no_such_field=1", env=env)
    assert result.returncode == 2 and "no_such_field" in result.stderr and "+ " not in result.stdout
    # A real launch on a machine without the cloud tool stops before running anything: a PATH
    # holding only the coreutils the scripts use (this machine may have gcloud installed).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "basename", "tr", "cut"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    result = launch(script, "experiments/gae_demo.py", WORKDIR, env={**env, "PATH": str(bin_dir)},
                    tmp_path=tmp_path)
    tool = "gcloud" if script == "tpu_pod.sh" else "xpk"
    assert result.returncode == 2 and f"{tool} is not installed" in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_each_configs_pod_form_runs_locally(tmp_path, path):
    """The entry-point command tpu_pod.sh sends to every host, run here: one process joins a
    jax.distributed group on 127.0.0.1 (the pod's coordinator comes from the TPU environment)."""
    smoke = _module(path).SMOKE_FLAGS
    result = launch("tpu_pod.sh", "--dry-run", f"experiments/{path.name}", WORKDIR, *smoke, env=TPU_ENV,
                    tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    line = next(l for l in result.stdout.splitlines() if l.startswith("entry point on every host: "))
    argv = shlex.split(line.split(": ", 1)[1])
    assert argv[:2] == [".venv/bin/python", "experiments/main.py"] and "--config.pod.distributed=True" in argv
    workdir = tmp_path / "run"
    argv = [sys.executable, *[f"--workdir={workdir}" if a.startswith("--workdir=") else a for a in argv[1:]],
            f"--config.pod.coordinator_address=127.0.0.1:{_free_port()}", "--config.pod.num_processes=1",
            "--config.pod.process_id=0"]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stderr[-3000:]
    config = json.loads((workdir / "config.json").read_text())
    assert config["pod"]["distributed"] is True
    assert len(list(workdir.iterdir())) > 1  # the job wrote its outputs too
