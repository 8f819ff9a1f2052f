"""Compile time of the training step's model part (gradient of the summed token log-probs) for
28- and 64-layer decoders: layers as a `lax.scan` over stacked parameters against the unrolled loop.

  .venv/bin/python bench/bench_compile.py [--layers 28 64] [--repeats 3]

Prints, per depth and form, the median wall and CPU seconds of `jit(...).lower(...)` (tracing) and
`.compile()` (XLA), and the unrolled/scan ratio. Parameters are abstract (`nnx.eval_shape`): nothing is
allocated, so depth costs compile time only. Widths are small (d_model 256): compile time depends on
the number of operations, which the layer count multiplies in the unrolled form. Run against an older
checkout (PYTHONPATH=that checkout) it measures the per-layer Python loop the decoder used before
(that code has no `scan_layers` field; the form is reported as `loop (checkout)`).
"""

import argparse
import dataclasses
import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.environ.get("PYTHONPATH") or str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from tr.models.config import ModelConfig, get_model_config  # noqa: E402
from tr.models.decoder import Decoder, token_logprobs  # noqa: E402


def measure(config: ModelConfig, repeats: int) -> dict[str, float]:
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(abstract)
    tokens = jax.ShapeDtypeStruct((2, 256), jnp.int32)

    def loss(p, t):
        logp, _ = token_logprobs(nnx.merge(graphdef, p), t, chunk_size=128)
        return logp.sum()

    rows = {"trace_wall": [], "trace_cpu": [], "compile_wall": [], "compile_cpu": []}
    for _ in range(repeats):
        jax.clear_caches()
        w0, c0 = time.perf_counter(), time.process_time()
        lowered = jax.jit(jax.grad(loss)).lower(params, tokens)
        w1, c1 = time.perf_counter(), time.process_time()
        lowered.compile()
        w2, c2 = time.perf_counter(), time.process_time()
        rows["trace_wall"].append(w1 - w0)
        rows["trace_cpu"].append(c1 - c0)
        rows["compile_wall"].append(w2 - w1)
        rows["compile_cpu"].append(c2 - c1)
    return {k: statistics.median(v) for k, v in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[28, 64])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    has_scan = "scan_layers" in {f.name for f in dataclasses.fields(ModelConfig)}
    forms = {"scan": {"scan_layers": True}, "loop": {"scan_layers": False}} if has_scan else {"loop (checkout)": {}}
    print(f"load: {os.getloadavg()[0]:.1f} (1-min average); medians of {args.repeats}; seconds")
    print(f"{'layers':>6} {'form':<16}{'trace wall':>11}{'trace cpu':>10}{'compile wall':>13}{'compile cpu':>12}")
    for n in args.layers:
        results = {}
        for form, fields in forms.items():
            config = get_model_config("tiny", n_layers=n, **fields)
            r = results[form] = measure(config, args.repeats)
            print(f"{n:>6} {form:<16}{r['trace_wall']:>11.2f}{r['trace_cpu']:>10.2f}{r['compile_wall']:>13.2f}"
                  f"{r['compile_cpu']:>12.2f}", flush=True)
        if has_scan:
            ratio = ((results["loop"]["trace_cpu"] + results["loop"]["compile_cpu"])
                     / (results["scan"]["trace_cpu"] + results["scan"]["compile_cpu"]))
            print(f"{n:>6} loop/scan CPU time (trace + compile): {ratio:.1f}x")


if __name__ == "__main__":
    main()
