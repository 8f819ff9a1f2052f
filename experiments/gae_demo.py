"""TB-GAE beside token GAE on one real multi-turn layout (no model, no sandbox).

  python experiments/main.py --config=experiments/gae_demo.py --workdir=/tmp/gae
"""

import ml_collections


def get_config():
    config = ml_collections.ConfigDict()
    config.job = "gae_demo"
    config.value = 0.5  # a constant critic, so differences come from the estimators alone
    config.gamma_turn = 0.99
    config.lam_turn = 0.95
    config.gamma = 0.99
    config.lam = 0.95
    config.long_log_repeat = 20
    return config
