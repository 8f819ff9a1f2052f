"""The main job: evaluate policies on the built-in suite in the local sandbox (SPEC §6).

  bash launch/run.sh                                   # default variant
  python experiments/main.py --config=experiments/evaluate.py:scripted --workdir=/tmp/eval

Reports Mean@k and Pass@1 by family and tier for the scripted teacher (replays each task's
reference solution) and the untrained tiny model, writes WORKDIR/eval.json, eval.txt, the episode
records (JSONL shards that `python -m tr.rewards.rescore` and the grain pipeline read).

Variants: `default` (scripted + tiny, k = 3), `scripted`, `tiny_model`, `quick` (k = 1, a few
tasks: a smoke test), `docker` (the default on the Docker backend).
"""

import ml_collections

from tr.train import pod

VARIANTS = ("default", "scripted", "tiny_model", "quick", "docker")

# The pod form's local smoke run (tests/test_launchers.py): one task, the scripted teacher.
SMOKE_FLAGS = ("--config.eval.policies=('scripted',)", "--config.eval.tasks=('ft-normalize-whitespace',)",
               "--config.eval.k=1")


def get_config(variant: str = "default"):
    if variant not in VARIANTS:
        raise ValueError(f"experiments/evaluate.py: unknown variant {variant!r}; choose one of {VARIANTS}")
    config = ml_collections.ConfigDict()
    config.pod = pod.pod_config()  # what a pod run needs (launch/tpu_pod.sh, launch/xpk.sh)
    config.job = "evaluate"
    config.seed = 0
    config.eval = ml_collections.ConfigDict()
    config.eval.policies = ("scripted", "tiny")  # 'scripted' and/or a model size from tr/models/config.py
    # Trained weights: checkpoint specs (tr/stages/checkpoints.py: a run's stage W/STAGE[@STEP] or
    # a Hugging Face folder hf:DIR), each evaluated with its own model, tokenizer and system prompt
    # at the sampling and budgets of `checkpoint_eval` (the Terminal-RSI report's, context 0: the
    # sampler's bucket rule, which fits any model size)
    config.eval.checkpoints = ()
    config.eval.checkpoint_eval = ml_collections.ConfigDict({
        "temperature": 0.6, "top_p": 0.95, "max_turns": 5, "max_output_tokens": 64, "context": 0})
    config.eval.k = 3
    config.eval.suite = ""  # a task directory tree; "" = the built-in suite
    config.eval.tasks = ()  # only these task ids; () = all
    config.eval.backend = "local"
    config.eval.concurrency = 8  # sandboxes at once; also the batch of generation requests
    # docker: spread the sandboxes over these engines (URLs such as "tcp://10.0.0.7:2375" or
    # docker context names; tr/envs/endpoints.py); () = the local engine only
    config.eval.docker_endpoints = ()
    config.eval.max_turns = 0  # 0 = each task's own turn cap
    # The untrained model never writes the action format, and each of its turns re-reads a ~1.5k-token
    # byte-level prompt (~1 s per episode on 2 CPU cores): one turn keeps the main job to minutes.
    config.eval.model_max_turns = 1
    config.eval.model_output_tokens = 64
    if variant == "scripted":
        config.eval.policies = ("scripted",)
    elif variant == "tiny_model":
        config.eval.policies = ("tiny",)
    elif variant == "quick":
        config.eval.k = 1
        config.eval.tasks = ("ft-normalize-whitespace", "log-status-summary", "data-csv-to-json")
    elif variant == "docker":
        config.eval.backend = "docker"
    return config
