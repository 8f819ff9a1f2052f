"""The jobs `experiments/main.py` can run, by the name an experiment config gives in `job`."""

import importlib
from typing import Callable

# job name -> "module:function"; imported lazily so a job pulls in only what it needs.
JOBS: dict[str, str] = {
        "gae_demo": "tr.stages.gae_demo:run",
        "evaluate": "tr.stages.evaluate:run",
        "base": "tr.stages.base:run",
        "reterm": "tr.stages.reterm:run",
        "aot": "tr.train.aot:run",
        "pipeline": "tr.stages.pipeline:run",
        "terminal_rsi": "tr.stages.terminal_rsi:run",
}

# stage kind -> "module:function" with run(stage_config, run_dir) -> summary dict.
STAGE_KINDS: dict[str, str] = {
        "init": "tr.stages.handoff:init_base",
        "warmup": "tr.stages.warmup:run",
        "rpr": "tr.stages.rpr:run",
        "rsr": "tr.stages.rsr:run",
        "base": "tr.stages.base:run_stage",
        "reterm_sft": "tr.stages.reterm:run_sft",
        "grpo": "tr.stages.reterm:run_grpo",
        "reterm_grpo": "tr.stages.reterm:run_reterm_grpo",
}


class ConfigError(ValueError):
    """A config field holds a value the job cannot use; the message names the field."""


class UnknownJobError(ConfigError):
    """The config names a job that does not exist."""


def resolve(job: str) -> Callable:
    """Returns the run(config, workdir) function of `job`."""
    if job not in JOBS:
        raise UnknownJobError(
                f"config.job = {job!r} is not a known job; choose one of {sorted(JOBS)}")
    module_name, function_name = JOBS[job].split(":")
    return getattr(importlib.import_module(module_name), function_name)


def stage_kind(kind: str) -> Callable:
    """Returns the run(stage_config, run_dir) function of stage kind `kind`."""
    if kind not in STAGE_KINDS:
        raise ConfigError(f"stage kind {kind!r} is not known; choose one of {sorted(STAGE_KINDS)}")
    module_name, function_name = STAGE_KINDS[kind].split(":")
    return getattr(importlib.import_module(module_name), function_name)
