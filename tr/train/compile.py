"""Compiled update steps: `build_steps(config, ...)` jits the updates of `tr.train.updates` with
their config, optimizers and (optionally) a device mesh and state shardings; `run_epochs` runs PPO
epochs and mini-batches over one prepared rollout batch.
"""

from __future__ import annotations

import functools
import pathlib
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from tr.rl import advantages as adv_lib
from tr.train import updates
from tr.train.microbatch import bucket_layout, data_rows, micro_batch_count
from tr.train.model_fns import ActorFn, Batch, CriticFn
from tr.train.optim import make_optimizer
from tr.train.state import TrainState

StepFn = Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]


class UpdateSteps(NamedTuple):
    """The compiled steps, each `(state, batch) -> (state, metrics)`, except `targets`
    (`(state, batch) -> {old_logprobs, old_values, advantages, returns}`); None if not buildable."""

    sft: StepFn | None
    critic: StepFn | None
    ppo: StepFn | None
    grpo: StepFn | None
    targets: Callable | None = None


class _OneRolloutPerRow:
    """The compiled GRPO step behind a host-side check that every row is one whole rollout."""

    def __init__(self, step):
        self._step = step
        self.lower = getattr(step, "lower", None)
        functools.update_wrapper(self, step)

    def __call__(self, state, batch):
        adv_lib.check_one_rollout_per_row(batch, where="grpo step")
        return self._step(state, batch)


def build_steps(config: ml_collections.ConfigDict, *, actor_logprobs: ActorFn | None = None,
                critic_values: CriticFn | None = None, mesh: Mesh | None = None,
                state_sharding: TrainState | None = None, donate: bool = False,
                actor_logprobs_entropy=None) -> UpdateSteps:
    """`jax.jit`-compiled update steps from `config` (see `tr.train.updates.default_config`).

    `actor_logprobs_entropy` (`ModelFns.actor_logprobs_entropy`) is needed only for an entropy
    bonus (`ppo.entropy_coef` / `grpo.entropy_coef` other than 0).

    With a `mesh`, the state is laid out as `state_sharding` (a TrainState of shardings, e.g.
    `tr.train.shardings.train_state_shardings`) on input and output, the batch keeps the sharding
    it was placed with (`shard_batch`), and the model's activation constraints see the mesh.
    `donate=True` lets XLA reuse the input state's buffers (the caller must not read the old
    state afterwards).
    """
    n = int(config.num_micro_batches)
    if n < 1:
        raise ValueError(f"config.num_micro_batches must be >= 1, got {n}")
    micro_rows = int(config.get("micro_batch_rows", 0))

    def per_batch(fn):
        """`fn(state, batch)` with `num_micro_batches` from the batch's rows when
        `micro_batch_rows` is set (read at trace time: a static shape)."""
        if micro_rows <= 0:
            return functools.partial(fn, num_micro_batches=n)

        @functools.wraps(fn)
        def call(state, batch):
            return fn(state, batch, num_micro_batches=micro_batch_count(
                int(batch["tokens"].shape[0]), micro_batch_rows=micro_rows))
        return call
    actor_opt = make_optimizer(config.actor.optimizer)
    critic_opt = make_optimizer(config.critic.optimizer)
    params = config.ppo.to_dict()

    def on_mesh(jitted, fn):
        if mesh is None:
            return jitted

        @functools.wraps(fn)
        def call(*args):
            with jax.set_mesh(mesh):
                return jitted(*args)
        call.lower = jitted.lower
        return call

    def compile_step(fn):
        shardings = {}
        if state_sharding is not None:
            shardings = {"in_shardings": (state_sharding, None),
                         "out_shardings": (state_sharding, None)}
        return on_mesh(jax.jit(fn, donate_argnums=(0,) if donate else (), **shardings), fn)

    sft = critic = ppo = grpo = None
    if actor_logprobs is not None:
        sft = compile_step(per_batch(functools.partial(
            updates.sft_update, actor_logprobs=actor_logprobs, actor_optimizer=actor_opt)))
        grpo = _OneRolloutPerRow(compile_step(per_batch(functools.partial(
            updates.grpo_update, actor_logprobs=actor_logprobs, actor_optimizer=actor_opt,
            group_size=int(config.grpo.group_size), eps_low=config.grpo.eps_low,
            eps_high=config.grpo.eps_high, std_eps=config.grpo.std_eps,
            policy_loss=config.grpo.get("policy_loss", "ppo"),
            group_weighting=config.grpo.get("group_weighting", "equal"),
            aggregation=config.grpo.get("aggregation", "token_mean"),
            aggregation_constant=float(config.grpo.get("aggregation_constant", 0.0)),
            kl_coef=float(config.grpo.get("kl_coef", 0.0)),
            entropy_coef=float(config.grpo.get("entropy_coef", 0.0)),
            actor_logprobs_entropy=actor_logprobs_entropy))))
    if critic_values is not None:
        critic = compile_step(per_batch(functools.partial(
            updates.critic_update, critic_values=critic_values, critic_optimizer=critic_opt,
            params=params)))
    if actor_logprobs is not None and critic_values is not None:
        ppo = compile_step(per_batch(functools.partial(
            updates.ppo_update, actor_logprobs=actor_logprobs, critic_values=critic_values,
            actor_optimizer=actor_opt, critic_optimizer=critic_opt, params=params,
            actor_logprobs_entropy=actor_logprobs_entropy)))
    targets_fn = per_batch(functools.partial(updates.rollout_targets,
                                             actor_logprobs=actor_logprobs,
                                             critic_values=critic_values, params=params))
    targets = on_mesh(jax.jit(targets_fn), targets_fn)
    return UpdateSteps(sft=sft, critic=critic, ppo=ppo, grpo=grpo, targets=targets)


def mini_batch_order(rows: int, *, epochs: int, mini_batches: int, seed: int,
                     has_data: np.ndarray | None = None) -> np.ndarray:
    """`[epochs, mini_batches, rows / mini_batches]` row indices: each epoch a fresh permutation
    (seeded by `(seed, epoch)`), cut into equal mini-batches. With `has_data [rows]` (false on
    padding rows), data rows are dealt round-robin first, so no mini-batch is padding only while
    another holds several data rows (an update on padding alone would move Adam by momentum)."""
    if epochs < 1 or mini_batches < 1:
        raise ValueError(f"ppo.epochs={epochs} and ppo.mini_batches={mini_batches} must be >= 1")
    if rows % mini_batches:
        raise ValueError(f"a rollout batch of {rows} rows cannot be cut into {mini_batches} equal "
                         "mini-batches (ppo.mini_batches must divide the batch's rows)")
    order = []
    for e in range(epochs):
        perm = np.random.default_rng([seed, e]).permutation(rows)
        if has_data is not None:
            data = np.asarray(has_data, bool)[perm]
            perm = np.concatenate([perm[data], perm[~data]])
            perm = perm.reshape(rows // mini_batches, mini_batches).T.reshape(-1)  # round-robin
        order.append(perm)
    return np.stack(order).reshape(epochs, mini_batches, rows // mini_batches)


def run_epochs(update: StepFn, state: TrainState, prepared: Batch, *, epochs: int = 1,
               mini_batches: int = 1, seed: int = 0, micro_batch_rows: int = 0
               ) -> tuple[TrainState, list[dict]]:
    """`epochs` passes over one prepared rollout batch, `mini_batches` optimizer updates each.

    `prepared` already holds the targets (`UpdateSteps.targets`), so every update reuses the
    `old_values`, `advantages`, `returns` and `old_logprobs` of the batch's rollout state. With
    `micro_batch_rows` (the steps' `train.micro_batch_rows`), each mini-batch's data rows are laid
    out in a buffer of the batch's own row count (`bucket_layout`): the full batch and every
    mini-batch run one compiled step, skipping the empty micro-batches. Returns the state and each
    update's metrics (host floats).
    """
    rows = int(prepared["tokens"].shape[0])
    missing = [k for k in updates.TARGET_FIELDS if k not in prepared]
    if missing:
        raise ValueError(f"run_epochs: the batch lacks its targets {missing}; compute them once "
                         "with UpdateSteps.targets before the first update")
    has_data = np.zeros(rows, bool)
    has_data[data_rows(prepared, tokens=False)] = True     # a masked token: the rows updates read
    order = mini_batch_order(rows, epochs=epochs, mini_batches=mini_batches, seed=seed,
                             has_data=has_data)
    history = []
    for epoch in range(epochs):
        for rows_idx in order[epoch]:
            if micro_batch_rows > 0:
                rows_idx = np.sort(rows_idx)
                mb = bucket_layout(prepared, rows_idx[has_data[rows_idx]], rows=rows,
                                   micro_batch_rows=micro_batch_rows, links=False)
            elif mini_batches == 1 and epochs == 1:
                mb = prepared
            else:
                idx = jnp.asarray(np.sort(rows_idx))
                mb = {k: jnp.take(v, idx, axis=0) for k, v in prepared.items()}
            state, metrics = update(state, mb)
            history.append({k: float(v) for k, v in jax.device_get(metrics).items()})
    return state, history


def use_compilation_cache(folder) -> None:
    """JAX's persistent compilation cache in `folder` (unless one is set already): the stages of a
    job rebuild the same update and sampler graphs, so a later stage reuses an earlier stage's
    executables and a resumed run compiles nothing again."""
    if jax.config.jax_compilation_cache_dir:
        return
    pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


class CompileClock:
    """Seconds JAX spent making executables since the clock was made, read off `jax.monitoring`:
    `trace` (Python to jaxpr), `lower` (jaxpr to StableHLO), `backend` (XLA compiles, cache misses
    only) and the persistent cache's `hits` / `misses`. What a stage's wall time owes to compiling
    rather than to rollouts and updates (`stage_compile_s.json` of terminal_rsi)."""

    _EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
               "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
               "/jax/core/compile/backend_compile_duration": "backend_s"}
    _COUNTS = {"/jax/compilation_cache/cache_hits": "cache_hits",
               "/jax/compilation_cache/cache_misses": "cache_misses"}
    _totals: dict[str, float] = {}
    _registered = False

    def __init__(self):
        CompileClock._register()
        self._start = dict(CompileClock._totals)

    @classmethod
    def _register(cls) -> None:
        if cls._registered:
            return
        cls._registered = True

        def on_duration(event, duration, fun_name=None, **_):
            name = cls._EVENTS.get(event)
            if name:
                cls._totals[name] = cls._totals.get(name, 0.0) + float(duration)
            if name == "backend_s" and fun_name:
                cls._totals[f"xla:{fun_name}"] = cls._totals.get(f"xla:{fun_name}", 0.0) + float(duration)

        def on_event(event, **_):
            name = cls._COUNTS.get(event)
            if name:
                cls._totals[name] = cls._totals.get(name, 0.0) + 1

        jax.monitoring.register_event_duration_secs_listener(on_duration)
        jax.monitoring.register_event_listener(on_event)

    def read(self) -> dict[str, float]:
        """The counters' increase since this clock was made (seconds rounded to 0.1 s)."""
        names = list(self._EVENTS.values()) + list(self._COUNTS.values())
        out = {n: round(self._totals.get(n, 0.0) - self._start.get(n, 0.0), 1) for n in names}
        per_function = {n[4:]: round(v - self._start.get(n, 0.0), 1)
                        for n, v in self._totals.items() if n.startswith("xla:")}
        out["backend_s_by_function"] = {n: v for n, v in sorted(per_function.items()) if v > 0}
        return out
