"""stages: the jobs an experiment runs, compositions of agent/, rl/, rewards/, train/.

Nothing imports this package except the entry point `experiments/main.py`.
"""
