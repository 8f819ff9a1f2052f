"""A tiny PPO training run for tests/test_resume.py: killed with SIGKILL, restarted, compared.

    python tests/resume_child.py --run_dir D --steps N --save_every K --metrics FILE
                                 [--slow_save_at STEP]

Stage `base` holds the initial actor and critic; stage `rpr-1` is handed off from it and trained
with joint PPO steps on the tiny decoder, fed by a deterministic grain pipeline. Each step appends
one line of exact metrics (float reprs and the actor's parameter hash) to FILE. Started again on
the same run directory, it resumes from the last complete checkpoint of `rpr-1`.

`--slow_save_at STEP` makes the data iterator's `get_state` (called by Orbax inside the save of
STEP, after the checkpoint's temporary folder exists) sleep, so the parent can kill mid-save.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import grain
import jax
import numpy as np
from flax import nnx

from tr.models.config import get_model_config
from tr.models.critic import CriticModel
from tr.models.decoder import Decoder
from tr.train import checkpoint as ckpt
from tr.train.compile import build_steps
from tr.train.model_fns import nnx_model_fns
from tr.train.optim import make_optimizer
from tr.train.updates import default_config
from tr.train.state import abstract_state, create_train_state

ROWS, LENGTH, VOCAB = 4, 16, 64


def example(index: int) -> dict[str, np.ndarray]:
    """One training row, a pure function of its index: prompt, then action/observation turns."""
    rng = np.random.default_rng(index)
    actor_mask = np.zeros(LENGTH, bool)
    turn_ids = np.zeros(LENGTH, np.int32)
    pos, turn = 2, 0
    while pos < LENGTH - 2:
        turn += 1
        end = pos + int(rng.integers(1, 4))
        actor_mask[pos:end] = True
        turn_ids[pos:] = turn
        pos = end + int(rng.integers(0, 4))
    last = np.flatnonzero(actor_mask)[-1]
    rewards = np.zeros(LENGTH, np.float32)
    rewards[last] = rng.uniform(0.0, 2.0)
    dones = np.zeros(LENGTH, bool)
    dones[last] = True
    return {
        "tokens": rng.integers(0, VOCAB, LENGTH).astype(np.int32),
        "actor_mask": actor_mask,
        "loss_mask": actor_mask.copy(),
        "turn_ids": turn_ids,
        "rewards": rewards,
        "dones": dones,
        "logprobs": np.log(rng.uniform(0.02, 0.2, LENGTH)).astype(np.float32),
    }


class SlowStateIterator(grain.DatasetIterator):
    """Passes elements through; `get_state` sleeps when `should_sleep()` is true."""

    def __init__(self, parent: grain.DatasetIterator, should_sleep):
        super().__init__(parent)
        self._should_sleep = should_sleep

    def __next__(self):
        return next(self._parent)

    def get_state(self):
        if self._should_sleep():
            print("SLOW_SAVE", flush=True)
            time.sleep(120)
        return self._parent.get_state()

    def set_state(self, state):
        self._parent.set_state(state)


def data_iterator(should_sleep) -> grain.DatasetIterator:
    dataset = (grain.MapDataset.range(100_000).shuffle(seed=7).map(example).batch(ROWS)
               .to_iter_dataset())
    return SlowStateIterator(iter(dataset), should_sleep)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run_dir", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save_every", type=int, required=True)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--slow_save_at", type=int, default=-1)
    args = parser.parse_args(argv)
    if os.environ.get("TR_TEST_JAX_CACHE"):
        jax.config.update("jax_compilation_cache_dir", os.environ["TR_TEST_JAX_CACHE"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

    model_config = get_model_config("tiny", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1,
                                    head_dim=16, d_ff=64, vocab_size=VOCAB)
    fns = nnx_model_fns(Decoder(model_config, rngs=nnx.Rngs(0)),
                        CriticModel(model_config, rngs=nnx.Rngs(1)), chunk_size=8)
    config = default_config()
    config.actor.optimizer.learning_rate = 1e-3
    config.critic.optimizer.learning_rate = 1e-3
    config.num_micro_batches = 2
    actor_opt = make_optimizer(config.actor.optimizer)
    critic_opt = make_optimizer(config.critic.optimizer)
    init = create_train_state(actor_params=fns.actor_params, actor_optimizer=actor_opt,
                              critic_params=fns.critic_params, critic_optimizer=critic_opt)

    with ckpt.StageStore(args.run_dir, "base") as base:
        if base.latest_step() is None:
            base.create(kind="base")
            base.save(init, force=True)

    current_step = [0]
    it = data_iterator(lambda: current_step[0] == args.slow_save_at)
    state, store = ckpt.start_stage(
        args.run_dir, "rpr-1", kind="rpr", target=abstract_state(init),
        actor=ckpt.Side(ckpt.StageRef("base"), actor_opt),
        critic=ckpt.Side(ckpt.StageRef("base"), critic_opt), config=config, data_iter=it,
        store_options=ckpt.StoreOptions(save_every=args.save_every))
    print(f"START step={int(state.step)}", flush=True)
    ppo = build_steps(config, actor_logprobs=fns.actor_logprobs,
                      critic_values=fns.critic_values).ppo
    with store, open(args.metrics, "a", encoding="utf-8") as metrics_file:
        while int(state.step) < args.steps:
            batch = {k: jax.numpy.asarray(v) for k, v in next(it).items()}
            state, metrics = ppo(state, batch)
            step = int(state.step)
            current_step[0] = step
            values = " ".join(f"{k}={float(metrics[k])!r}" for k in sorted(metrics))
            metrics_file.write(f"step={step} {values} "
                               f"actor={ckpt.tree_hash(state.actor_params)[:16]}\n")
            metrics_file.flush()
            store.save(state, it)
        store.finish(state)
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
