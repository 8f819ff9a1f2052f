"""What a pod run needs, from one place: the `config.pod` fragment and how a process realises it.

Every experiment config includes `config.pod = pod.pod_config()` (so the launchers' overrides,
`--config.pod.distributed=True` and friends, exist on every config):

    distributed          call `jax.distributed.initialize` before anything touches devices
                         (launch/tpu_pod.sh and launch/xpk.sh set it)
    coordinator_address  "" = from the TPU / cluster environment; else "host:port" (local tests)
    num_processes        0 = from the environment
    process_id           -1 = from the environment
    local_device_ids     () = all local devices; else the ids this process uses (CPU tests)
    mesh                 {data, fsdp, tensor, context}: sizes over all devices, one may be -1 (the rest)
    axis_rules           ((logical name, (mesh axes...)), ...) replacing those entries of
                         `tr.models.sharding.LOGICAL_AXIS_RULES` (unknown names are refused)
    remat                "" = each model's own policy; else a `ModelConfig.remat` name
    attention_chunk      0 = each model's own; else queries per attention block (`ModelConfig`)

`initialize(pod)`, `make_mesh(pod)`, `axis_rules(pod)` and `model_overrides(pod)` turn the fragment
into a joined process group, a device mesh, a rules table and `ModelConfig` overrides.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import ml_collections
from jax.sharding import Mesh

from tr.models import sharding
from tr.models.config import REMAT_NAMES


def pod_config(*, data: int = 1, fsdp: int = -1, tensor: int = 1, context: int = 1,
               axis_rules: Sequence[tuple[str, Sequence[str]]] = (), remat: str = "",
               attention_chunk: int = 0) -> ml_collections.ConfigDict:
    """The `config.pod` fragment (defaults: one process, every device on the fsdp axis)."""
    return ml_collections.ConfigDict({
        "distributed": False,
        "coordinator_address": "",
        "num_processes": 0,
        "process_id": -1,
        "local_device_ids": (),
        "mesh": {"data": data, "fsdp": fsdp, "tensor": tensor, "context": context},
        "axis_rules": tuple((str(name), tuple(axes)) for name, axes in axis_rules),
        "remat": remat,
        "attention_chunk": attention_chunk,
    })


def initialize(pod: ml_collections.ConfigDict) -> None:
    """`jax.distributed.initialize` as `pod` says (nothing when `pod.distributed` is False).

    On a TPU pod every argument comes from the environment; a local multi-process run gives
    `coordinator_address`, `num_processes`, `process_id` (and `local_device_ids` on CPU).
    """
    if not pod.distributed:
        return
    kwargs: dict[str, Any] = {}
    if pod.coordinator_address:
        kwargs["coordinator_address"] = pod.coordinator_address
    if pod.num_processes:
        kwargs["num_processes"] = int(pod.num_processes)
    if pod.process_id >= 0:
        kwargs["process_id"] = int(pod.process_id)
    if pod.local_device_ids:
        kwargs["local_device_ids"] = [int(i) for i in pod.local_device_ids]
    jax.distributed.initialize(**kwargs)


def mesh_config(pod: ml_collections.ConfigDict) -> sharding.MeshConfig:
    m = pod.mesh
    return sharding.MeshConfig(data=int(m.data), fsdp=int(m.fsdp), tensor=int(m.tensor), context=int(m.context))


def make_mesh(pod: ml_collections.ConfigDict, devices: Sequence[Any] | None = None) -> Mesh:
    """The run's mesh over `devices` (default: every device of every process)."""
    return sharding.make_mesh(mesh_config(pod), devices)


def axis_rules(pod: ml_collections.ConfigDict) -> sharding.Rules:
    """`LOGICAL_AXIS_RULES` with `pod.axis_rules` replacing entries of the same logical name."""
    table = dict(sharding.LOGICAL_AXIS_RULES)
    for entry in pod.axis_rules:
        if len(entry) != 2:
            raise ValueError(f"config.pod.axis_rules entry {entry!r} must be (logical name, (mesh axes...))")
        name, axes = entry
        if name not in table:
            raise ValueError(f"config.pod.axis_rules names logical axis {name!r}, which the rules table "
                             f"does not have (known: {sorted(table)})")
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        bad = [a for a in axes if a not in sharding.MESH_AXES]
        if bad:
            raise ValueError(f"config.pod.axis_rules[{name!r}] names mesh axes {bad}; mesh axes are "
                             f"{sharding.MESH_AXES}")
        table[name] = axes
    return tuple(table.items())


def model_overrides(pod: ml_collections.ConfigDict) -> dict[str, Any]:
    """`ModelConfig` field overrides the pod fragment asks for (remat policy, attention blocks)."""
    out: dict[str, Any] = {}
    if pod.remat:
        if pod.remat not in REMAT_NAMES:
            raise ValueError(f"config.pod.remat={pod.remat!r}; expected '' or one of {REMAT_NAMES}")
        out["remat"] = pod.remat
    if pod.attention_chunk:
        if not isinstance(pod.attention_chunk, int) or pod.attention_chunk < 0:
            raise ValueError(f"config.pod.attention_chunk={pod.attention_chunk!r} must be an int >= 0")
        out["attention_chunk"] = pod.attention_chunk
    return out
