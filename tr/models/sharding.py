"""Logical axis names -> device mesh axes: one rules table, one mesh builder, model sharding.

Every parameter carries its logical axis names in the `logical_axes` metadata of its `nnx.Param`
(e.g. `('embed', 'mlp')` for an MLP up-projection), and every large activation is constrained by
logical names through `constrain`. `LOGICAL_AXIS_RULES` maps each name to zero or more mesh axes,
so one model runs from one CPU to a pod by changing the mesh shape only (the maxtext scheme).

Mesh axes, in this order: `('data', 'fsdp', 'tensor', 'context')`
  data     pure data parallelism (parameters replicated),
  fsdp     data parallelism with parameters and optimizer state sharded (ZeRO-3),
  tensor   Megatron tensor parallelism over heads / MLP width / vocabulary,
  context  sequence (context) parallelism over the token axis of activations.

A mesh axis is dropped from a dimension when that dimension is not divisible by its size (the
array is then replicated along that mesh axis), and a mesh axis is used at most once per array.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor", "context")

LogicalAxes = tuple[str | None, ...]
Rules = tuple[tuple[str, tuple[str, ...]], ...]

LOGICAL_AXIS_RULES: Rules = (
    # parameters (block parameters are stacked: a leading 'layers' axis, never sharded, so the
    # layer scan slices it locally)
    ("layers", ()),
    ("vocab", ("tensor",)),
    ("embed", ("fsdp",)),
    ("mlp", ("tensor",)),
    ("q_heads", ("tensor",)),
    ("kv_heads", ("tensor",)),
    ("head_dim", ()),
    ("norm", ()),
    ("value_out", ()),
    # activations
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", ("context",)),
    ("activation_kv_length", ()),  # keys/values are gathered over the context axis
    ("activation_embed", ()),
    ("activation_heads", ("tensor",)),
    ("activation_kv_heads", ("tensor",)),
    ("activation_mlp", ("tensor",)),
    ("activation_vocab", ("tensor",)),
    ("activation_head_dim", ()),
    # decoding cache (layer-stacked, see tr/models/decoder.py)
    ("cache_layers", ()),
    ("cache_batch", ("data", "fsdp")),
    ("cache_length", ()),
    ("cache_kv_heads", ("tensor",)),
)

_ACTIVE_RULES: list[Rules] = [LOGICAL_AXIS_RULES]


@contextlib.contextmanager
def axis_rules(rules: Rules) -> Iterator[None]:
    """Use `rules` instead of `LOGICAL_AXIS_RULES` inside the block (traced code included)."""
    _ACTIVE_RULES.append(tuple(rules))
    try:
        yield
    finally:
        _ACTIVE_RULES.pop()


def current_rules() -> Rules:
    return _ACTIVE_RULES[-1]


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh shape over ('data', 'fsdp', 'tensor', 'context'); one entry may be -1 (= the rest)."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    context: int = 1

    def shape(self, n_devices: int) -> tuple[int, int, int, int]:
        sizes = [self.data, self.fsdp, self.tensor, self.context]
        if sizes.count(-1) > 1:
            raise ValueError(f"MeshConfig{tuple(sizes)}: at most one axis may be -1")
        if any(s == 0 or s < -1 for s in sizes):
            raise ValueError(f"MeshConfig{tuple(sizes)}: sizes must be positive or -1")
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if n_devices % known:
                raise ValueError(f"MeshConfig{tuple(sizes)}: {n_devices} devices not divisible by {known}")
            sizes[sizes.index(-1)] = n_devices // known
        if math.prod(sizes) != n_devices:
            raise ValueError(f"MeshConfig{tuple(sizes)} needs {math.prod(sizes)} devices, have {n_devices}")
        return tuple(sizes)  # type: ignore[return-value]


def make_mesh(config: MeshConfig | Sequence[int], devices: Sequence[Any] | None = None) -> Mesh:
    """A `Mesh` with axes `MESH_AXES` from a `MeshConfig` or a 4-tuple of sizes."""
    devices = list(jax.devices() if devices is None else devices)
    if not isinstance(config, MeshConfig):
        sizes = tuple(config)
        if len(sizes) != len(MESH_AXES):
            raise ValueError(f"mesh shape {sizes} must have {len(MESH_AXES)} entries {MESH_AXES}")
        config = MeshConfig(*sizes)
    shape = config.shape(len(devices))
    axis_types = (AxisType.Auto,) * len(MESH_AXES)
    try:
        return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
    except NotImplementedError:
        # A TPU torus axis must be split (e.g. tensor = 8 on a 4x4x4 v5p-128): allowed, with the
        # devices still laid out by the physical torus (mesh_utils keeps neighbours together).
        grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
        return Mesh(grid, MESH_AXES, axis_types=axis_types)


def logical_to_spec(logical_axes: LogicalAxes, shape: Sequence[int] | None = None,
                    mesh_shape: dict[str, int] | None = None,
                    rules: Rules | None = None) -> PartitionSpec:
    """PartitionSpec for an array with logical axis names `logical_axes`.

    Unknown names raise. With `shape` and `mesh_shape`, mesh axes that do not divide a dimension
    (or are of size 1) are dropped.
    """
    table = dict(current_rules() if rules is None else rules)
    used: set[str] = set()
    spec: list[Any] = []
    for dim, name in enumerate(logical_axes):
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise KeyError(f"logical axis {name!r} has no entry in the sharding rules table")
        chosen: list[str] = []
        for mesh_axis in table[name]:
            if mesh_axis in used:
                continue
            if mesh_shape is not None:
                size = mesh_shape.get(mesh_axis, 1)
                if size == 1:
                    continue
                if shape is not None:
                    width = math.prod(mesh_shape[a] for a in chosen) * size
                    if shape[dim] % width:
                        continue
            chosen.append(mesh_axis)
        used.update(chosen)
        spec.append(None if not chosen else (chosen[0] if len(chosen) == 1 else tuple(chosen)))
    return PartitionSpec(*spec)


def constrain(x: jax.Array, logical_axes: LogicalAxes) -> jax.Array:
    """`with_sharding_constraint` by logical names under the active mesh (`jax.set_mesh`); no-op without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = logical_to_spec(logical_axes, x.shape, dict(mesh.shape))
    return jax.lax.with_sharding_constraint(x, spec)


def param_logical_axes(state: nnx.State) -> Any:
    """Tree of logical axis tuples, one per variable of `state` (replicated `()`-style when absent)."""

    def axes(v: nnx.Variable) -> Any:
        names = v.get_metadata().get("logical_axes")
        return tuple(names) if names is not None else (None,) * len(v.get_value().shape)

    return jax.tree.map(axes, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def state_partition_specs(state: nnx.State, mesh_shape: dict[str, int], rules: Rules | None = None) -> Any:
    """PartitionSpec tree for `state` on a mesh of the given axis sizes (no devices needed: plan a pod
    layout, e.g. `nnx.eval_shape` a 27B model and check its per-device bytes)."""

    def spec(v: nnx.Variable) -> Any:
        shape = tuple(v.get_value().shape)
        names = v.get_metadata().get("logical_axes")
        if names is None:
            return v.replace(PartitionSpec())
        if len(names) != len(shape):
            raise ValueError(f"logical_axes {names} do not match a parameter of shape {shape}")
        return v.replace(logical_to_spec(tuple(names), shape, mesh_shape, rules))

    return jax.tree.map(spec, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def per_device_bytes(state: nnx.State, mesh_shape: dict[str, int], rules: Rules | None = None) -> int:
    """Bytes of `state` held by one device when sharded by the rules on a mesh of `mesh_shape`."""
    specs = jax.tree.leaves(state_partition_specs(state, mesh_shape, rules),
                            is_leaf=lambda x: isinstance(x, PartitionSpec))
    total = 0
    for value, spec in zip(jax.tree.leaves(state), specs):
        n = math.prod(value.shape) * np.dtype(value.dtype).itemsize
        for axes in spec:
            for axis in ((axes,) if isinstance(axes, str) else (axes or ())):
                n //= mesh_shape[axis]
        total += n
    return total


def state_shardings(state: nnx.State, mesh: Mesh, rules: Rules | None = None) -> Any:
    """NamedSharding tree matching `state` (as returned by `nnx.split` / `nnx.state`)."""
    specs = state_partition_specs(state, dict(mesh.shape), rules)
    return jax.tree.map(lambda v: v.replace(NamedSharding(mesh, v.get_value())), specs,
                        is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model: nnx.Module, mesh: Mesh, rules: Rules | None = None) -> nnx.Module:
    """Place every variable of `model` on `mesh` according to its logical axes (in place; returns model)."""
    state = nnx.state(model)
    shardings = state_shardings(state, mesh, rules)
    placed = jax.tree.map(lambda x, s: jax.device_put(x, s), state, shardings)
    nnx.update(model, placed)
    return model


def create_sharded(make_model: Any, mesh: Mesh, rules: Rules | None = None) -> nnx.Module:
    """Build `make_model()` directly sharded on `mesh` (no full copy on one device; for large models)."""
    abstract = nnx.eval_shape(make_model)
    graphdef, abstract_state = nnx.split(abstract)
    shardings = state_shardings(abstract_state, mesh, rules)

    init = jax.jit(lambda: nnx.state(make_model()), out_shardings=shardings)
    with jax.set_mesh(mesh):
        state = init()
    return nnx.merge(graphdef, state)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding for a `[B, L, ...]` input batch: batch over (data, fsdp), length over context."""
    names: LogicalAxes = ("activation_batch", "activation_length") + (None,) * (ndim - 2)
    return NamedSharding(mesh, logical_to_spec(names[:ndim], None, dict(mesh.shape)))
