"""stages: the jobs an experiment runs, compositions of agent/, rl/, rewards/, train/.

Nothing imports this package except the entry points: `experiments/main.py`, `tr/cli.py`
(`termrl`), and the CLIs that load a checkpoint (`tr.stages.checkpoints`).
"""
