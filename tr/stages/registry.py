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
}


# stage kind -> "module:function" (LAYOUT "Stages and the loop"); the loop's pipeline resolves these.
STAGE_KINDS: dict[str, str] = {
        "reterm_sft": "tr.stages.reterm:run_sft",
        "reterm_grpo": "tr.stages.reterm:run_grpo",
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
