"""The one entry point: `python experiments/main.py --config=experiments/X.py[:variant] --workdir=DIR`.

The config file's `get_config()` returns an ml_collections.ConfigDict whose `job` names what to run
(see tr/stages/registry.py); everything else in it is that job's settings. Any field can be
overridden on the command line, e.g. `--config.eval.k=1`.
"""

import pathlib
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tr.stages import registry  # pylint: disable=wrong-import-position

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (and :variant).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for this run's outputs.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    if "job" not in config:
        raise app.UsageError(f"the config from --config={flags.FLAGS['config'].serialize()} has no "
                                                  "'job' field; see experiments/README.md")
    if config.get("distributed", False):
        import jax  # pylint: disable=g-import-not-at-top
        jax.distributed.initialize()  # multi-host TPU pods: coordinator from the TPU environment
    workdir = pathlib.Path(_WORKDIR.value).expanduser().resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2, sort_keys=True))
    try:
        run = registry.resolve(config.job)
    except registry.UnknownJobError as error:
        raise app.UsageError(str(error)) from None
    logging.info("job %s -> %s", config.job, workdir)
    run(config, workdir)


if __name__ == "__main__":
    app.run(main)
