"""Ahead-of-time compilation of every step a config runs, for a TPU topology, on a CPU host.

  termrl aot --config=experiments/X.py:variant --topology=v5p-128 [--json] [--steps=a,b]
  python -m tr.train.aot ...          the same command (it runs `python -m tr aot ...`)

Both take a recipe's own config (`experiments/terminal_rsi.py:paper`): `tr.stages.pod_plan`
derives the interface below from its stages, one code path in `tr/cli.py`.

With `libtpu` installed (`TR_AOT=1 bash launch/setup.sh` adds `requirements-aot.txt`), JAX can
describe a TPU slice's devices without owning one (`jax.experimental.topologies`) and compile for
them. This builds the config's mesh (`config.pod`, tr/train/pod.py) on the topology's devices and
compiles, with the config's shapes and shardings, each step it runs: the sampler's prefill and one
decode step, and the `sft`, `critic`, `ppo`, `grpo` updates (built by `tr.train.compile.build_steps`).
For each it prints the per-chip bytes of XLA's `memory_analysis()`:

    argument  inputs (parameters, optimizer state, batch, cache) held on one chip
    output    outputs on one chip
    temp      XLA's scratch (activations, gradients, collectives' buffers)
    total     argument + output - alias + temp   (alias: outputs written into donated inputs)

against the chip's HBM, and whether it fits. `--json` prints
`{"topology", "chips", "hbm_bytes", "steps": {name: {"argument_bytes", "output_bytes",
"temp_bytes", "total_bytes", "fits"}}, "fits"}`.

Topologies: Google Cloud accelerator types (`v5p-128` = 64 chips: v4/v5p count TensorCores, two
per chip; `v5e-64`/`v5litepod-64` and `v6e-N` count chips), explicit shapes (`v5p:4x4x4`,
`v5e:8x8`), or `cpu` (this host's CPU devices; no libtpu needed: what the tests use).

The config interface (what a recipe config provides; LAYOUT.md lists it too):

    config.model               a named size (tr/models/config.py), actor and critic, or
                               {name, overrides}
    config.pod                 tr.train.pod.pod_config(...): mesh, axis_rules, remat
    config.train               tr.train.updates.default_config() (optimizers, ppo/grpo, chunking)
    config.shapes.<update>     for each update the config runs (sft, critic, ppo, grpo):
                               {rows, length, micro_batches}: rows x length tokens per update,
                               split into micro_batches
    config.shapes.sampler      {rows, prompt_len, new_tokens}: rows decoded together, the prompt
                               bucket and the new-token bucket (cache = prompt_len + new_tokens)
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # `termrl aot` (tr/cli.py), which derives a recipe's shapes: exec'd
    os.execv(sys.executable, [sys.executable, "-m", "tr", "aot", *sys.argv[1:]])  # before JAX loads

# pylint: disable=wrong-import-position
import dataclasses
import json
import math
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from tr.models import sharding as sharding_lib
from tr.models.config import get_model_config
from tr.models.critic import CriticModel
from tr.models.decoder import Decoder, KVCache, init_cache
from tr.train import pod
from tr.train.compile import build_steps
from tr.train.model_fns import nnx_model_fns
from tr.train.optim import make_optimizer
from tr.train.shardings import nnx_param_shardings, train_state_shardings
from tr.train.updates import REQUIRED
from tr.train.state import TrainState, create_train_state

UPDATES = ("sft", "critic", "ppo", "grpo")
SAMPLER_STEPS = ("sampler_prefill", "sampler_decode")
GiB = 1024 ** 3
# HBM per chip (Cloud TPU system architecture pages).
HBM_BYTES = {"v4": 32 * GiB, "v5e": 16 * GiB, "v5p": 95 * GiB, "v6e": 32 * GiB}
# Chips -> slice shape, for the accelerator types Cloud TPU offers.
_SHAPES_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4), 128: (4, 4, 8),
              256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16), 2048: (8, 16, 16), 4096: (16, 16, 16)}
_SHAPES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}
_CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e"}
_BATCH_DTYPES = {"tokens": jnp.int32, "actor_mask": jnp.bool_, "loss_mask": jnp.bool_, "turn_ids": jnp.int32,
                 "rewards": jnp.float32, "dones": jnp.bool_, "logprobs": jnp.float32, "is_recovery": jnp.bool_}


class AotError(ValueError):
    """A topology, a config field or the environment cannot give what ahead-of-time compilation needs."""


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str                   # as given
    generation: str             # v4 | v5e | v5p | v6e | cpu
    shape: tuple[int, ...]      # chips along each torus axis
    hbm_bytes: int

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def libtpu_name(self) -> str:
        return f"{self.generation}:{'x'.join(map(str, self.shape))}"


def parse_topology(name: str) -> Topology:
    """`v5p-128`, `v5e-64`, `v5litepod-64`, `v5p:4x4x4`, `v5e:2x2` or `cpu`."""
    if name == "cpu":
        return Topology("cpu", "cpu", (jax.device_count(),), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    explicit = re.fullmatch(r"(v4|v5e|v5p|v6e|v5litepod):(\d+(?:x\d+){1,2})", name)
    typed = re.fullmatch(r"(v4|v5e|v5p|v6e|v5litepod|v5lite)-(\d+)", name)
    if explicit:
        generation = _ALIASES.get(explicit[1], explicit[1])
        shape = tuple(int(n) for n in explicit[2].split("x"))
        want = 3 if generation in ("v4", "v5p") else 2
        if len(shape) != want:
            raise AotError(f"topology {name!r}: {generation} slices have {want} axes")
    elif typed:
        generation = _ALIASES.get(typed[1], typed[1])
        cores = int(typed[2])
        chips, rest = divmod(cores, _CORES_PER_CHIP[generation])
        table = _SHAPES_3D if generation in ("v4", "v5p") else _SHAPES_2D
        if rest or chips not in table:
            raise AotError(f"topology {name!r}: no {generation} slice of that size; sizes: "
                           + ", ".join(f"{generation}-{c * _CORES_PER_CHIP[generation]}" for c in table))
        shape = table[chips]
    else:
        raise AotError(f"topology {name!r} not understood: use an accelerator type such as v5p-128 or "
                       "v5e-64, an explicit shape such as v5p:4x4x4 or v5e:2x2, or cpu")
    return Topology(name, generation, shape, HBM_BYTES[generation])


def topology_devices(topology: Topology) -> list[Any]:
    """The topology's devices (TPU devices described by libtpu, or this host's CPU devices)."""
    if topology.generation == "cpu":
        return jax.devices("cpu")
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
    # Only described devices, never a real TPU: several processes may load libtpu at once (without
    # this, a second compiling process fails on libtpu's lockfile).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    chip_config = "megacore" if topology.generation in ("v4", "v5p") else "default"
    try:
        description = topologies.get_topology_desc(topology_name=topology.libtpu_name, platform="tpu",
                                                   chip_config_name=chip_config)
    except Exception as error:  # pylint: disable=broad-except  (no libtpu: RuntimeError/ValueError)
        raise AotError(f"cannot describe TPU topology {topology.libtpu_name} ({type(error).__name__}: "
                       f"{' '.join(str(error).split())[:300]}); install libtpu with "
                       "`TR_AOT=1 bash launch/setup.sh` (requirements-aot.txt)") from None
    devices = list(description.devices)
    if len(devices) != topology.chips:
        raise AotError(f"topology {topology.libtpu_name}: libtpu describes {len(devices)} devices, "
                       f"expected {topology.chips} chips")
    return devices


# ------------------------------------------------------------------------------------------------
# Reading the config
# ------------------------------------------------------------------------------------------------


def _field(section: Any, name: str, where: str) -> int:
    if name not in section:
        raise AotError(f"config.{where} lacks {name!r} (see tr/train/aot.py for the interface)")
    value = section[name]
    if not isinstance(value, int) or value < 1:
        raise AotError(f"config.{where}.{name} must be a positive int, got {value!r}")
    return value


def _model_config(config: ml_collections.ConfigDict):
    """`config.model` (a size's name, or `{name, overrides}`) with the pod's overrides."""
    model = config.model
    name, overrides = (model, {}) if isinstance(model, str) else (model.name, dict(model.overrides))
    return get_model_config(name, **{**overrides, **pod.model_overrides(config.pod)})


def planned_steps(config: ml_collections.ConfigDict) -> dict[str, dict[str, int]]:
    """`{step name: shapes}` for every step `config.shapes` names, checked field by field."""
    for field in ("model", "pod", "train", "shapes"):
        if field not in config:
            raise AotError(f"the config has no {field!r} field (see tr/train/aot.py for the interface)")
    unknown = sorted(set(config.shapes.keys()) - set(UPDATES) - {"sampler"})
    if unknown:
        raise AotError(f"config.shapes names {unknown}; known: {UPDATES + ('sampler',)}")
    plan: dict[str, dict[str, int]] = {}
    if "sampler" in config.shapes:
        s = {k: _field(config.shapes.sampler, k, "shapes.sampler") for k in ("rows", "prompt_len", "new_tokens")}
        plan["sampler_prefill"] = plan["sampler_decode"] = s
    for name in UPDATES:
        if name in config.shapes:
            shape = {k: _field(config.shapes[name], k, f"shapes.{name}") for k in ("rows", "length", "micro_batches")}
            if shape["rows"] % shape["micro_batches"]:
                raise AotError(f"config.shapes.{name}: rows={shape['rows']} is not a multiple of "
                               f"micro_batches={shape['micro_batches']}")
            if name == "grpo" and shape["rows"] % int(config.train.grpo.group_size):
                raise AotError(f"config.shapes.grpo.rows={shape['rows']} is not whole groups of "
                               f"config.train.grpo.group_size={config.train.grpo.group_size}")
            plan[name] = shape
    if not plan:
        raise AotError("config.shapes names no step to compile")
    return plan


# ------------------------------------------------------------------------------------------------
# Lowering every step
# ------------------------------------------------------------------------------------------------


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _batch(names, rows: int, length: int, mesh) -> dict[str, jax.ShapeDtypeStruct]:
    out = {}
    for name in names:
        shape = (rows,) if name == "is_recovery" else (rows, length)
        out[name] = jax.ShapeDtypeStruct(shape, _BATCH_DTYPES[name],
                                         sharding=sharding_lib.batch_sharding(mesh, len(shape)))
    return out


def lower_steps(config: ml_collections.ConfigDict, devices: list[Any]) -> dict[str, Callable[[], Any]]:
    """`{step name: thunk}`; each thunk lowers that step for `devices`: `(Lowered, abstract inputs)`."""
    plan = planned_steps(config)
    model_config = _model_config(config)
    mesh = pod.make_mesh(config.pod, devices)
    rules = pod.axis_rules(config.pod)
    needs_critic = any(name in plan for name in ("critic", "ppo"))
    with sharding_lib.axis_rules(rules):
        actor = nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0)))
        critic = nnx.eval_shape(lambda: CriticModel(model_config, rngs=nnx.Rngs(1))) if needs_critic else None
        fns = nnx_model_fns(actor, critic, chunk_size=int(config.train.logprob_chunk_size),
                            temperature=float(config.train.get("policy_temperature", 1.0)))
        actor_opt = make_optimizer(config.train.actor.optimizer)
        critic_opt = make_optimizer(config.train.critic.optimizer)
        state = jax.eval_shape(lambda a, c: create_train_state(
            actor_params=a, actor_optimizer=actor_opt, critic_params=c,
            critic_optimizer=critic_opt if needs_critic else None), fns.actor_params, fns.critic_params)
        shardings = train_state_shardings(
            state, mesh, actor_param_shardings=nnx_param_shardings(actor, mesh),
            critic_param_shardings=nnx_param_shardings(critic, mesh) if needs_critic else None)
    abstract_state = _abstract(state, shardings)

    def under_rules(fn):
        def thunk():
            with sharding_lib.axis_rules(rules), jax.set_mesh(mesh):
                return fn()
        return thunk

    thunks: dict[str, Callable[[], Any]] = {}
    for name in UPDATES:
        if name not in plan:
            continue
        shape = plan[name]
        train = ml_collections.ConfigDict(config.train.to_dict())
        train.num_micro_batches = shape["micro_batches"]
        steps = build_steps(train, actor_logprobs=fns.actor_logprobs,
                            critic_values=fns.critic_values if needs_critic else None,
                            state_sharding=shardings, donate=True)
        batch = _batch(REQUIRED[name], shape["rows"], shape["length"], mesh)
        thunks[name] = under_rules(lambda step=getattr(steps, name), batch=batch:
                                   (step.lower(abstract_state, batch), (abstract_state, batch)))
    if "sampler_prefill" in plan:
        thunks.update({k: under_rules(v) for k, v in _sampler_thunks(
            plan["sampler_prefill"], model_config, actor, abstract_state.actor_params, mesh, rules).items()})
    return thunks


def _sampler_thunks(shape, model_config, actor, actor_params, mesh, rules) -> dict[str, Callable[[], Any]]:
    """Prefill (the prompt bucket into a fresh cache) and one decode step (one token per row, the
    cache donated), as `tr.sampling` runs them through `Decoder.hidden_states(..., cache=)`."""
    graphdef, _, rest = nnx.split(actor, nnx.Param, ...)
    rows, prompt_len, new_tokens = shape["rows"], shape["prompt_len"], shape["new_tokens"]
    cache_len = prompt_len + new_tokens

    def merge(params):
        return nnx.merge(graphdef, params, rest)

    def prefill(params, tokens, positions, mask):
        model = merge(params)
        cache = init_cache(model_config, rows, cache_len)
        hidden, cache = model.hidden_states(tokens, positions, cache=cache, token_mask=mask)
        return cache, model.project(hidden[:, -1])

    def decode(params, cache, tokens, positions):
        model = merge(params)
        hidden, cache = model.hidden_states(tokens, positions, cache=cache)
        return cache, model.project(hidden[:, -1])

    with sharding_lib.axis_rules(rules):
        cache_axes = KVCache.logical_axes()
        cache_abstract = jax.eval_shape(lambda: init_cache(model_config, rows, cache_len))
        cache_sharding = jax.tree.map(
            lambda x, axes: NamedSharding(mesh, sharding_lib.logical_to_spec(axes, x.shape, dict(mesh.shape))),
            cache_abstract, cache_axes, is_leaf=lambda x: isinstance(x, tuple))
        logits_sharding = NamedSharding(mesh, sharding_lib.logical_to_spec(
            ("activation_batch", "activation_vocab"), (rows, model_config.vocab_size), dict(mesh.shape)))
    cache_in = _abstract(cache_abstract, cache_sharding)
    param_sharding = jax.tree.map(lambda x: x.sharding, actor_params)

    def ids(length, dtype=jnp.int32):  # [rows, length]: rows over (data, fsdp), length over context if it divides
        spec = sharding_lib.logical_to_spec(("activation_batch", "activation_length"), (rows, length),
                                            dict(mesh.shape), rules)
        return jax.ShapeDtypeStruct((rows, length), dtype, sharding=NamedSharding(mesh, spec))

    prefill_args = (actor_params, ids(prompt_len), ids(prompt_len), ids(prompt_len, jnp.bool_))
    decode_args = (actor_params, cache_in, ids(1), ids(1))
    jit_prefill = jax.jit(prefill, in_shardings=(param_sharding, *(a.sharding for a in prefill_args[1:])),
                          out_shardings=(cache_sharding, logits_sharding))
    jit_decode = jax.jit(decode, in_shardings=(param_sharding, cache_sharding, decode_args[2].sharding,
                                               decode_args[3].sharding),
                         out_shardings=(cache_sharding, logits_sharding), donate_argnums=(1,))
    return {"sampler_prefill": lambda: (jit_prefill.lower(*prefill_args), prefill_args),
            "sampler_decode": lambda: (jit_decode.lower(*decode_args), decode_args)}


# ------------------------------------------------------------------------------------------------
# Memory report
# ------------------------------------------------------------------------------------------------


def _per_chip_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of `ShapeDtypeStruct`s (replicated when no sharding)."""
    total = 0
    for x in jax.tree.leaves(tree):
        sharding = getattr(x, "sharding", None)
        shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
        total += math.prod(shape) * np.dtype(x.dtype).itemsize
    return total


_OUT_OF_HBM = re.compile(r"HLO temporaries \(([\d.]+)([KMGT]?)\)")


def step_memory(lowered: Any, inputs: Any, hbm_bytes: int) -> dict[str, Any]:
    """Per-chip bytes of one step (see the module docstring for `total`).

    When XLA refuses to compile because the step's temporaries exceed the chip's HBM, the report
    carries XLA's own figure for them and the arguments' and outputs' shard sizes (no aliasing).
    """
    try:
        stats = lowered.compile().memory_analysis()
    except jax.errors.JaxRuntimeError as error:
        found = _OUT_OF_HBM.search(str(error))
        if "RESOURCE_EXHAUSTED" not in str(error) or not found:
            raise
        temp = int(float(found[1]) * 1024 ** " KMGT".index(found[2] or " "))
        argument, output = _per_chip_bytes(inputs), _per_chip_bytes(lowered.out_info)
        return {"argument_bytes": argument, "output_bytes": output, "temp_bytes": temp,
                "total_bytes": argument + output + temp, "fits": False}
    argument, output = int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes)
    temp, alias = int(stats.temp_size_in_bytes), int(stats.alias_size_in_bytes)
    total = argument + output - alias + temp
    return {"argument_bytes": argument, "output_bytes": output, "temp_bytes": temp, "total_bytes": total,
            "fits": total <= hbm_bytes}


def compile_report(config: ml_collections.ConfigDict, topology_name: str,
                   on_step: Callable[[str], None] | None = None,
                   only: tuple[str, ...] = ()) -> dict[str, Any]:
    """Compile every step of `config` (or those named in `only`) for `topology_name`; the JSON
    report (module docstring)."""
    topology = parse_topology(topology_name)
    devices = topology_devices(topology)
    thunks = lower_steps(config, devices)
    unknown = sorted(set(only) - set(thunks))
    if unknown:
        raise AotError(f"--steps names {unknown}; this config runs {sorted(thunks)}")
    steps = {}
    for name, thunk in thunks.items():
        if only and name not in only:
            continue
        if on_step is not None:
            on_step(name)
        lowered, inputs = thunk()
        steps[name] = step_memory(lowered, inputs, topology.hbm_bytes)
        if on_step is not None:
            on_step(f"{name}: {json.dumps(steps[name])}")
    return {"topology": topology.name, "chips": topology.chips, "hbm_bytes": topology.hbm_bytes,
            "steps": steps, "fits": all(s["fits"] for s in steps.values())}


def format_report(report: dict[str, Any]) -> str:
    """The report as a table, GiB per chip."""
    gib = lambda n: f"{n / GiB:9.2f}"  # noqa: E731
    lines = [f"topology {report['topology']}: {report['chips']} chips, HBM {report['hbm_bytes'] / GiB:.1f} GiB "
             "per chip (GiB per chip below)",
             f"{'step':<16}{'argument':>9}{'output':>9}{'temp':>9}{'total':>9}  fits"]
    for name, s in report["steps"].items():
        lines.append(f"{name:<16}{gib(s['argument_bytes'])}{gib(s['output_bytes'])}{gib(s['temp_bytes'])}"
                     f"{gib(s['total_bytes'])}  {'yes' if s['fits'] else 'NO'}")
    lines.append(f"all steps fit: {'yes' if report['fits'] else 'NO'}")
    return "\n".join(lines)


def run(config: ml_collections.ConfigDict, workdir) -> dict[str, Any]:
    """The `aot` job (experiments/main.py): compile for `config.aot.topology`, write aot.json/aot.txt."""
    report = compile_report(config, config.aot.topology, on_step=lambda n: print(f"compiling {n}", flush=True))
    (workdir / "aot.json").write_text(json.dumps(report, indent=2) + "\n")
    (workdir / "aot.txt").write_text(format_report(report) + "\n")
    print(format_report(report))
    return report

