"""Exact micro-batching: split a batch's rows, map forward passes, accumulate gradients.

A batch of `B` rows is split into `n` micro-batches (row `r` goes to micro-batch `r mod n`, so each
stays spread over the data-parallel devices). Every loss is a sum `Σ_i c_i ℓ_i` whose coefficients
are fixed on the *whole* batch first, so `Σ_mb ∇ numerator_mb / Σ_mb denominator_mb` equals the
full-batch gradient up to float rounding.

A micro-batch with no data (no `loss_mask` / `actor_mask` token; for forward maps no token either)
adds exactly zero, so it is skipped (`lax.cond`: its branch does not run). With `bucket_layout` a
batch of any size up to `rows` fills the first micro-batches of one `[rows, ...]` buffer: every
batch and mini-batch size runs the same compiled step, at the cost of the data's rows only.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
Batch = dict[str, jax.Array]


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


MASKS = ("loss_mask", "actor_mask")


def has_data(mb: Batch, *, tokens: bool = False) -> jax.Array:
    """Whether a (micro-)batch holds a masked token (`MASKS`; with `tokens`, any non-zero token):
    one without adds exactly zero to every loss sum, gradient and masked forward output."""
    present = [jnp.any(mb[k]) for k in MASKS if k in mb]
    if tokens and "tokens" in mb:
        present.append(jnp.any(mb["tokens"] != 0))
    if not present:
        return jnp.asarray(True)
    return jnp.any(jnp.stack(present))


def micro_batch_count(rows: int, *, micro_batch_rows: int = 0, num_micro_batches: int = 1) -> int:
    """Micro-batches of a `rows`-row batch: `rows / micro_batch_rows` when that is set (> 0: the
    same micro-batch shape whatever the batch size), else `num_micro_batches`."""
    if micro_batch_rows <= 0:
        return num_micro_batches
    if rows % micro_batch_rows:
        raise ValueError(f"a batch of {rows} rows cannot be cut into micro-batches of "
                         f"train.micro_batch_rows={micro_batch_rows} rows")
    return rows // micro_batch_rows


def _zeros_like_output(fn, example):
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn, example))


def map_micro_batches(fn: Callable[[Batch], jax.Array], batch: Batch, n: int) -> jax.Array:
    """`fn` over the rows of `batch`, `n` micro-batches at a time (forward passes, no gradient);
    a micro-batch without tokens (`has_data(tokens=True)`) gives zeros without running `fn`."""
    if n == 1:
        return fn(batch)
    micro = split_micro_batches(batch, n)
    zeros = _zeros_like_output(fn, jax.tree.map(lambda x: x[0], micro))

    def one(mb):
        return jax.lax.cond(has_data(mb, tokens=True), fn, lambda _: zeros, mb)
    return merge_micro_batches(jax.lax.map(one, micro))


def accumulate(grad_fn: Callable[[Batch], tuple[PyTree, PyTree]], batch: Batch, n: int):
    """`Σ_mb grad_fn(mb)` over `n` micro-batches with `lax.scan` (a tree of grads and LossTerms);
    micro-batches without data (`has_data`) are skipped: they add exactly zero."""
    if n == 1:
        return grad_fn(batch)
    micro = split_micro_batches(batch, n)
    zeros = _zeros_like_output(grad_fn, jax.tree.map(lambda x: x[0], micro))

    def body(total, mb):
        out = jax.lax.cond(has_data(mb), grad_fn, lambda _: zeros, mb)
        return jax.tree.map(jnp.add, total, out), None

    total, _ = jax.lax.scan(body, zeros, micro)
    return total


def bucket_layout(batch: Batch, data_rows, *, rows: int, micro_batch_rows: int,
                  links: bool = True) -> Batch:
    """Rows `data_rows` of `batch` (in that order) in a `[rows, ...]` buffer laid out for
    `split_micro_batches(·, rows / m)`: data row `t` goes to micro-batch `t // m`, slot `t mod m`
    (buffer row `(t mod m)·n + t // m`), so the data fill the first `⌈D/m⌉` micro-batches and the
    rest are all-zero rows, which `accumulate` and `map_micro_batches` skip. `next_window_row`
    links are renumbered to the new rows (`links=False`: cut, all −1, for a mini-batch of a batch
    whose targets are computed already)."""
    m = int(micro_batch_rows)
    data_rows = np.asarray(data_rows, np.int64).reshape(-1)
    if m < 1 or rows % m:
        raise ValueError(f"bucket_layout: {rows} rows cannot be cut into micro-batches of "
                         f"train.micro_batch_rows={m} rows")
    if len(data_rows) > rows:
        raise ValueError(f"bucket_layout: {len(data_rows)} data rows do not fit {rows} rows "
                         "(arrays.rows)")
    n = rows // m
    t = np.arange(len(data_rows))
    position = (t % m) * n + t // m
    source = np.full(rows, -1, np.int64)
    source[position] = data_rows
    valid = source >= 0
    index = jnp.asarray(np.maximum(source, 0))
    out = {}
    for key, value in batch.items():
        taken = jnp.take(jnp.asarray(value), index, axis=0)
        keep = jnp.asarray(valid.reshape((rows,) + (1,) * (taken.ndim - 1)))
        out[key] = jnp.where(keep, taken, jnp.zeros((), taken.dtype))
    if "next_window_row" in batch and not links:
        out["next_window_row"] = jnp.full((rows,), -1, jnp.int32)
    elif "next_window_row" in batch:
        old = np.asarray(jax.device_get(batch["next_window_row"]))[data_rows]
        new_of_old = dict(zip(data_rows.tolist(), position.tolist()))
        missing = sorted({int(r) for r in old if r >= 0 and int(r) not in new_of_old})
        if missing:
            raise ValueError(f"bucket_layout: rows {missing} are linked by next_window_row but "
                             "not among the data rows")
        linked = np.full(rows, -1, np.int32)
        linked[position] = [new_of_old[int(r)] if r >= 0 else -1 for r in old]
        out["next_window_row"] = jnp.asarray(linked)
    return out


def data_rows(batch: Batch, *, tokens: bool = True) -> np.ndarray:
    """Indices of the rows holding data: a masked token, or (`tokens`) any non-zero token."""
    host = {k: np.asarray(jax.device_get(v)) for k, v in batch.items()
            if k in MASKS or (tokens and k == "tokens")}
    rows = next(iter(host.values())).shape[0]
    keep = np.zeros(rows, bool)
    for key, value in host.items():
        keep |= (value != 0).reshape(rows, -1).any(axis=1)
    return np.flatnonzero(keep)
