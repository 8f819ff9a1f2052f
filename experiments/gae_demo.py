"""TB-GAE beside token GAE on one real multi-turn layout (no model, no sandbox).

  python experiments/main.py --config=experiments/gae_demo.py --workdir=/tmp/gae
  python experiments/main.py --config=experiments/gae_demo.py:unit_clock --workdir=/tmp/gae1

Variants: `default` (γ_turn = 0.99, λ_turn = 0.95) and `unit_clock` (γ_turn = λ_turn = 1, where
TB-GAE equals token GAE over action tokens with γ = λ = 1).
"""

import ml_collections

from tr.train import pod

VARIANTS = ("default", "unit_clock")

# The pod form's local smoke run (tests/test_launchers.py): the default is already seconds.
SMOKE_FLAGS = ()


def get_config(variant: str = "default"):
    if variant not in VARIANTS:
        raise ValueError(f"experiments/gae_demo.py: unknown variant {variant!r}; choose one of {VARIANTS}")
    config = ml_collections.ConfigDict()
    config.pod = pod.pod_config()  # what a pod run needs (launch/tpu_pod.sh, launch/xpk.sh)
    config.job = "gae_demo"
    config.value = 0.0  # an uninformed critic, so differences come from the estimators alone
    config.gamma_turn = 0.99
    config.lam_turn = 0.95
    config.gamma = 1.0
    config.lam = 0.95
    config.long_log_repeat = 20
    if variant == "unit_clock":
        config.gamma_turn = config.lam_turn = 1.0
    return config
