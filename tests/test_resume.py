"""SIGKILL a real training process (mid-save and mid-training), restart it, and get the metrics of
an uninterrupted run with the same seed, bit for bit; then restore its checkpoint onto 8 devices."""

import os
import pathlib
import signal
import sys
import time

import jax
import pytest
from flax import nnx

import child_runs

from tr.models import sharding as sharding_lib
from tr.train import checkpoint as ckpt
from tr.train.model_fns import nnx_model_fns
from tr.train.optim import make_optimizer
from tr.train.shardings import nnx_param_shardings, train_state_shardings
from tr.train.updates import default_config
from tr.train.state import abstract_state, create_train_state

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHILD = ROOT / "tests" / "resume_child.py"
STEPS, SAVE_EVERY = 12, 4
TIMEOUT_S = 240


def start_child(run_dir, metrics, env, *extra):
    return child_runs.start(CHILD, env, "--run_dir", run_dir, "--steps", STEPS,
                            "--save_every", SAVE_EVERY, "--metrics", metrics, *extra)


def wait_until(condition, proc, what):
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"child exited ({proc.returncode}) before {what}:\n"
                                 f"{proc.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def sigkill(proc):
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return proc.stdout.read()


def finish(proc):
    return child_runs.finish(proc, TIMEOUT_S)


def metric_lines(path):
    lines = {}
    for line in pathlib.Path(path).read_text().splitlines():
        step = int(line.split()[0].removeprefix("step="))
        lines.setdefault(step, []).append(line)
    return lines


def complete_steps(run_dir):
    folder = pathlib.Path(run_dir) / "rpr-1" / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def test_sigkill_anywhere_then_restart_reproduces_the_uninterrupted_run(tmp_path):
    env = child_runs.child_env(tmp_path / "jax_cache")
    procs = []
    try:
        reference = start_child(tmp_path / "ref", tmp_path / "ref.txt", env)
        procs.append(reference)
        finish(reference)
        want = metric_lines(tmp_path / "ref.txt")
        assert sorted(want) == list(range(1, STEPS + 1))
        assert all(len(v) == 1 for v in want.values())

        run, metrics = tmp_path / "run", tmp_path / "run.txt"
        # 1. Killed in the middle of saving step 8: its temporary folder exists, 8 is incomplete.
        first = start_child(run, metrics, env, "--slow_save_at", "8")
        procs.append(first)
        tmp_dir = run / "rpr-1" / "checkpoints" / "8.orbax-checkpoint-tmp"
        wait_until(tmp_dir.exists, first, "the save of step 8 to start")
        out = sigkill(first)
        assert "START step=0" in out
        assert tmp_dir.exists() and complete_steps(run) == [0, 4]

        # 2. Restarted: resumes from step 4 (the partial save is discarded); killed mid-training
        #    (possibly while the asynchronous save of step 8 is still being written).
        second = start_child(run, metrics, env)
        procs.append(second)
        wait_until(lambda: 10 in metric_lines(metrics) and len(metric_lines(metrics)[10]) == 1,
                   second, "step 10")
        out = sigkill(second)
        assert "START step=4" in out

        # 3. Restarted again: resumes from the last complete checkpoint and finishes.
        third = start_child(run, metrics, env)
        procs.append(third)
        out = finish(third)
        assert "DONE" in out
        last = complete_steps(run)
        start = int(out.split("START step=")[1].split()[0])
        assert start in last and start >= 4, (start, last)
        assert last[-1] == STEPS
        assert not [p for p in (run / "rpr-1" / "checkpoints").iterdir() if "tmp" in p.name]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)

    got = metric_lines(metrics)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step, lines in got.items():
        for line in lines:   # steps redone after a restart print exactly the same line
            assert line == want[step][0], f"step {step} differs after resume"
    assert any(len(lines) > 1 for lines in got.values())  # some steps really were redone

    # The run was saved by a 1-device process; restore its last checkpoint onto 8 devices.
    assert jax.device_count() == 8
    import resume_child  # pylint: disable=import-outside-toplevel
    from tr.models.config import get_model_config  # pylint: disable=import-outside-toplevel
    from tr.models.critic import CriticModel  # pylint: disable=import-outside-toplevel
    from tr.models.decoder import Decoder  # pylint: disable=import-outside-toplevel

    config = get_model_config("tiny", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1,
                              head_dim=16, d_ff=64, vocab_size=resume_child.VOCAB)
    actor, critic = Decoder(config, rngs=nnx.Rngs(0)), CriticModel(config, rngs=nnx.Rngs(1))
    fns = nnx_model_fns(actor, critic)
    opt = make_optimizer(default_config().actor.optimizer)
    template = create_train_state(actor_params=fns.actor_params, actor_optimizer=opt,
                                  critic_params=fns.critic_params, critic_optimizer=opt)
    mesh = sharding_lib.make_mesh((2, 2, 2, 1))
    shardings = train_state_shardings(
        template, mesh, actor_param_shardings=nnx_param_shardings(actor, mesh),
        critic_param_shardings=nnx_param_shardings(critic, mesh))
    with ckpt.StageStore(run, "rpr-1") as store:
        restored = store.restore(abstract_state(template, shardings))
        manifest = store.step_manifest()
    assert int(restored.step) == STEPS
    assert ckpt.tree_hash(restored.actor_params) == manifest["hashes"]["actor_params"]
    assert ckpt.tree_hash(restored.actor_params)[:16] == want[STEPS][0].split("actor=")[1]
    assert any(len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
               for x in jax.tree.leaves(restored.actor_params))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
