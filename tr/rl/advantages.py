"""Advantage estimators: token GAE, turn-boundary GAE (TB-GAE), GRPO, explained variance (SPEC §3).

Layout: ``[B, L]`` arrays of one packed batch (SPEC §2). A *node* is a position the recursion runs
over (``node_mask`` for token GAE, ``actor_mask`` for TB-GAE). For a node ``j`` and the next node
``k`` (the first node to its right, possibly in the next partition, given by ``carry``):

    δ_j = r_j + Γ_j (1 − d_j) v_k − v_j
    A_j = δ_j + Γ_j Λ_j (1 − d_j) A_k

Token GAE uses ``(Γ_j, Λ_j) = (γ, λ)`` at every node. TB-GAE uses ``(1, 1)`` inside a turn
(``turn_ids[j] == turn_ids[k]``) and ``(γ_turn, λ_turn)`` across a turn boundary, so credit decays
per *decision* (turn), not per token. Positions that are not nodes (observation tokens, padding)
pass the recursion through unchanged and get zero advantage and return; they still matter through
the critic, whose pre-token value ``v_k`` sees the whole history. ``d_j`` (``dones``) is read at nodes
only: it is true on the last action token of an episode, so several episodes may be packed in a row.

The public form is the recursion itself: one reverse ``jax.lax.scan`` over the positions, the
batch as the vector dimension, whose state is the ``Carry`` of the next node ``(v_k, A_k, turn_k)``
(non-node positions pass it through unchanged); a sweep over partitions is bitwise equal to the
unsplit scan. Two faster forms sit behind ``method`` as private variants, kept equal to the scan
(up to float rounding: products associated differently) by the tests:

* ``"blocked"``: ``block = 4`` positions at a time; inside every block at once each node's
  advantage is ``α_i + β_i·A_last``, and a reverse scan over the ``L/4`` blocks yields each
  ``A_last``. A quarter of the sequential steps, which is what costs on CPU (``bench/bench_gae.py``).
* ``"associative"``: log depth, for long contexts on accelerators: one ``associative_scan`` finds
  each position's next node, a second composes the affine maps ``x ↦ δ_j + c_j x``.

Partitions: ``carry`` holds ``(value, advantage, turn_id)`` of the first node of the partition to
the right; the output carry holds the same for this partition's first node (or passes the input
carry through when the partition has no node). Sweeping partitions right to left reproduces the
unsplit result exactly. ``carry=None`` means nothing follows (``v = A = 0``).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

__all__ = [
    "Carry",
    "GaeOutput",
    "explained_variance",
    "check_one_rollout_per_row",
    "grpo_advantages",
    "grpo_row_advantages",
    "tb_gae",
    "tb_gae_across_windows",
    "token_gae",
]

Method = Literal["blocked", "scan", "associative"]
_BLOCK = 4  # measured best on CPU: larger blocks make XLA recompute the in-block chains


class Carry(NamedTuple):
    """Value, advantage and turn of the first node of a partition, for the partition to its left.

    ``turn_id`` is ``-1`` where unknown (token GAE, or nothing follows).
    """

    value: Float[Array, " b"]
    advantage: Float[Array, " b"]
    turn_id: Int[Array, " b"]


class GaeOutput(NamedTuple):
    """Advantages and returns (``A + v``) at the nodes, zero elsewhere, and the carry-out."""

    advantages: Float[Array, "b l"]
    returns: Float[Array, "b l"]
    carry: Carry


def _check_inputs(name: str, rewards, values, node_mask, dones, turn_ids=None) -> None:
    """Raises ValueError naming the argument with a wrong rank, shape or dtype."""
    arrays = {"rewards": rewards, "values": values, "dones": dones}
    arrays[("actor_mask" if turn_ids is not None else "node_mask")] = node_mask
    if turn_ids is not None:
        arrays["turn_ids"] = turn_ids
    if jnp.ndim(rewards) != 2:
        raise ValueError(f"{name}: 'rewards' must be [B, L], got shape {jnp.shape(rewards)}")
    shape = jnp.shape(rewards)
    for key, value in arrays.items():
        if jnp.shape(value) != shape:
            raise ValueError(
                f"{name}: '{key}' has shape {jnp.shape(value)}, expected {shape} (that of 'rewards')"
            )
    for key in ("rewards", "values"):
        if not jnp.issubdtype(jnp.result_type(arrays[key]), jnp.floating):
            raise ValueError(
                f"{name}: '{key}' must be floating point (fractional rewards must not be truncated), "
                f"got dtype {jnp.result_type(arrays[key])}"
            )
    if turn_ids is not None and not jnp.issubdtype(jnp.result_type(turn_ids), jnp.integer):
        raise ValueError(f"{name}: 'turn_ids' must be integers, got {jnp.result_type(turn_ids)}")


def _empty_carry(batch: int) -> Carry:
    return Carry(
        value=jnp.zeros((batch,), jnp.float32),
        advantage=jnp.zeros((batch,), jnp.float32),
        turn_id=jnp.full((batch,), -1, jnp.int32),
    )


def _as_carry(carry: Carry | None, batch: int, name: str) -> Carry:
    if carry is None:
        return _empty_carry(batch)
    for field, value in zip(Carry._fields, carry):
        if jnp.shape(value) != (batch,):
            raise ValueError(f"{name}: 'carry.{field}' has shape {jnp.shape(value)}, expected ({batch},)")
    return Carry(
        value=jnp.asarray(carry.value, jnp.float32),
        advantage=jnp.asarray(carry.advantage, jnp.float32),
        turn_id=jnp.asarray(carry.turn_id, jnp.int32),
    )


def _node_coefficients(u, not_done, value_next, same_turn, gamma, lam):
    """``(δ, c)`` of a node given its next node, so that ``A = δ + c·A_next`` (``u = r − v``).

    ``δ = r − v + Γ(1−d) v_next`` and ``c = ΓΛ(1−d)``, with ``(Γ, Λ) = (1, 1)`` where ``same_turn``
    and ``(gamma, lam)`` elsewhere (everywhere when ``same_turn`` is None: token GAE).
    """
    if same_turn is not None:
        gamma = jnp.where(same_turn, 1.0, gamma)
        lam = jnp.where(same_turn, 1.0, lam)
    return u + gamma * not_done * value_next, gamma * lam * not_done


def _scan(node_mask, u, values, turn_ids, not_done, carry: Carry, gamma, lam):
    """One reverse ``lax.scan`` over positions, the batch as the vector: the recursion as written."""
    with_turns = turn_ids is not None

    def step(state: Carry, position):
        is_node, u_i, v_i, nd_i = position[:4]
        same_turn = position[4] == state.turn_id if with_turns else None
        delta, coef = _node_coefficients(u_i, nd_i, state.value, same_turn, gamma, lam)
        advantage = jnp.where(is_node, delta + coef * state.advantage, state.advantage)
        state = Carry(
            value=jnp.where(is_node, v_i, state.value),
            advantage=advantage,
            turn_id=jnp.where(is_node, position[4], state.turn_id) if with_turns else state.turn_id,
        )
        return state, advantage

    positions = (node_mask, u, values, not_done) + ((turn_ids,) if with_turns else ())
    carry_out, chain = jax.lax.scan(step, carry, tuple(a.T for a in positions), reverse=True)
    return chain.T, carry_out


def _blocked(node_mask, u, values, turn_ids, not_done, carry: Carry, gamma, lam, block=_BLOCK):
    """The same recursion, ``block`` positions at a time (about twice as fast as ``_scan`` on CPU).

    Positions are cut into blocks of ``block``. Inside every block at once (a short unrolled loop
    over the block that XLA fuses into passes over contiguous memory), each node's next node
    *within the block* is tracked and its advantage is written as ``A_i = α_i + β_i·A_last``, where
    ``A_last`` is the advantage of the block's last node, the only node whose next node lies
    outside the block. A reverse ``lax.scan`` over the ``L/block`` blocks then carries the
    ``Carry`` from block to block and computes each block's ``A_last``; finally all ``A_i`` at once.
    """
    rows, length = u.shape
    num_blocks = -(-length // block)
    pad = num_blocks * block - length
    with_turns = turn_ids is not None
    turns = turn_ids if with_turns else jnp.zeros(u.shape, jnp.int32)

    def to_blocks(a):
        return jnp.pad(a, ((0, 0), (0, pad))).reshape(rows, num_blocks, block)

    is_node, u_b, v_b, t_b, nd_b = map(to_blocks, (node_mask, u, values, turns, not_done))
    shape = (rows, num_blocks)
    zeros_f, zeros_i = jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.int32)
    found = jnp.zeros(shape, bool)  # a node lies right of the position inside the block
    value_next, turn_next = zeros_f, zeros_i  # that node's value and turn
    alpha, beta = zeros_f, jnp.ones(shape, jnp.float32)
    last = (zeros_f, zeros_f, zeros_i)  # (u, 1−d, turn) of the block's last node
    alphas, betas = [None] * block, [None] * block
    for k in range(block - 1, -1, -1):
        m_k, u_k, v_k, t_k, nd_k = (a[..., k] for a in (is_node, u_b, v_b, t_b, nd_b))
        same_turn = t_k == turn_next if with_turns else None
        delta, coef = _node_coefficients(u_k, nd_k, value_next, same_turn, gamma, lam)
        last = tuple(jnp.where(m_k & ~found, x, y) for x, y in zip((u_k, nd_k, t_k), last))
        alpha = jnp.where(m_k, jnp.where(found, delta + coef * alpha, 0.0), alpha)
        beta = jnp.where(m_k, jnp.where(found, coef * beta, 1.0), beta)
        found = found | m_k
        value_next = jnp.where(m_k, v_k, value_next)
        turn_next = jnp.where(m_k, t_k, turn_next)
        alphas[k], betas[k] = alpha, beta

    def across_blocks(state: Carry, summary):
        has_node, u_last, nd_last, t_last, first_value, first_turn, alpha_0, beta_0 = summary
        same_turn = t_last == state.turn_id if with_turns else None
        delta, coef = _node_coefficients(u_last, nd_last, state.value, same_turn, gamma, lam)
        advantage_last = delta + coef * state.advantage
        state = Carry(
            value=jnp.where(has_node, first_value, state.value),
            advantage=jnp.where(has_node, alpha_0 + beta_0 * advantage_last, state.advantage),
            turn_id=jnp.where(has_node, first_turn, state.turn_id) if with_turns else state.turn_id,
        )
        return state, advantage_last

    summaries = (found, *last, value_next, turn_next, alpha, beta)
    carry_out, advantage_last = jax.lax.scan(
        across_blocks, carry, tuple(a.T for a in summaries), reverse=True
    )
    chain = jnp.stack(alphas, -1) + jnp.stack(betas, -1) * advantage_last.T[:, :, None]
    return chain.reshape(rows, num_blocks * block)[:, :length], carry_out


def _associative(node_mask, u, values, turn_ids, not_done, carry: Carry, gamma, lam):
    """Log depth: an ``associative_scan`` finds each position's next node, then a second one
    composes the affine maps ``x ↦ δ_i + c_i x`` (the identity at non-nodes)."""
    with_turns = turn_ids is not None
    turns = turn_ids if with_turns else jnp.zeros_like(node_mask, jnp.int32)

    def first_node(right, left):
        (m_r, v_r, t_r), (m_l, v_l, t_l) = right, left
        return m_l | m_r, jnp.where(m_l, v_l, v_r), jnp.where(m_l, t_l, t_r)

    found, seen_value, seen_turn = jax.lax.associative_scan(
        first_node, (node_mask, values, turns), reverse=True, axis=1
    )
    seen_value = jnp.where(found, seen_value, carry.value[:, None])
    seen_turn = jnp.where(found, seen_turn, carry.turn_id[:, None])
    shift = lambda a, end: jnp.concatenate([a[:, 1:], end[:, None]], axis=1)  # noqa: E731
    same_turn = turns == shift(seen_turn, carry.turn_id) if with_turns else None
    delta, coef = _node_coefficients(
        u, not_done, shift(seen_value, carry.value), same_turn, gamma, lam
    )
    delta = jnp.where(node_mask, delta, 0.0)
    coef = jnp.where(node_mask, coef, 1.0)

    def affine(right, left):
        (c_r, d_r), (c_l, d_l) = right, left
        return c_l * c_r, d_l + c_l * d_r

    coef, delta = jax.lax.associative_scan(affine, (coef, delta), reverse=True, axis=1)
    chain = delta + coef * carry.advantage[:, None]
    turn_out = seen_turn[:, 0] if with_turns else carry.turn_id
    return chain, Carry(seen_value[:, 0], chain[:, 0], turn_out)


def _gae(rewards, values, node_mask, dones, turn_ids, carry: Carry, gamma, lam, method) -> GaeOutput:
    """Shared core of both estimators; ``turn_ids=None`` is token GAE (see the module docstring)."""
    rewards = jnp.asarray(rewards, jnp.float32)
    values = jnp.asarray(values, jnp.float32)
    node_mask = jnp.asarray(node_mask, bool)
    not_done = 1.0 - jnp.asarray(dones, bool).astype(jnp.float32)
    gamma = jnp.asarray(gamma, jnp.float32)
    lam = jnp.asarray(lam, jnp.float32)
    args = (node_mask, rewards - values, values, turn_ids, not_done, carry, gamma, lam)
    if method == "blocked":
        chain, carry_out = _blocked(*args)
    elif method == "scan":
        chain, carry_out = _scan(*args)
    elif method == "associative":
        chain, carry_out = _associative(*args)
    else:
        raise ValueError(f"method must be 'blocked', 'scan' or 'associative', got {method!r}")
    advantages = jnp.where(node_mask, chain, 0.0)
    returns = jnp.where(node_mask, chain + values, 0.0)
    return GaeOutput(advantages, returns, carry_out)


def tb_gae(
    rewards: Float[Array, "b l"],
    values: Float[Array, "b l"],
    actor_mask: Bool[Array, "b l"],
    turn_ids: Int[Array, "b l"],
    dones: Bool[Array, "b l"],
    *,
    gamma_turn: float | Float[Array, ""],
    lam_turn: float | Float[Array, ""],
    carry: Carry | None = None,
    method: Method = "scan",
) -> GaeOutput:
    """Turn-boundary GAE over the action tokens (``actor_mask``).

    For action token ``j`` and the next action token ``k``:
    ``(Γ_j, Λ_j) = (1, 1)`` if ``turn_ids[j] == turn_ids[k]`` else ``(γ_turn, λ_turn)``;
    ``δ_j = r_j + Γ_j(1−d_j) v_k − v_j``, ``A_j = δ_j + Γ_jΛ_j(1−d_j) A_k``, returns ``A_j + v_j``.

    Credit crossing ``B`` turn boundaries decays by exactly ``(γ_turn λ_turn)^B`` whatever the
    number of observation tokens and of action tokens per turn. Observation tokens pass the carry.
    ``carry``: ``Carry`` of the next partition's first action token (``None``: nothing follows).
    ``method``: ``"scan"`` (the recursion as written), or the equal private variants ``"blocked"``
    (faster on CPU) and ``"associative"`` (log depth).
    """
    _check_inputs("tb_gae", rewards, values, actor_mask, dones, turn_ids)
    batch = jnp.shape(rewards)[0]
    carry = _as_carry(carry, batch, "tb_gae")
    turn_ids = jnp.asarray(turn_ids, jnp.int32)
    return _gae(rewards, values, actor_mask, dones, turn_ids, carry, gamma_turn, lam_turn, method)


def token_gae(
    rewards: Float[Array, "b l"],
    values: Float[Array, "b l"],
    node_mask: Bool[Array, "b l"],
    dones: Bool[Array, "b l"],
    *,
    gamma: float | Float[Array, ""],
    lam: float | Float[Array, ""],
    carry: Carry | None = None,
    method: Method = "scan",
) -> GaeOutput:
    """Token-level GAE along the chain of nodes ``node_mask`` (the baseline).

    For consecutive nodes ``j < k``: ``δ_j = r_j + γ(1−d_j) v_k − v_j``,
    ``A_j = δ_j + γλ(1−d_j) A_k``, returns ``A_j + v_j``. Pass all non-pad positions for standard
    GAE along the interleaved chain, or ``actor_mask`` for GAE over action tokens only.
    ``carry.turn_id`` is ignored; the output carry has ``turn_id = -1``.
    """
    _check_inputs("token_gae", rewards, values, node_mask, dones)
    batch = jnp.shape(rewards)[0]
    carry = _as_carry(carry, batch, "token_gae")._replace(turn_id=jnp.full((batch,), -1, jnp.int32))
    return _gae(rewards, values, node_mask, dones, None, carry, gamma, lam, method)


def grpo_advantages(rewards: Float[Array, "g n"], eps: float = 1e-6) -> Float[Array, "g n"]:
    """Group-normalised advantages ``Â_i = (R_i − mean(R)) / (std(R) + eps)`` per group (row).

    ``std`` is the population standard deviation (ddof 0). Broadcast the result to every action
    token of rollout ``i`` (``adv[:, None] * actor_mask``).
    """
    chex.assert_rank(rewards, 2)
    if not jnp.issubdtype(jnp.result_type(rewards), jnp.floating):
        raise ValueError(f"grpo_advantages: 'rewards' must be floating point, got {jnp.result_type(rewards)}")
    rewards = jnp.asarray(rewards, jnp.float32)
    mean = jnp.mean(rewards, axis=1, keepdims=True)
    std = jnp.std(rewards, axis=1, keepdims=True)
    return (rewards - mean) / (std + eps)


def grpo_row_advantages(
    rewards: Float[Array, "b l"],
    actor_mask: Bool[Array, "b l"],
    *,
    group_size: int,
    std_eps: float = 1e-6,
) -> Float[Array, "b l"]:
    """GRPO advantages of rows laid out in consecutive groups of ``group_size`` rollouts.

    One rollout per row (``check_one_rollout_per_row``): row reward ``R_r = Σ_l rewards[r, l]``,
    ``Â = (R − mean_g R)/(std_g R + δ)`` per group (``grpo_advantages``), broadcast to the row's
    action tokens.
    """
    chex.assert_rank([rewards, actor_mask], 2)
    rows = rewards.shape[0]
    if group_size < 1 or rows % group_size:
        raise ValueError(f"grpo_row_advantages: {rows} rows are not whole groups of "
                         f"group_size={group_size}")
    row_rewards = jnp.sum(jnp.asarray(rewards, jnp.float32), axis=1)
    row_adv = grpo_advantages(row_rewards.reshape(rows // group_size, group_size),
                              eps=std_eps).reshape(rows)
    return jnp.where(actor_mask, row_adv[:, None], 0.0)


def check_one_rollout_per_row(batch, *, where: str = "grpo") -> None:
    """Raises ValueError unless every row of ``batch`` holds exactly one whole rollout.

    GRPO's advantage is a function of a rollout's total reward, so a row must be one rollout: not
    several packed together (``segment_ids`` with a value above 1) and not one context window of an
    episode split by summarisation (``window_ids`` above 0 or ``next_window_row`` ≥ 0). Host-side
    (reads concrete values); call it before the compiled step.
    """
    import numpy as np  # pylint: disable=g-import-not-at-top

    if "segment_ids" in batch:
        segments = np.asarray(batch["segment_ids"])
        packed = np.flatnonzero((segments > 1).any(axis=-1))
        if packed.size:
            raise ValueError(f"{where}: rows {packed[:8].tolist()} hold several packed rollouts "
                             "(segment_ids > 1); GRPO needs one rollout per row (pack=False)")
    for key in ("window_ids", "next_window_row"):
        if key in batch:
            ids = np.asarray(batch[key])
            split = np.flatnonzero(ids > 0 if key == "window_ids" else ids >= 0)
            if split.size:
                raise ValueError(f"{where}: rows {split[:8].tolist()} are windows of episodes split "
                                 f"by summarisation ({key}); GRPO needs one whole rollout per row")


def tb_gae_across_windows(
    rewards: Float[Array, "b l"],
    values: Float[Array, "b l"],
    actor_mask: Bool[Array, "b l"],
    turn_ids: Int[Array, "b l"],
    dones: Bool[Array, "b l"],
    window_ids: Int[Array, " b"],
    next_window_row: Int[Array, " b"],
    *,
    num_windows: int,
    gamma_turn: float | Float[Array, ""],
    lam_turn: float | Float[Array, ""],
    method: Method = "scan",
) -> GaeOutput:
    """TB-GAE of episodes split into context windows, one window per row (SPEC §6 "Summary windows").

    Row ``r`` is window ``window_ids[r]`` of its episode; ``next_window_row[r]`` is the row of the
    episode's next window (−1: the last window). Windows are processed last to first
    (``num_windows`` passes, static): pass ``w`` runs ``tb_gae`` on every row with the carry-out
    of its next window's row from pass ``w + 1``, and keeps the rows whose window is ``w``. So when
    only the last window holds the episode's reward and done, the advantages equal the unsplit
    computation over the concatenated windows. Returns the carry of each row's first node.
    """
    chex.assert_rank([window_ids, next_window_row], 1)
    batch = jnp.shape(rewards)[0]
    window_ids = jnp.asarray(window_ids, jnp.int32)
    next_window_row = jnp.asarray(next_window_row, jnp.int32)
    empty = _empty_carry(batch)
    carry_out = empty
    advantages = jnp.zeros(jnp.shape(rewards), jnp.float32)
    returns = jnp.zeros(jnp.shape(rewards), jnp.float32)
    for w in reversed(range(num_windows)):
        has_next = next_window_row >= 0
        nxt = jnp.maximum(next_window_row, 0)
        carry_in = Carry(*(jnp.where(has_next, c[nxt], e) for c, e in zip(carry_out, empty)))
        out = tb_gae(rewards, values, actor_mask, turn_ids, dones, gamma_turn=gamma_turn,
                     lam_turn=lam_turn, carry=carry_in, method=method)
        here = window_ids == w
        advantages = jnp.where(here[:, None], out.advantages, advantages)
        returns = jnp.where(here[:, None], out.returns, returns)
        carry_out = Carry(*(jnp.where(here, new, old) for new, old in zip(out.carry, carry_out)))
    return GaeOutput(advantages, returns, carry_out)


def explained_variance(
    returns: Float[Array, "..."], values: Float[Array, "..."], mask: Bool[Array, "..."]
) -> Float[Array, ""]:
    """``EV = 1 − Var(G − V) / Var(G)`` over the masked positions (population variances).

    1 is a perfect critic, 0 a constant baseline, negative worse than a constant. NaN when fewer
    than one masked position or ``Var(G) = 0`` up to float32 rounding: ``Var(G) ≤ (16 ε)² ·
    (mean G² + mean V²)``, so equal returns rebuilt as ``A + V`` (TB-GAE with λ = 1 on a batch
    without a success) give NaN rather than a huge negative EV from their rounding noise.
    """
    chex.assert_equal_shape([returns, values, mask])
    mask = jnp.asarray(mask, bool)
    count = jnp.sum(mask).astype(jnp.float32)

    def masked_var(x):
        x = jnp.asarray(x, jnp.float32)
        mean = jnp.sum(jnp.where(mask, x, 0.0)) / count
        return jnp.sum(jnp.where(mask, jnp.square(x - mean), 0.0)) / count

    def masked_mean_square(x):
        return jnp.sum(jnp.where(mask, jnp.square(jnp.asarray(x, jnp.float32)), 0.0)) / count

    var_returns = masked_var(returns)
    # Var(G) = 0 (every return equal, e.g. a batch with no success): EV is undefined, not -inf;
    # "equal" up to the rounding of G = A + V, whose noise scales with |G| and |V|.
    noise = (16 * jnp.finfo(jnp.float32).eps) ** 2 * (masked_mean_square(returns)
                                                      + masked_mean_square(values))
    return jnp.where(var_returns > noise, 1.0 - masked_var(returns - values) / var_returns,
                     jnp.nan)
