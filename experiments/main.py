"""The one entry point: `python experiments/main.py --config=experiments/X.py[:variant] --workdir=DIR`.

The config file's `get_config()` returns an ml_collections.ConfigDict whose `job` names what to run
(see tr/stages/registry.py); everything else in it is that job's settings. Any field can be
overridden on the command line, e.g. `--config.eval.k=1`. `--print_config` prints the resolved
config as JSON and exits (the pod launchers' `--dry-run` shows it). A config's `pod` section
(`tr/train/pod.py`) says whether to join a multi-process run first (`--config.pod.distributed=True`).
"""

import importlib.util
import logging as pylogging
import os
import pathlib
import signal
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tr.stages import registry  # pylint: disable=wrong-import-position

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (and :variant).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for this run's outputs.")
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False, "Print the resolved config as JSON and exit.")
flags.mark_flags_as_required(["config"])


def parse_flags(argv):
    """Parses flags; a bad config file or variant is one clear line, not a nested traceback."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        if any(line.startswith("Traceback") for line in lines):
            lines = [lines[0], lines[-1]]  # the flag at fault and the exception's own message
        sys.stderr.write("error: " + " ".join(lines) + "\n")   # one line: the flag, the cause
        sys.exit(2)
    except (AttributeError, KeyError) as error:  # --config.x=... names a field the config lacks
        overrides = [a for a in argv if a.startswith("--config.")]
        sys.stderr.write(f"error: an override in {overrides} names a field the config does not "
                         f"have: {error}\n")
        sys.exit(2)


def load_config():
    try:
        config = _CONFIG.value
        "job" in config  # pylint: disable=pointless-statement  (forces the lazy load)
    except (OSError, ValueError, AttributeError, KeyError) as error:
        raise app.UsageError(" ".join(str(error).split())) from None
    return config


# job -> the shipped config file whose default variant holds that job's defaults: a partial config
# (`job` and the fields it changes) gets every field it leaves out from there.
JOB_DEFAULTS = {"evaluate": "evaluate.py", "terminal_rsi": "terminal_rsi.py", "reterm": "reterm.py",
                "base": "base_policy.py", "gae_demo": "gae_demo.py", "aot": "pod_scale.py"}


def job_defaults(job: str):
    """The default config of `job` (JOB_DEFAULTS), or None for a job without one (`pipeline`)."""
    if job not in JOB_DEFAULTS:
        return None
    path = pathlib.Path(__file__).resolve().parent / JOB_DEFAULTS[job]
    spec = importlib.util.spec_from_file_location(f"job_defaults_{job}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def fill_defaults(config, defaults) -> list[str]:
    """Adds to `config`, in place, every field of `defaults` it lacks (recursively into sections
    both have); the values `config` gives are never touched, so a full config is unchanged.
    Returns the dotted names filled."""
    filled = []

    def walk(into, source, prefix):
        for key in source.keys():
            if key not in into:
                with into.unlocked():
                    into[key] = source[key]
                filled.append(prefix + key)
            elif hasattr(into[key], "keys") and hasattr(source[key], "keys"):
                walk(into[key], source[key], f"{prefix}{key}.")
    walk(config, defaults, "")
    return filled


def _exit_on_sigterm(signum, _frame):
    """SIGTERM (a launcher's or a scheduler's kill) as SystemExit: the stages' `finally` blocks run,
    so sandboxes close and persisted snapshots (ReTerm's failure states, its recovery queue) are
    discarded instead of left in the sandbox state folder.  A killed stage resumes as after any
    kill; what it held in memory is rebuilt."""
    raise _Terminated(128 + signum)


class _Terminated(SystemExit):
    """SIGTERM's exit, once the stages' `finally` blocks have run (`main` ends the process)."""


class _BelowErrorFromOrbax(pylogging.Filter):
    """Drops Orbax's records below ERROR (its warnings on every read-only restore are chatter)."""

    def filter(self, record: pylogging.LogRecord) -> bool:
        return record.levelno >= pylogging.ERROR or f"{os.sep}orbax{os.sep}" not in record.pathname


def quiet_third_party_logs() -> None:
    """Unless `--verbosity` was given: Python and absl logging at WARNING, and Orbax's below ERROR.
    At INFO, Orbax's checkpoint chatter (and JAX's backend probing) is most of a run's log.  The
    run's own progress lines are written to stderr directly and stay."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
        logging.get_absl_handler().addFilter(_BelowErrorFromOrbax())


def main(argv):
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    quiet_third_party_logs()
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = load_config()
    if "job" not in config:
        raise app.UsageError(f"the config from --config={flags.FLAGS['config'].serialize()} has no "
                                                  "'job' field; see experiments/README.md")
    defaults = job_defaults(str(config.job))
    if defaults is not None:
        filled = fill_defaults(config, defaults)
        if filled:
            sys.stderr.write(f"config: {len(filled)} field(s) from the {config.job} job's defaults "
                             f"(experiments/{JOB_DEFAULTS[config.job]}): "
                             f"{', '.join(filled[:8])}{' ...' if len(filled) > 8 else ''}\n")
    if _PRINT_CONFIG.value:
        print(config.to_json_best_effort(indent=2, sort_keys=True))
        return
    if _WORKDIR.value is None:
        raise app.UsageError("--workdir is required")
    primary = True  # the process that writes run-level files
    if "pod" in config and config.pod.distributed:
        import jax  # pylint: disable=g-import-not-at-top
        from tr.train import pod  # pylint: disable=g-import-not-at-top
        pod.initialize(config.pod)  # multi-host: joins every process before devices are touched
        primary = jax.process_index() == 0
    if "://" in _WORKDIR.value:  # gs://... on a pod: every host reads and writes the same store
        from etils import epath  # pylint: disable=g-import-not-at-top
        workdir = epath.Path(_WORKDIR.value)
    else:
        workdir = pathlib.Path(_WORKDIR.value).expanduser().resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if primary:
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2, sort_keys=True))
    try:
        run = registry.resolve(config.job)
        sys.stderr.write(f"job {config.job} -> {workdir}\n")
        run(config, workdir)
    except registry.ConfigError as error:
        sys.stderr.write(f"error: {error}\n")
        sys.exit(2)
    except _Terminated as stop:
        # Cleaned up; leave without the interpreter's teardown, which can abort in C++ when
        # library threads (XLA, Orbax) are still alive at exit.
        sys.stderr.write(f"terminated (SIGTERM): stages cleaned up; exit {stop.code}\n")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(stop.code)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
