"""Pod scale, checked ahead of time: compile every step of a recipe's paper setting for a TPU slice.

  python -m tr.train.aot --config=experiments/pod_scale.py:rsi_paper --topology=v5p-128
  python experiments/main.py --config=experiments/pod_scale.py --workdir=/tmp/aot   # the `aot` job

The `aot` job (tr/train/aot.py) prints per-chip argument / output / temporary bytes of each step
against the chip's HBM. The fields it reads are the ones a recipe config provides (LAYOUT.md):
`model`, `pod` (mesh, axis rules, remat), `train` (tr.train.updates.default_config()), `shapes`.

Variants:
  small         the tiny model, every step, on this host's CPU devices (seconds; the tests' setting)
  rsi_paper     Terminal-RSI at paper scale: the 27B actor and critic, global batch 256 rows of
                32,768 tokens (the summarisation threshold), 4-way context parallelism, log-probs in
                chunks of 1,024; PPO, critic-only and RSR's SFT updates; the JAX sampler decoding
                16 rows of an 8,192-token turn after a 24,576-token prompt. v5p-128 / v5p-256.
  reterm_paper  ReTerm at paper scale: a 9B-class dense Qwen3 (qwen3-8b dimensions; Qwen3.5-9B is a
                hybrid architecture this decoder does not implement), 65,536-token context, GRPO
                over 160 rows (10 groups of 16) and SFT over 16 rows; the sampler decoding 8,192
                tokens. v5e-64.

Measured (tr.train.aot on this CPU host with libtpu 0.0.42.1; GiB per chip, total = argument +
output - alias + temp; sft and critic of rsi_paper hold the same state as ppo and compute a subset
of it, so ppo bounds them):

  rsi_paper     v5p-128  ppo 52.6 (arg 18.4, temp 22.0); sampler prefill 17.7, decode 19.3  of 95
  rsi_paper     v5p-256  ppo 35.0 (arg 9.2, temp 19.6)                                     of 95
  reterm_paper  v5e-64   grpo 15.7 (arg 2.9, temp 10.9); sft 15.7; prefill 11.0, decode 10.0 of 16

To fit, the first setting (fsdp x context 4, tensor 1, whole-sequence attention, 8 / 10
micro-batches) needed 162 GiB of temporaries per v5p chip and 204 GiB per v5e chip: heads, MLP and
vocabulary went over tensor = 8, attention over blocks of 1,024 queries (`attention_chunk`), and
the micro-batches shrank to 4 rows (rsi) / 2 rows (reterm); remat stayed 'full'.
"""

import ml_collections

from tr.train import pod
from tr.train.updates import default_config as train_defaults

VARIANTS = ("small", "rsi_paper", "reterm_paper")

# The pod form's local smoke run (tests/test_launchers.py): the small variant on this host's CPU.
SMOKE_FLAGS = ()


def _shape(rows, length, micro_batches):
    return {"rows": rows, "length": length, "micro_batches": micro_batches}


def get_config(variant: str = "small"):
    if variant not in VARIANTS:
        raise ValueError(f"experiments/pod_scale.py: unknown variant {variant!r}; choose one of {VARIANTS}")
    config = ml_collections.ConfigDict()
    config.job = "aot"
    config.aot = {"topology": "cpu"}
    config.train = train_defaults()
    if variant == "small":
        config.model = "tiny"
        config.pod = pod.pod_config()
        config.train.logprob_chunk_size = 64
        config.shapes = {"sft": _shape(8, 128, 2), "critic": _shape(8, 128, 2), "ppo": _shape(8, 128, 2),
                         "grpo": _shape(32, 128, 2),
                         "sampler": {"rows": 8, "prompt_len": 64, "new_tokens": 32}}
        config.train.grpo.group_size = 16
    elif variant == "rsi_paper":
        config.model = "qwen3-27b"
        config.aot.topology = "v5p-128"
        # Heads and MLP over tensor = 8, tokens over context = 4, the rest fsdp (2 on v5p-128, 4
        # on v5p-256); whole blocks recomputed; attention 1,024 queries at a time.
        config.pod = pod.pod_config(data=1, fsdp=-1, tensor=8, context=4, remat="full", attention_chunk=1024)
        config.train.logprob_chunk_size = 1024
        # 64 micro-batches of 4 rows: 8,192 tokens per chip on v5p-256, 16,384 on v5p-128.
        config.shapes = {"ppo": _shape(256, 32768, 64), "critic": _shape(256, 32768, 64),
                         "sft": _shape(256, 32768, 64),
                         "sampler": {"rows": 16, "prompt_len": 24576, "new_tokens": 8192}}
    else:
        config.model = "qwen3-8b"
        config.aot.topology = "v5e-64"
        config.pod = pod.pod_config(data=1, fsdp=-1, tensor=8, context=4, remat="full", attention_chunk=1024)
        config.train.logprob_chunk_size = 1024
        config.train.grpo.group_size = 16
        # 80 micro-batches of 2 rows (one per fsdp shard): 16,384 tokens per chip.
        config.shapes = {"grpo": _shape(160, 65536, 80), "sft": _shape(16, 65536, 8),
                         "sampler": {"rows": 8, "prompt_len": 57344, "new_tokens": 8192}}
    return config
