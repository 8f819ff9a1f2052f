"""Update steps: `sft`, `critic`, `ppo`, `grpo`: pure functions, state in, state and metrics out.

Every step is written over two small functions of pure parameter pytrees, not over a model class:

    actor_logprobs(actor_params, batch) -> logp [B, L]    log π(tokens[i] | tokens[<i]), 0 at i = 0
    critic_values(critic_params, batch) -> v [B, L]       pre-token values v_i = V(h_i)

(`nnx_model_fns` builds both from `tr.models` NNX modules, with chunked log-probs.) The batch is a
dict of SPEC §2 arrays (`tokens, actor_mask, loss_mask, turn_ids, rewards, dones, logprobs`, all
`[B, L]`, plus optional `positions`, `segment_ids`; GRPO also `is_recovery [B]`).

| step     | trains  | loss (tr/rl/losses.py)                                   | frozen, bitwise    |
|----------|---------|----------------------------------------------------------|--------------------|
| `sft`    | actor   | masked NLL over `loss_mask`                              | critic             |
| `critic` | critic  | clipped value loss vs TB-GAE returns, over `actor_mask`  | actor              |
| `ppo`    | both    | asymmetric-clip PPO (`loss_mask`) + clipped value loss   | —                  |
| `grpo`   | actor   | ReTerm objective: clipped surrogate, group-weighted      | critic             |

**Exact micro-batching.** A batch of `B` rows is split into `n` micro-batches (row `r` goes to
micro-batch `r mod n`, so each stays spread over the data-parallel devices). Every loss is a sum
`Σ_i c_i ℓ_i` whose coefficients are fixed on the *whole* batch first (advantages, TB-GAE returns,
ReTerm token weights), so the accumulated gradient
`Σ_mb ∇ numerator_mb / Σ_mb denominator_mb` equals the full-batch gradient up to float rounding.

**Critic targets** (`critic`, `ppo`): the current critic's values `V_old` on the whole batch, then
TB-GAE (`tr.rl.advantages.tb_gae`, `γ_turn`, `λ_turn`) gives advantages `A` and returns `G = A +
V_old`. Explained variance `EV = 1 − Var(G − V_old)/Var(G)` over `actor_mask` (the critic's
values before the update against the targets it is trained on) is logged at every critic update
(`critic` and `ppo` steps) as `critic/explained_variance`.

Optimizers are optax chains built from an ml_collections config (`default_config`): clip by global
norm, then AdamW on a learning-rate schedule; actor and critic have their own.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Bool, Float

from tr.rl import advantages as adv_lib
from tr.rl import losses
from tr.train.state import TrainState

PyTree = Any
Batch = dict[str, jax.Array]
ActorFn = Callable[[PyTree, Batch], Float[Array, "b l"]]
CriticFn = Callable[[PyTree, Batch], Float[Array, "b l"]]
StepFn = Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]

_REQUIRED = {
    "sft": ("tokens", "loss_mask"),
    "critic": ("tokens", "actor_mask", "turn_ids", "rewards", "dones"),
    "ppo": ("tokens", "actor_mask", "loss_mask", "turn_ids", "rewards", "dones", "logprobs"),
    "grpo": ("tokens", "actor_mask", "loss_mask", "rewards", "logprobs", "is_recovery"),
}


# ------------------------------------------------------------------------------------------------
# Config and optimizers
# ------------------------------------------------------------------------------------------------


def optimizer_config(learning_rate: float, grad_clip_norm: float | None) -> ml_collections.ConfigDict:
    """One side's optimizer: AdamW on a schedule, after clipping by global norm (None: no clip)."""
    return ml_collections.ConfigDict({
        "learning_rate": learning_rate,
        "schedule": "constant",  # constant | warmup_constant | warmup_cosine
        "warmup_steps": 0,
        "decay_steps": 1000,     # warmup_cosine: steps from the start to the end of the decay
        "end_learning_rate_factor": 0.0,
        "b1": 0.9,
        "b2": 0.999,
        "eps": 1e-8,
        "weight_decay": 0.0,
        "grad_clip_norm": ml_collections.FieldReference(grad_clip_norm, field_type=float),
    })


def default_config() -> ml_collections.ConfigDict:
    """Table 1 of the Terminal-RSI paper (SPEC §6) for PPO; ReTerm-GRPO lr 5e-7, groups of 16.

    The actor's global-norm clip (1.0) is a common default, not a number from the papers.
    """
    return ml_collections.ConfigDict({
        "actor": {"optimizer": optimizer_config(5e-7, 1.0)},
        "critic": {"optimizer": optimizer_config(1.5e-5, 100.0)},
        "ppo": {
            "eps_low": 0.30,
            "eps_high": 5.00,
            "eps_value": 4.00,
            "kl_coef": 0.0,
            "entropy_coef": 0.0,
            "gamma_turn": 1.0,  # the documented RPR-1 run used γ = λ = 1 (unit-clock equivalence)
            "lam_turn": 1.0,
        },
        "grpo": {"group_size": 16, "eps_low": 0.30, "eps_high": 5.00, "std_eps": 1e-6},
        "num_micro_batches": 1,
        "logprob_chunk_size": 1024,
    })


def make_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
    """The learning-rate schedule named by `config.schedule`."""
    lr, warmup = float(config.learning_rate), int(config.warmup_steps)
    if config.schedule == "constant":
        return optax.constant_schedule(lr)
    if config.schedule == "warmup_constant":
        return optax.join_schedules(
            [optax.linear_schedule(0.0, lr, max(warmup, 1)), optax.constant_schedule(lr)], [warmup])
    if config.schedule == "warmup_cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, lr, warmup, max(int(config.decay_steps), warmup + 1),
            end_value=lr * float(config.end_learning_rate_factor))
    raise ValueError(f"optimizer schedule {config.schedule!r} unknown; expected one of "
                     "'constant', 'warmup_constant', 'warmup_cosine'")


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """`clip_by_global_norm(grad_clip_norm)` (if set) then AdamW with `make_schedule(config)`."""
    for field in ("learning_rate", "b1", "b2", "eps", "weight_decay"):
        value = config[field]
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"optimizer config field {field!r} must be a number >= 0, got {value!r}")
    parts = []
    if config.grad_clip_norm is not None:
        if config.grad_clip_norm <= 0:
            raise ValueError(f"optimizer config grad_clip_norm must be > 0 or None, got "
                             f"{config.grad_clip_norm!r}")
        parts.append(optax.clip_by_global_norm(float(config.grad_clip_norm)))
    parts.append(optax.adamw(make_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps,
                             weight_decay=config.weight_decay))
    return optax.chain(*parts)


# ------------------------------------------------------------------------------------------------
# Micro-batching
# ------------------------------------------------------------------------------------------------


def split_micro_batches(batch: Batch, num_micro_batches: int) -> Batch:
    """Each `[B, ...]` array as `[n, B/n, ...]`; row `r` goes to micro-batch `r mod n`."""
    sizes = {k: jnp.shape(v)[0] for k, v in batch.items()}
    rows = next(iter(sizes.values()))
    bad = {k: s for k, s in sizes.items() if s != rows}
    if bad:
        raise ValueError(f"batch arrays disagree on the number of rows: {sizes}")
    if rows % num_micro_batches:
        raise ValueError(f"batch of {rows} rows cannot be split into {num_micro_batches} equal "
                         "micro-batches (num_micro_batches must divide the batch size)")
    n = num_micro_batches
    return {k: v.reshape(rows // n, n, *v.shape[1:]).swapaxes(0, 1) for k, v in batch.items()}


def merge_micro_batches(x: jax.Array) -> jax.Array:
    """Inverse of `split_micro_batches` for one array `[n, B/n, ...] -> [B, ...]`."""
    return x.swapaxes(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _map_micro_batches(fn: Callable[[Batch], jax.Array], batch: Batch, n: int) -> jax.Array:
    """`fn` over the rows of `batch`, `n` micro-batches at a time (forward passes, no gradient)."""
    if n == 1:
        return fn(batch)
    return merge_micro_batches(jax.lax.map(fn, split_micro_batches(batch, n)))


def _accumulate(grad_fn: Callable[[Batch], tuple[PyTree, PyTree]], batch: Batch, n: int):
    """`Σ_mb grad_fn(mb)` over `n` micro-batches with `lax.scan` (a tree of grads and LossTerms)."""
    if n == 1:
        return grad_fn(batch)
    micro = split_micro_batches(batch, n)
    first = jax.tree.map(lambda x: x[0], micro)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(grad_fn, first))

    def body(total, mb):
        return jax.tree.map(jnp.add, total, grad_fn(mb)), None

    total, _ = jax.lax.scan(body, zeros, micro)
    return total


# ------------------------------------------------------------------------------------------------
# The pure update functions
# ------------------------------------------------------------------------------------------------


def _check_batch(kind: str, batch: Batch) -> None:
    missing = [k for k in _REQUIRED[kind] if k not in batch]
    if missing:
        raise ValueError(f"{kind} step: the batch lacks {missing} (has {sorted(batch)})")
    chex.assert_rank(batch["tokens"], 2)
    for key, value in batch.items():
        if key in ("is_recovery",):
            chex.assert_shape(value, batch["tokens"].shape[:1])
        else:
            if jnp.shape(value) != jnp.shape(batch["tokens"]):
                raise ValueError(f"{kind} step: batch[{key!r}] has shape {jnp.shape(value)}, "
                                 f"expected {jnp.shape(batch['tokens'])} (the shape of 'tokens')")
    for key in ("rewards", "logprobs"):
        if key in batch and not jnp.issubdtype(batch[key].dtype, jnp.floating):
            raise ValueError(f"{kind} step: batch[{key!r}] must be floating point, got "
                             f"{batch[key].dtype} (a fractional reward would be truncated)")


def _apply(optimizer, grads, opt_state, params):
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _scale(tree: PyTree, denominator: jax.Array) -> PyTree:
    return jax.tree.map(lambda g: g / jnp.maximum(denominator, 1.0), tree)


def _prefixed(prefix: str, metrics: dict) -> dict:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}


def critic_targets(critic_values: CriticFn, critic_params: PyTree, batch: Batch, *,
                   gamma_turn: float, lam_turn: float, num_micro_batches: int = 1
                   ) -> tuple[Float[Array, "b l"], Float[Array, "b l"], Float[Array, "b l"]]:
    """`(V_old, A, G)`: the critic's values on the batch, TB-GAE advantages and returns `A + V_old`."""
    values = _map_micro_batches(lambda mb: critic_values(critic_params, mb), batch,
                                num_micro_batches)
    values = jax.lax.stop_gradient(values.astype(jnp.float32))
    gae = adv_lib.tb_gae(batch["rewards"], values, batch["actor_mask"], batch["turn_ids"],
                         batch["dones"], gamma_turn=gamma_turn, lam_turn=lam_turn)
    return values, gae.advantages, gae.returns


def sft_update(state: TrainState, batch: Batch, *, actor_logprobs: ActorFn,
               actor_optimizer: optax.GradientTransformation, num_micro_batches: int = 1
               ) -> tuple[TrainState, dict]:
    """One SFT update of the actor: `L = −Σ_i m_i log π(y_i|h_i) / Σ_i m_i`, `m = loss_mask`."""
    _check_batch("sft", batch)

    def grad_fn(mb):
        def numerator(params):
            terms = losses.sft_loss_terms(actor_logprobs(params, mb), mb["loss_mask"])
            return terms.numerator, terms
        grads, terms = jax.grad(numerator, has_aux=True)(state.actor_params)
        return grads, terms

    grads, terms = _accumulate(grad_fn, batch, num_micro_batches)
    grads = _scale(grads, terms.denominator)
    params, opt_state = _apply(actor_optimizer, grads, state.actor_opt_state, state.actor_params)
    metrics = {**_prefixed("actor", terms.metrics), "actor/loss": terms.loss,
               "actor/grad_norm": optax.tree.norm(grads)}
    return state.replace(step=state.step + 1, actor_params=params, actor_opt_state=opt_state), metrics


def critic_update(state: TrainState, batch: Batch, *, critic_values: CriticFn,
                  critic_optimizer: optax.GradientTransformation, gamma_turn: float = 1.0,
                  lam_turn: float = 1.0, eps_value: float = losses.EPS_VALUE,
                  num_micro_batches: int = 1) -> tuple[TrainState, dict]:
    """One critic-only update (calibration, warm-up): clipped value loss vs TB-GAE returns.

    The actor is not read and not written.
    """
    _check_batch("critic", batch)
    values_old, _, returns = critic_targets(
        critic_values, state.critic_params, batch, gamma_turn=gamma_turn, lam_turn=lam_turn,
        num_micro_batches=num_micro_batches)
    full = {**batch, "_values_old": values_old, "_returns": returns}

    def grad_fn(mb):
        def numerator(params):
            terms = losses.value_loss_terms(critic_values(params, mb), mb["_values_old"],
                                            mb["_returns"], mb["actor_mask"], eps_value=eps_value)
            return terms.numerator, terms
        return jax.grad(numerator, has_aux=True)(state.critic_params)

    grads, terms = _accumulate(grad_fn, full, num_micro_batches)
    grads = _scale(grads, terms.denominator)
    params, opt_state = _apply(critic_optimizer, grads, state.critic_opt_state, state.critic_params)
    metrics = {
        **_prefixed("critic", terms.metrics),
        "critic/loss": terms.loss,
        "critic/grad_norm": optax.tree.norm(grads),
        "critic/explained_variance": adv_lib.explained_variance(returns, values_old,
                                                                batch["actor_mask"]),
    }
    return state.replace(step=state.step + 1, critic_params=params,
                         critic_opt_state=opt_state), metrics


def ppo_update(state: TrainState, batch: Batch, *, actor_logprobs: ActorFn,
               critic_values: CriticFn, actor_optimizer: optax.GradientTransformation,
               critic_optimizer: optax.GradientTransformation, eps_low: float = losses.EPS_LOW,
               eps_high: float = losses.EPS_HIGH, eps_value: float = losses.EPS_VALUE,
               kl_coef: float = 0.0, entropy_coef: float = 0.0, gamma_turn: float = 1.0,
               lam_turn: float = 1.0, num_micro_batches: int = 1) -> tuple[TrainState, dict]:
    """One joint PPO update of actor and critic, each with its own optimizer.

    Targets `(V_old, A, G)` from `critic_targets`; the actor minimises the asymmetric-clip policy
    loss over `loss_mask` with `ρ = exp(logp − batch['logprobs'])`, the critic the clipped value
    loss over `actor_mask`. KL and entropy terms are not supported by this step (coefficients 0,
    the paper's setting); a non-zero coefficient raises.
    """
    _check_batch("ppo", batch)
    if kl_coef or entropy_coef:
        raise ValueError(f"ppo step: kl_coef={kl_coef} and entropy_coef={entropy_coef} must be 0 "
                         "(the paper's setting; reference log-probs are not wired in)")
    values_old, advantages, returns = critic_targets(
        critic_values, state.critic_params, batch, gamma_turn=gamma_turn, lam_turn=lam_turn,
        num_micro_batches=num_micro_batches)
    full = {**batch, "_values_old": values_old, "_advantages": advantages, "_returns": returns}

    def grad_fn(mb):
        def numerators(actor_params, critic_params):
            policy = losses.ppo_policy_loss_terms(
                actor_logprobs(actor_params, mb), mb["logprobs"], mb["_advantages"],
                mb["loss_mask"], eps_low=eps_low, eps_high=eps_high)
            value = losses.value_loss_terms(critic_values(critic_params, mb), mb["_values_old"],
                                            mb["_returns"], mb["actor_mask"], eps_value=eps_value)
            return policy.numerator + value.numerator, (policy, value)
        grads, terms = jax.grad(numerators, argnums=(0, 1), has_aux=True)(
            state.actor_params, state.critic_params)
        return grads, terms

    (actor_grads, critic_grads), (policy, value) = _accumulate(grad_fn, full, num_micro_batches)
    actor_grads = _scale(actor_grads, policy.denominator)
    critic_grads = _scale(critic_grads, value.denominator)
    actor_params, actor_opt = _apply(actor_optimizer, actor_grads, state.actor_opt_state,
                                     state.actor_params)
    critic_params, critic_opt = _apply(critic_optimizer, critic_grads, state.critic_opt_state,
                                       state.critic_params)
    metrics = {
        **_prefixed("actor", policy.metrics),
        **_prefixed("critic", value.metrics),
        "actor/loss": policy.loss,
        "critic/loss": value.loss,
        "actor/grad_norm": optax.tree.norm(actor_grads),
        "critic/grad_norm": optax.tree.norm(critic_grads),
        "critic/explained_variance": adv_lib.explained_variance(returns, values_old,
                                                                batch["actor_mask"]),
    }
    new_state = state.replace(step=state.step + 1, actor_params=actor_params,
                              actor_opt_state=actor_opt, critic_params=critic_params,
                              critic_opt_state=critic_opt)
    return new_state, metrics


def grpo_advantages_for_rows(rewards: Float[Array, "b l"], actor_mask: Bool[Array, "b l"],
                             group_size: int, std_eps: float) -> Float[Array, "b l"]:
    """GRPO advantages of rows laid out in consecutive groups of `group_size` rollouts.

    Row reward `R_r = Σ_l rewards[r, l]`; `Â = (R − mean_g R)/(std_g R + δ)` per group
    (`tr.rl.advantages.grpo_advantages`), broadcast to the row's action tokens.
    """
    rows = rewards.shape[0]
    if rows % group_size:
        raise ValueError(f"grpo step: {rows} rows are not whole groups of group_size={group_size}")
    row_rewards = jnp.sum(rewards.astype(jnp.float32), axis=1).reshape(rows // group_size,
                                                                        group_size)
    row_adv = adv_lib.grpo_advantages(row_rewards, eps=std_eps).reshape(rows)
    return jnp.where(actor_mask, row_adv[:, None], 0.0)


def grpo_update(state: TrainState, batch: Batch, *, actor_logprobs: ActorFn,
                actor_optimizer: optax.GradientTransformation, group_size: int,
                eps_low: float = losses.EPS_LOW, eps_high: float = losses.EPS_HIGH,
                std_eps: float = 1e-6, num_micro_batches: int = 1) -> tuple[TrainState, dict]:
    """One ReTerm-GRPO update of the actor over original and recovery groups.

    Rows come in consecutive groups of `group_size` rollouts of one task; `is_recovery [B]` marks
    recovery groups. `J = M_O/(M_O+M_R) Σ_g J^O_g + M_R/(M_O+M_R) Σ_g J^R_g`, each `J_g` the
    clipped surrogate of a group as a token mean (`losses.reterm_token_weights`). Advantages are
    taken from `batch['advantages']` when given, else from the rows' rewards
    (`grpo_advantages_for_rows`).
    """
    _check_batch("grpo", batch)
    rows = batch["tokens"].shape[0]
    if "advantages" in batch:
        advantages = batch["advantages"]
    else:
        advantages = grpo_advantages_for_rows(batch["rewards"], batch["actor_mask"], group_size,
                                              std_eps)
    group_ids = jnp.arange(rows, dtype=jnp.int32) // group_size
    weights = losses.reterm_token_weights(group_ids, batch["is_recovery"], batch["loss_mask"],
                                          num_groups=-(-rows // group_size))
    full = {**batch, "_advantages": advantages, "_weights": weights}

    def grad_fn(mb):
        def numerator(params):
            terms = losses.ppo_policy_loss_terms(
                actor_logprobs(params, mb), mb["logprobs"], mb["_advantages"], mb["loss_mask"],
                eps_low=eps_low, eps_high=eps_high, token_weights=mb["_weights"])
            return terms.numerator, terms
        return jax.grad(numerator, has_aux=True)(state.actor_params)

    grads, terms = _accumulate(grad_fn, full, num_micro_batches)
    grads = _scale(grads, terms.denominator)
    params, opt_state = _apply(actor_optimizer, grads, state.actor_opt_state, state.actor_params)
    metrics = {**_prefixed("actor", terms.metrics), "actor/loss": terms.loss,
               "actor/grad_norm": optax.tree.norm(grads),
               "grpo/recovery_rows": jnp.sum(batch["is_recovery"]).astype(jnp.float32)}
    return state.replace(step=state.step + 1, actor_params=params, actor_opt_state=opt_state), metrics


# ------------------------------------------------------------------------------------------------
# Compiled steps
# ------------------------------------------------------------------------------------------------


class UpdateSteps(NamedTuple):
    """The four compiled steps, each `(state, batch) -> (state, metrics)`; None if not buildable."""

    sft: StepFn | None
    critic: StepFn | None
    ppo: StepFn | None
    grpo: StepFn | None


def build_steps(config: ml_collections.ConfigDict, *, actor_logprobs: ActorFn | None = None,
                critic_values: CriticFn | None = None, mesh: Mesh | None = None,
                state_sharding: TrainState | None = None, donate: bool = False) -> UpdateSteps:
    """`jax.jit`-compiled update steps from `config` (see `default_config`).

    With a `mesh`, the state is laid out as `state_sharding` (a TrainState of shardings, e.g.
    `train_state_shardings`) on input and output, the batch keeps the sharding it was placed with
    (`shard_batch`), and the model's activation constraints see the mesh. `donate=True` lets XLA
    reuse the input state's buffers (the caller must not read the old state afterwards).
    """
    n = int(config.num_micro_batches)
    if n < 1:
        raise ValueError(f"config.num_micro_batches must be >= 1, got {n}")
    actor_opt = make_optimizer(config.actor.optimizer)
    critic_opt = make_optimizer(config.critic.optimizer)
    ppo = config.ppo

    def compile_step(fn):
        shardings = {}
        if state_sharding is not None:
            shardings = {"in_shardings": (state_sharding, None),
                         "out_shardings": (state_sharding, None)}
        jitted = jax.jit(fn, donate_argnums=(0,) if donate else (), **shardings)
        if mesh is None:
            return jitted

        @functools.wraps(fn)
        def on_mesh(state, batch):
            with jax.set_mesh(mesh):
                return jitted(state, batch)
        return on_mesh

    sft = critic = ppo_step = grpo = None
    if actor_logprobs is not None:
        sft = compile_step(functools.partial(
            sft_update, actor_logprobs=actor_logprobs, actor_optimizer=actor_opt,
            num_micro_batches=n))
        grpo = compile_step(functools.partial(
            grpo_update, actor_logprobs=actor_logprobs, actor_optimizer=actor_opt,
            group_size=int(config.grpo.group_size), eps_low=config.grpo.eps_low,
            eps_high=config.grpo.eps_high, std_eps=config.grpo.std_eps, num_micro_batches=n))
    if critic_values is not None:
        critic = compile_step(functools.partial(
            critic_update, critic_values=critic_values, critic_optimizer=critic_opt,
            gamma_turn=ppo.gamma_turn, lam_turn=ppo.lam_turn, eps_value=ppo.eps_value,
            num_micro_batches=n))
    if actor_logprobs is not None and critic_values is not None:
        ppo_step = compile_step(functools.partial(
            ppo_update, actor_logprobs=actor_logprobs, critic_values=critic_values,
            actor_optimizer=actor_opt, critic_optimizer=critic_opt, eps_low=ppo.eps_low,
            eps_high=ppo.eps_high, eps_value=ppo.eps_value, kl_coef=ppo.kl_coef,
            entropy_coef=ppo.entropy_coef, gamma_turn=ppo.gamma_turn, lam_turn=ppo.lam_turn,
            num_micro_batches=n))
    return UpdateSteps(sft=sft, critic=critic, ppo=ppo_step, grpo=grpo)


# ------------------------------------------------------------------------------------------------
# Models and shardings
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelFns:
    """Pure functions of parameter pytrees for the steps, and the models' initial parameters."""

    actor_logprobs: ActorFn | None
    critic_values: CriticFn | None
    actor_params: PyTree
    critic_params: PyTree


def nnx_model_fns(actor=None, critic=None, *, chunk_size: int = 1024) -> ModelFns:
    """`ModelFns` for a `tr.models` `Decoder` actor and `CriticModel` critic (NNX modules).

    The parameters become pure dicts (`nnx.to_pure_dict`); the graph definitions and any non-
    parameter state are closed over. Log-probs use `tr.models.decoder.token_logprobs` in chunks of
    `chunk_size` positions.
    """
    from flax import nnx  # pylint: disable=g-import-not-at-top
    from tr.models.decoder import token_logprobs  # pylint: disable=g-import-not-at-top

    def split(model):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        return graphdef, nnx.to_pure_dict(params), rest

    actor_fn = critic_fn = actor_params = critic_params = None
    if actor is not None:
        actor_graph, actor_params, actor_rest = split(actor)

        def actor_fn(params, batch):
            model = nnx.merge(actor_graph, params, actor_rest)
            logp, _ = token_logprobs(model, batch["tokens"], batch.get("positions"),
                                     batch.get("segment_ids"), chunk_size=chunk_size)
            return logp
    if critic is not None:
        critic_graph, critic_params, critic_rest = split(critic)

        def critic_fn(params, batch):
            model = nnx.merge(critic_graph, params, critic_rest)
            return model(batch["tokens"], batch.get("positions"), batch.get("segment_ids"))
    return ModelFns(actor_fn, critic_fn, actor_params, critic_params)


def nnx_param_shardings(model, mesh: Mesh) -> PyTree:
    """Pure-dict tree of `NamedSharding`s for the `nnx.Param`s of `model` (logical-axis rules)."""
    from flax import nnx  # pylint: disable=g-import-not-at-top
    from tr.models import sharding as sharding_lib  # pylint: disable=g-import-not-at-top

    shardings = sharding_lib.state_shardings(nnx.state(model, nnx.Param), mesh)
    return nnx.to_pure_dict(shardings)


def _opt_state_shardings(opt_state: PyTree, params: PyTree, param_shardings: PyTree,
                         replicated: NamedSharding) -> PyTree:
    """Shardings for an optax state: a leaf whose key path ends with a parameter's key path and
    has that parameter's shape (Adam's `mu`, `nu`, ...) is sharded like it; others replicated."""
    by_path = {}
    for (path, p), s in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                            jax.tree.leaves(param_shardings)):
        by_path[jax.tree_util.keystr(path)] = (jnp.shape(p), s)

    def pick(path, leaf):
        key = jax.tree_util.keystr(path)
        best = None
        for suffix, (shape, sharding) in by_path.items():
            if key.endswith(suffix) and tuple(jnp.shape(leaf)) == tuple(shape):
                if best is None or len(suffix) > len(best[0]):
                    best = (suffix, sharding)
        return replicated if best is None else best[1]

    return jax.tree_util.tree_map_with_path(pick, opt_state)


def train_state_shardings(state: TrainState, mesh: Mesh, *, actor_param_shardings: PyTree = None,
                          critic_param_shardings: PyTree = None) -> TrainState:
    """A TrainState of `NamedSharding`s on `mesh`: parameters as given (default replicated),
    optimizer states like their parameters, step and RNG replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())

    def params_sharding(params, given):
        if params is None:
            return None
        return given if given is not None else jax.tree.map(lambda _: replicated, params)

    actor_sh = params_sharding(state.actor_params, actor_param_shardings)
    critic_sh = params_sharding(state.critic_params, critic_param_shardings)

    def opt_sharding(opt_state, params, param_sh):
        if opt_state is None:
            return None
        return _opt_state_shardings(opt_state, params, param_sh, replicated)

    return TrainState(
        step=replicated,
        actor_params=actor_sh,
        actor_opt_state=opt_sharding(state.actor_opt_state, state.actor_params, actor_sh),
        critic_params=critic_sh,
        critic_opt_state=opt_sharding(state.critic_opt_state, state.critic_params, critic_sh),
        rng=replicated,
    )


def shard_batch(batch: Batch, mesh: Mesh) -> Batch:
    """Places a batch on `mesh`: rows over the data-parallel axes (`tr.models.sharding` rules)."""
    from tr.models import sharding as sharding_lib  # pylint: disable=g-import-not-at-top

    return {k: jax.device_put(v, sharding_lib.batch_sharding(mesh, min(jnp.ndim(v), 2)))
            for k, v in batch.items()}
