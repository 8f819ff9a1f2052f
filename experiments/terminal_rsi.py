"""Terminal-RSI end to end (issue 14): Base -> RSR-1 -> RPR-1 -> RSR-2 -> RPR-2 on the gym, then a
`test` evaluation of every stage's retained actor and the report.

  bash launch/run.sh                                   # this file, variant `default`
  python experiments/main.py --config=experiments/terminal_rsi.py:quick --workdir=/tmp/rsi

Stage schedule (`config.stages`, run by the `pipeline` machinery in one run directory):

    base     kind `base` (Base SFT on teacher demos, val-selected)
    rsr1     kind `rsr`, actor from base
    warmup   kind `warmup`, actor rsr1 frozen, fresh critic
    rpr1     kind `rpr`, actor rsr1, critic from warmup, reward FDR
    rsr2     kind `rsr`, actor from rpr1
    rpr2     kind `rpr`, actor rsr2, critic inherited from rpr1, reward SPR, actor lr / 5

Any stage resumes after a kill; a finished stage is not re-run; the test evaluations are cached
per stage (`report-evals/<stage>/eval.json`; a stage that kept its starting actor reuses that
actor's evaluation).  Outputs: report.json, report.md, plots/*.png.

Variants
  default     the gym and the embedded model on CPU (the main job: 9-11 min alone on a 2-core
              AVX-512 host, ~20 min on a slower one; README)
  quick       the same loop at test size (<= 2 min; the tests run it)
  paper       the seed's Table 1 setup (qwen3-27b, a task directory, batch 256/288, ...): loads and
              validates (`--config.validate_only=True` is implied), cannot run here; `termrl aot
              --config=experiments/terminal_rsi.py:paper` compiles its steps for v5p-128
  direct_ppo  RPR from Base with a fresh critic (the paper's baseline), compute-matched to
              RPR-1 + RPR-2
  ablation    the 2^3 factorial: estimator (tb_gae | token_gae) x rewards (fdr_spr | fdr) x critic
              (inherit | reset), both estimators at λ = `ablation.lam` (0.95: at λ = 1 they are the
              same estimator); `--config.ablation.cell=tb_gae/fdr_spr/inherit` (or `direct_ppo`,
              `rsr_only`) picks the arm, `--config.seed=S` the seed; one run per cell and seed,
              merged by `python -m tr.stages.terminal_rsi merge RUN_DIR... --out DIR`.
"""

import ml_collections

# The ablation's factors (issue 14, "Beyond the paper") and its two extra arms.
from tr.stages.terminal_rsi import ARMS, CELLS, FACTORIAL_LAM, FACTORS  # noqa: F401
from tr.train import pod

VARIANTS = ("default", "quick", "paper", "direct_ppo", "ablation")


# The pod form's local smoke run (tests/test_launchers.py): validation only.
SMOKE_FLAGS = ("--config.validate_only=True",)


def _base_entry(variant: str) -> dict:
    """Stage `base`: the base_policy config's sections (demos, sft, eval, select)."""
    if variant == "quick":        # tr.stages.base.QUICK: the shipped init, 6 demo updates
        return {"name": "base", "kind": "base", "variant": "quick"}
    if variant == "paper":        # the pod model: no embedded init (an HF folder may be named)
        return {"name": "base", "kind": "base", "init": ""}
    # The base_policy defaults (tr/stages/base.py); the report evaluates `test` for every stage,
    # so the Base stage's own test table is small.
    return {"name": "base", "kind": "base", "eval": {"test_count": 8}}


def stage_entries(*, calibration: int, rpr1_iterations: int, rpr2_iterations: int,
                  rpr2_lr: float, base: dict, warmup_tasks: int = 32, profile_tasks: int = 16,
                  warmup_epochs: int = 1, rsr: dict | None = None) -> list[dict]:
    """The five-stage schedule plus the critic warm-up (the issue's 'Stage schedule'); `rsr`: the
    RSR stages' `rsr` section (tr/stages/rsr.py: tasks, explore_k, replay_m, ...)."""
    rsr = dict(rsr or {"tasks": 64, "explore_k": 4, "replay_m": 4})
    return [
        base,
        {"name": "rsr1", "kind": "rsr", "actor_from": "base", "rsr": dict(rsr)},
        {"name": "warmup", "kind": "warmup", "actor_from": "rsr1", "critic_from": "fresh",
         "warmup": {"tasks": warmup_tasks},
         # critic-only epochs over each warm-up batch: updates cost little next to rollouts
         "train": {"ppo": {"epochs": warmup_epochs}},
         "eval": {"at_start": False}},            # the actor is RSR-1's: nothing to evaluate
        {"name": "rpr1", "kind": "rpr", "actor_from": "rsr1", "critic_from": "warmup",
         "rpr": {"reward": "fdr", "calibration_updates": calibration,
                 "iterations": rpr1_iterations, "profile_tasks": profile_tasks}},
        {"name": "rsr2", "kind": "rsr", "actor_from": "rpr1", "rsr": dict(rsr)},
        {"name": "rpr2", "kind": "rpr", "actor_from": "rsr2", "critic_from": "rpr1",
         "rpr": {"reward": "spr", "calibration_updates": calibration,
                 "iterations": rpr2_iterations, "profile_tasks": profile_tasks},
         "train": {"actor": {"optimizer": {"learning_rate": rpr2_lr}}}},
    ]


def rsr_settings(rsr: dict) -> ml_collections.ConfigDict:
    """`config.rsr`, what the command line may set on both RSR stages: the variant's `rsr` section
    (the one `stage_entries` put in them) over the rsr kind's defaults for the other fields, plus
    the SFT's `learning_rate` (0: the kind's 3e-4)."""
    return ml_collections.ConfigDict({"per_task": 1, "per_family": 0, "temperature": 0.0,
                                      "top_p": 0.0, "epochs": 2, "batch": 8,
                                      "learning_rate": 0.0, **rsr})


def get_config(variant: str = "default"):
    if variant not in VARIANTS:
        raise ValueError(f"experiments/terminal_rsi.py: unknown variant {variant!r}; choose one of "
                         f"{VARIANTS}")
    config = ml_collections.ConfigDict()
    config.pod = pod.pod_config()
    config.job = "terminal_rsi"
    config.variant = variant
    config.seed = 0                      # every stage's seed (applied by the job)
    config.validate_only = variant == "paper"
    # A stage whose kind this checkout lacks: "skip" (the stage is left out, its children take its
    # actor_from; the run and the report say so) or "error" (refuse before running anything).
    config.missing_kinds = "skip"
    # RPR's actor lr: 3e-4 (the Base SFT's tenth) moved the tiny actor off its Base in a few
    # updates of 16 episodes (rollout pass 0.19 -> 0.00-0.06 under FDR, val down); 3e-5 over
    # 32-episode batches (16 tasks x 2) keeps each step small and its gradient less noisy, but
    # left approx KL at 0.000 (1 Dec); 1e-4 moves it a little (KL <= 0.0012).  On `val` (64 tasks,
    # RPR-1, 2 Dec) 3e-4 did no better than its start and 1e-3 collapsed (0.234 -> 0.078).
    actor_lr = 1e-4
    config.stage_defaults = ml_collections.ConfigDict({
        "model": {"name": "", "overrides": {}},   # "" = the actor parent's (Base: the embedded gym model)
        # A fresh critic (the warm-up's; each RPR phase's in the ablation's `reset` arms) starts from
        # its actor parent's weights with a zero value head: from random weights its EV stayed
        # ~0.005 after 32 warm-up updates (1 Dec).
        "critic_init": "actor",
        "tasks": {"source": "gym", "count": 0, "seed": 0},
        # context: the gym model's whole 1,024 tokens (at the bucket rule's 512 + 64, 15-20 of
        # each 32 training episodes ended in context_overflow before the verifier, 1 Dec)
        # Rollouts at temperature 1 train the raw model (SPEC §2).  Training the policy the
        # harness evaluates instead, the 0.6-tempered model (`--config.stage_defaults.rollout.
        # temperature=0.6 --config.stage_defaults.rollout.top_p=1.0 --config.stage_defaults.train.
        # policy_temperature=0.6`), triples successes (RSR explore 10 -> 30 of the same 128) and
        # the warm-up's EV (0.83 at its last update), but on `val` (64 tasks x 3, seed 0, 6 Dec)
        # the whole recursion went 24.5 -> 22.4 Mean@3 with it, so the default stays at 1
        "rollout": {"concurrency": 16, "tasks_per_iteration": 16, "group_size": 2,
                    "oversample": 0, "max_output_tokens": 64, "max_turns": 5, "context": 1024,
                    "temperature": 1.0, "top_p": 1.0},
        # Episodes packed several to a row (~40 % of a padded 1,024-token row is tokens): a
        # 32-episode PPO batch in 16 rows, 19.7 s instead of 40.5 s (bench/bench_packing.py,
        # synthetic 150-750-token episodes, 2 Dec)
        "arrays": {"rows": 32, "length": 1024, "pack_multiple": 8},
        "eval": {"count": 24, "every": 2, "k": 1},
        "train": {"actor": {"optimizer": {"learning_rate": actor_lr}},
                  "critic": {"optimizer": {"learning_rate": 1e-3}},
                  # two epochs over each RPR batch (4 updates): what packing saved buys sample
                  # reuse, the actor having barely moved at one (approx KL <= 0.0012, 2 Dec)
                  # token_mean: the recipe's loss aggregation, pinned whatever the library's
                  # default (tr/rl/losses.py; docs/results/rl-benchmark/)
                  "ppo": {"epochs": 2, "mini_batches": 2, "estimator": "tb_gae",
                          "gamma_turn": 1.0, "lam_turn": 1.0, "aggregation": "token_mean"},
                  "logprob_chunk_size": 1024,
                  # micro-batches of 2 rows in one [arrays.rows, length] buffer (bucket_layout):
                  # one compiled step for the 16- and 24-row packed batches, the calibration's full
                  # batch and the mini-batches, and a PPO update on 12 rows 4.8 -> 3.5 s (empty
                  # micro-batches skipped; smaller activations; 2-core Xeon, 4 Dec)
                  "micro_batch_rows": 2,
                  # tau: the updates train log softmax(logits / tau); rollout.temperature must
                  # equal it (1: the raw model, SPEC §2)
                  "policy_temperature": 1.0},
    })
    # Smaller than 1 Dec's schedule (65 -> 35 min on 2 cores, ~23 min with packed rows and two PPO
    # epochs, 2 Dec; the 15 is not met): RSR
    # over 32 tasks x 4, every accepted replay kept (2 per task); a 32-task warm-up (2 batches,
    # 8 epochs of 2 mini-batches: 32 critic updates); RPR one calibration batch then 4 PPO
    # batches of 32 episodes.
    calibration, it1, it2 = 1, 4, 4
    rsr = {"tasks": 32, "explore_k": 4, "replay_m": 2, "per_task": 2}
    config.stages = stage_entries(calibration=calibration, rpr1_iterations=it1,
                                  rpr2_iterations=it2, rpr2_lr=actor_lr / 5,
                                  base=_base_entry(variant), warmup_tasks=32, warmup_epochs=8,
                                  rsr=rsr)
    # Both RSR stages' settings from the command line (`--config.rsr.per_family=8`), laid over
    # each stage's own `rsr` section (tr.stages.terminal_rsi.rsr_overlay); `learning_rate` is the
    # SFT's (0: the rsr kind's 3e-4); temperature / top_p 0: the training rollouts' (1.0 / 1.0).
    # Measured on `val` (6 Dec, seed 0, Base ef238580): sampling at 0.6 / 0.95 over 112 tasks
    # triples the successes, but neither 52 replays at lr 1e-3 (val Mean@3 24.5 -> 18.2) nor 26
    # family-capped ones at 3e-4 (-> 22.9) beat Base, so the default keeps the rollouts' sampling.
    config.rsr = rsr_settings(rsr)
    # The report: a test evaluation (Mean@k, Pass@1 by family and tier) of each stage's retained
    # actor; which pipeline stage stands for which report row.
    config.report = ml_collections.ConfigDict({
        "stages": {"base": "base", "rsr1": "rsr1", "rpr1": "rpr1", "rsr2": "rsr2", "rpr2": "rpr2"},
        "split": "test", "k": 3, "count": 64, "temperature": 0.6, "top_p": 0.95,
        "max_turns": 5, "max_output_tokens": 64, "context": 1024, "concurrency": 16,
        "plots": True,
    })
    # cell: one of ARMS ("" = none); lam: λ of both estimators' clocks in a factorial cell (at
    # γ = λ = 1 TB-GAE and token GAE coincide, SPEC §2; the default run keeps the paper's λ = 1)
    config.ablation = ml_collections.ConfigDict({"cell": "", "lam": FACTORIAL_LAM})

    if variant == "quick":
        config.stage_defaults.rollout.update(concurrency=4, tasks_per_iteration=4, group_size=1,
                                             max_output_tokens=24, max_turns=2, context=0)
        config.stage_defaults.arrays.update(rows=4, length=512, pack_multiple=2)
        config.stage_defaults.eval.update(count=4, every=0)
        config.stage_defaults.train.ppo.update(mini_batches=1, epochs=1)
        rsr = {"tasks": 4, "explore_k": 2, "replay_m": 1, "epochs": 1, "batch": 4}
        config.stages = stage_entries(calibration=1, rpr1_iterations=1, rpr2_iterations=1,
                                      rpr2_lr=actor_lr / 5, base=_base_entry(variant),
                                      warmup_tasks=4, profile_tasks=4, rsr=rsr)
        config.rsr = rsr_settings(rsr)
        config.report.update(count=4, k=3, max_turns=2, max_output_tokens=24, context=0,
                             concurrency=4)
    elif variant == "direct_ppo":
        # RPR straight from Base, fresh critic (no warm-up, no RSR), the calibration and PPO
        # iterations of RPR-1 + RPR-2; the report's `rpr2` row is that stage.
        config.ablation.cell = "direct_ppo"
    elif variant == "ablation":
        config.ablation.cell = CELLS[0]
    elif variant == "paper":
        _paper(config)
    return config


def _paper(config) -> None:
    """The seed's Table 1 and setup (SPEC §6), laid out to fit a v5p-128 slice.

    `termrl aot --config=experiments/terminal_rsi.py:paper` compiles every step the stages run for
    `aot.topology` (libtpu on a CPU host, 8 Dec; GiB per chip of 95, total = argument + output -
    alias + temp):

        sft 45.9   critic 45.8   ppo 58.7 (argument 18.4, temp 28.0)
        sampler prefill 61.3, decode 67.3 (64 rows, a 32 GiB cache per chip)

    What fits: heads, MLP and vocabulary over tensor = 8, tokens over context = 4, fsdp the rest
    (2 on v5p-128); attention 1,024 queries at a time and micro-batches of 4 rows (the first
    layout, tensor 1, whole-sequence attention, 8 micro-batches, needed 162 GiB of temporaries
    per chip); each block recomputed (remat 'full'); the backbone as `qwen3-27b-32k`, whose
    max_seq_len (what the episode sampler caches per row) is the summarisation threshold, 32,768
    tokens, not 262,144 (8 GiB a row, not 64); the sampler at 64 rows, not the 288 rollouts of a
    batch (their cache alone: 144 GiB per chip).
    """
    config.pod = pod.pod_config(fsdp=-1, tensor=8, context=4, remat="full", attention_chunk=1024)
    config.aot = ml_collections.ConfigDict({"topology": "v5p-128"})
    d = config.stage_defaults
    d.model = {"name": "qwen3-27b-32k", "overrides": {}}
    d.tasks = {"source": "suite", "suite": "/data/terminal-bench/tasks", "count": 0, "seed": 0}
    d.rollout.update(concurrency=64, tasks_per_iteration=256, group_size=1, oversample=32,
                     max_output_tokens=8192, max_turns=64, context=32768)
    d.arrays.update(rows=512, length=32768)
    d.eval.update(count=0, every=1, k=3)
    d.train.actor.optimizer.learning_rate = 5e-7
    d.train.critic.optimizer.learning_rate = 1.5e-5
    d.train.ppo.update(estimator="tb_gae", mini_batches=1, epochs=1)
    d.train.micro_batch_rows = 4           # 128 micro-batches of the 512-row buffer: 16,384 tokens a chip
    rsr = {"tasks": 0, "explore_k": 4, "replay_m": 4}
    config.stages = stage_entries(calibration=4, rpr1_iterations=20, rpr2_iterations=18,
                                  rpr2_lr=1e-7, base=_base_entry("paper"), warmup_tasks=0,
                                  profile_tasks=0, rsr=rsr)
    config.rsr = rsr_settings(rsr)
    config.report.update(count=0, k=3, temperature=0.6, top_p=0.95, max_output_tokens=8192,
                         max_turns=64, context=0, concurrency=64)
    config.paper = ml_collections.ConfigDict({
        "batch": 256, "oversampled": 288, "actor_lr": 5e-7, "actor_lr_rpr2": 1e-7,
        "critic_lr": 1.5e-5, "eps_low": 0.30, "eps_high": 5.00, "eps_value": 4.00,
        "critic_grad_clip": 100.0, "retained_steps": (20, 18), "K": 4, "M": 4,
        "eval_temperature": 0.6, "eval_top_p": 0.95, "output_tokens_per_turn": 8192,
        "summary_at_tokens": 32768, "context_parallel": 4})
