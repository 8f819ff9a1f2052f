"""tr: JAX-native RL for LLM terminal agents (Terminal-RSI and ReTerm on one substrate)."""

__version__ = "0.1.0"
