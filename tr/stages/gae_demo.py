"""TB-GAE beside token GAE on a real multi-turn layout, printed as a table.

The same five decisions are laid out twice: once with short command outputs and once with the
logs 20x longer. TB-GAE gives both the same advantages on their action tokens (credit decays by
γ_turn·λ_turn per turn boundary), while token GAE over the interleaved chain decays by γλ per
*token* and so punishes verbose environments.
"""

import json
import pathlib

import jax.numpy as jnp
import numpy as np

from tr.rl import advantages

# (action, observation) of a real episode of the built-in task "data-csv-to-json".
EPISODE = (
        ("ls -la /app", "total 12\ndrwxr-xr-x 2 root root 4096 .\n-rw-r--r-- 1 root root 211 data.csv\n"),
        ("head -3 /app/data.csv", "id,name,score\n1,ada,91\n2,bob,78\n"),
        ("python3 -c 'import csv,json;print(json.dumps(list(csv.DictReader(open(\"/app/data.csv\")))))'"
          " > /app/data.json", ""),
        ("python3 -m json.tool /app/data.json | head -5", "[\n    {\n        \"id\": \"1\",\n"),
        ("echo done", "done\n"),
)
PROMPT = "You are a terminal agent. Convert /app/data.csv to /app/data.json (a list of objects)."


def layout(episode, observation_repeat: int = 1):
    """Byte-level layout of SPEC §2: (actor_mask, turn_ids, dones, rewards) of one row."""
    actor, turns = [False] * len(PROMPT.encode()), [0] * len(PROMPT.encode())
    for turn, (action, observation) in enumerate(episode, start=1):
        n_action = len(action.encode()) + 1  # + the end-of-action token
        n_observation = len((observation * observation_repeat).encode()) + 1
        actor += [True] * n_action + [False] * n_observation
        turns += [turn] * (n_action + n_observation)
    actor = np.array(actor)
    last_action = int(np.flatnonzero(actor)[-1])
    dones = np.zeros(actor.shape, bool)
    dones[last_action] = True
    rewards = np.zeros(actor.shape, np.float32)
    rewards[last_action] = 1.0
    return actor, np.array(turns, np.int32), dones, rewards


def first_action_advantages(out, actor, turns):
    """Advantage on the first action token of every turn."""
    a = np.asarray(out.advantages)[0]
    return [float(a[np.flatnonzero(actor & (turns == t))[0]]) for t in range(1, turns.max() + 1)]


def run(config, workdir: pathlib.Path):
    """Prints and writes (gae_demo.json) the per-turn advantages under each estimator."""
    rows = {}
    for label, repeat in (("short logs", 1), (f"logs x{config.long_log_repeat}", config.long_log_repeat)):
        actor, turns, dones, rewards = layout(EPISODE, repeat)
        values = np.full(actor.shape, config.value, np.float32)
        batch = lambda x: jnp.asarray(x)[None]
        tb = advantages.tb_gae(batch(rewards), batch(values), batch(actor), batch(turns), batch(dones),
                                                      gamma_turn=config.gamma_turn, lam_turn=config.lam_turn)
        chain = advantages.token_gae(batch(rewards), batch(values), batch(np.ones_like(actor)),
                                                                  batch(dones), gamma=config.gamma, lam=config.lam)
        rows[label] = {
                "tokens": int(actor.size),
                "tb_gae": first_action_advantages(tb, actor, turns),
                "token_gae": first_action_advantages(chain, actor, turns),
        }
    header = f"{'layout':<14}{'tokens':>7}  {'estimator':<10}" + "".join(
            f"{'turn ' + str(t):>9}" for t in range(1, len(EPISODE) + 1))
    lines = [header, "-" * len(header)]
    for label, row in rows.items():
        for name in ("tb_gae", "token_gae"):
            lines.append(f"{label:<14}{row['tokens']:>7}  {name:<10}" +
                                      "".join(f"{a:>9.4f}" for a in row[name]))
    table = "\n".join(lines)
    print(f"Advantage on the first action token of each turn (reward 1 at the end, v = {config.value},"
                f" γ_turn = {config.gamma_turn}, λ_turn = {config.lam_turn}, token γ = {config.gamma},"
                f" λ = {config.lam}):\n{table}")
    (workdir / "gae_demo.json").write_text(json.dumps(rows, indent=2, sort_keys=True))
    (workdir / "gae_demo.txt").write_text(table + "\n")
    return rows
