"""Shared by the tests that run a training child process and kill it (test_resume, test_stages,
test_rsr): the child's environment, starting it, and reading what it printed or wrote."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def child_env(cache_dir) -> dict:
    """One CPU device, unoptimised LLVM code generation (compiles the tiny steps several times
    faster; every run uses the same flags) and a shared persistent compilation cache."""
    env = dict(os.environ)
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=1 "
                         "--xla_backend_optimization_level=0", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT), TR_TEST_JAX_CACHE=str(cache_dir))
    return env


def start(script, env, *args) -> subprocess.Popen:
    """`python script args...` in the repository root, stdout and stderr together."""
    return subprocess.Popen([sys.executable, str(script), *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout_s: float) -> str:
    """The child's output once it exits 0 (an assertion with its tail otherwise)."""
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out[-4000:]
    return out


def done_json(out: str) -> dict:
    """The JSON after the child's last `DONE ` line."""
    done = [line for line in out.splitlines() if line.startswith("DONE ")]
    return json.loads(done[-1][5:])


def records(path) -> list[dict]:
    return [json.loads(x) for x in pathlib.Path(path).read_text().splitlines() if x.strip()]
