"""Exact micro-batching: split a batch's rows, map forward passes, accumulate gradients.

A batch of `B` rows is split into `n` micro-batches (row `r` goes to micro-batch `r mod n`, so each
stays spread over the data-parallel devices). Every loss is a sum `Σ_i c_i ℓ_i` whose coefficients
are fixed on the *whole* batch first, so `Σ_mb ∇ numerator_mb / Σ_mb denominator_mb` equals the
full-batch gradient up to float rounding.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

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


def map_micro_batches(fn: Callable[[Batch], jax.Array], batch: Batch, n: int) -> jax.Array:
    """`fn` over the rows of `batch`, `n` micro-batches at a time (forward passes, no gradient)."""
    if n == 1:
        return fn(batch)
    return merge_micro_batches(jax.lax.map(fn, split_micro_batches(batch, n)))


def accumulate(grad_fn: Callable[[Batch], tuple[PyTree, PyTree]], batch: Batch, n: int):
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
