"""One process of the two-process pod test (tests/test_multiprocess.py), 4 CPU devices each.

  python tests/multiprocess_child.py PROCESS_ID PORT RUN_DIR OUT_DIR

Joins `jax.distributed` on 127.0.0.1:PORT through the config's `pod` fragment, runs its own
rollouts (the scripted teacher, with mistakes, in its own bubblewrap sandboxes), turns them into its
rows of the global batch (`jax.make_array_from_process_local_data`, as a pod host would), runs one
sharded PPO update over the 8-device (data, fsdp, tensor, context) = (2, 2, 2, 1) mesh, saves the
stage with Orbax (every process writes its shards) and restores it. Process 0 writes the global
batch, the metrics and the state's hash to OUT_DIR for the parent's single-process comparison.
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from tests.test_multiprocess import (GLOBAL_ROWS, MESH, ROW_LENGTH, build_steps_and_state,  # noqa: E402
                                     local_rollout_rows)
from tr.models import sharding as sharding_lib  # noqa: E402
from tr.train import checkpoint, pod  # noqa: E402
from tr.train.state import abstract_state  # noqa: E402


def main(process_id: int, port: int, run_dir: str, out_dir: str) -> None:
    config = pod.pod_config(data=MESH[0], fsdp=MESH[1], tensor=MESH[2], context=MESH[3])
    config.distributed = True
    config.coordinator_address = f"127.0.0.1:{port}"
    config.num_processes = 2
    config.process_id = process_id
    pod.initialize(config)
    assert jax.process_count() == 2 and jax.local_device_count() == 4 and jax.device_count() == 8

    local = local_rollout_rows(task_index=process_id, rows=GLOBAL_ROWS // 2, seed=process_id)
    mesh = pod.make_mesh(config)
    sharding = sharding_lib.batch_sharding(mesh)
    batch = {k: jax.make_array_from_process_local_data(sharding, v, (GLOBAL_ROWS, ROW_LENGTH))
             for k, v in local.items()}

    steps, state, shardings = build_steps_and_state(mesh)
    new_state, metrics = steps.ppo(state, batch)

    store = checkpoint.StageStore(run_dir, "rpr-1", async_save=False)
    store.create(kind="rpr")
    store.save(new_state, force=True)
    store.wait()
    restored = store.restore(abstract_state(new_state, shardings))
    store.close()
    saved_hash = checkpoint.tree_hash(new_state.actor_params), checkpoint.tree_hash(new_state.critic_params)
    assert (checkpoint.tree_hash(restored.actor_params), checkpoint.tree_hash(restored.critic_params)) == saved_hash
    assert checkpoint.tree_hash(restored.critic_opt_state) == checkpoint.tree_hash(new_state.critic_opt_state)

    global_batch = {k: multihost_utils.process_allgather(v, tiled=True) for k, v in batch.items()}
    if process_id == 0:
        np.savez(os.path.join(out_dir, "batch.npz"), **global_batch)
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump({"metrics": {k: float(v) for k, v in metrics.items()},
                       "actor_hash": saved_hash[0], "critic_hash": saved_hash[1],
                       "step": int(restored.step)}, f)
    multihost_utils.sync_global_devices("done")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
