"""Multi-process JAX for real: two processes x 4 CPU devices joined by `jax.distributed` on
127.0.0.1 (tests/multiprocess_child.py), each running its own rollouts in its own sandboxes, run a
sharded PPO update over the 8 devices and save + restore the stage with Orbax; the result equals the
same update in one process on 8 devices, and the two-process checkpoint restores onto that mesh."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np

GLOBAL_ROWS, ROW_LENGTH = 8, 512
MESH = (2, 2, 2, 1)  # (data, fsdp, tensor, context) over 8 devices
ROOT = pathlib.Path(__file__).resolve().parents[1]


def local_rollout_rows(task_index: int, rows: int, seed: int) -> dict:
    """`rows` scripted episodes (with mistakes: some pass, some fail) as SPEC §2 rows: the last
    ROW_LENGTH tokens of each (the tiny model's window; ~1-2.5k-token episodes keep their final turns)."""
    from tr.agent.policies import ScriptedPolicy
    from tr.agent.records import episode_to_sequences, pad_sequences
    from tr.agent.rollout import RolloutConfig, group_specs, run_rollouts
    from tr.agent.transcript import ChatLayout
    from tr.envs.tasks import load_suite
    from tr.models.tokenizer import ByteTokenizer

    task = sorted(load_suite(), key=lambda t: (t.tier != "easy", t.id))[1 + task_index]
    out = run_rollouts(group_specs([task], rows, seed=seed), ScriptedPolicy([task], mistake_prob=0.5, seed=seed),
                       ChatLayout(ByteTokenizer()), RolloutConfig(concurrency=rows, progress=False))
    seqs = [{k: v[-ROW_LENGTH:] for k, v in episode_to_sequences(r, reward=float(bool(r.passed)))[0].items()}
            for r in out.records]
    assert len(seqs) == rows, [r.status for r in out.records]
    return pad_sequences(seqs, ROW_LENGTH)


def build_steps_and_state(mesh):
    """The same tiny actor + critic, optimizers and compiled PPO step in every process."""
    import jax
    from flax import nnx

    from tr.models.config import get_model_config
    from tr.models.critic import CriticModel
    from tr.models.decoder import Decoder
    from tr.train.compile import build_steps
    from tr.train.model_fns import nnx_model_fns
    from tr.train.optim import make_optimizer
    from tr.train.shardings import nnx_param_shardings, train_state_shardings
    from tr.train.updates import default_config
    from tr.train.state import create_train_state

    model_config = get_model_config("tiny", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)
    actor, critic = Decoder(model_config, rngs=nnx.Rngs(0)), CriticModel(model_config, rngs=nnx.Rngs(1))
    config = default_config()
    config.actor.optimizer.learning_rate = config.critic.optimizer.learning_rate = 1e-3
    config.num_micro_batches = 2
    config.logprob_chunk_size = 128
    fns = nnx_model_fns(actor, critic, chunk_size=config.logprob_chunk_size)
    state = create_train_state(
        actor_params=fns.actor_params, actor_optimizer=make_optimizer(config.actor.optimizer),
        critic_params=fns.critic_params, critic_optimizer=make_optimizer(config.critic.optimizer))
    shardings = train_state_shardings(
        state, mesh, actor_param_shardings=nnx_param_shardings(actor, mesh),
        critic_param_shardings=nnx_param_shardings(critic, mesh))
    state = jax.device_put(state, shardings)  # the same values in every process
    steps = build_steps(config, actor_logprobs=fns.actor_logprobs, critic_values=fns.critic_values,
                        mesh=mesh, state_sharding=shardings)
    return steps, state, shardings


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one_process_with_eight_devices(tmp_path):
    import jax

    from tr.models import sharding as sharding_lib
    from tr.train import checkpoint
    from tr.train.shardings import shard_batch
    from tr.train.state import abstract_state

    run_dir, out_dir = tmp_path / "run", tmp_path / "out"
    out_dir.mkdir()
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    logs = [tmp_path / f"process-{i}.log" for i in (0, 1)]
    children = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "multiprocess_child.py"), str(i), str(port),
                                  str(run_dir), str(out_dir)], cwd=ROOT, env=env, stdout=log.open("w"),
                                 stderr=subprocess.STDOUT) for i, log in enumerate(logs)]
    deadline = time.monotonic() + 480
    try:  # a process that fails leaves its peer waiting in a collective: stop it at once
        while any(c.poll() is None for c in children):
            if any(c.poll() not in (None, 0) for c in children) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
    assert [c.returncode for c in children] == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)

    result = json.loads((out_dir / "result.json").read_text())
    batch = dict(np.load(out_dir / "batch.npz"))
    assert batch["tokens"].shape == (GLOBAL_ROWS, ROW_LENGTH)
    assert 0 < batch["rewards"].sum() < GLOBAL_ROWS  # both outcomes among the rollouts

    assert jax.device_count() == 8 and jax.process_count() == 1
    mesh = sharding_lib.make_mesh(MESH)
    steps, state, shardings = build_steps_and_state(mesh)
    want, metrics = steps.ppo(state, shard_batch(batch, mesh))
    for key, value in metrics.items():
        np.testing.assert_allclose(result["metrics"][key], float(value), rtol=1e-4, atol=1e-5, err_msg=key)

    with checkpoint.StageStore(run_dir, "rpr-1", read_only=True) as store:
        got = store.restore(abstract_state(want, shardings))  # written by two processes, read by one
    assert int(got.step) == result["step"] == 1
    assert checkpoint.tree_hash(got.actor_params) == result["actor_hash"]
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=2e-5, rtol=1e-4)
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(want.actor_params), jax.tree.leaves(state.actor_params)))
    assert moved > 1e-4  # the update did something
