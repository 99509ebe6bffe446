"""agent-rl: continuous RL training for tool-using LLM agents (library; imports no Dagster)."""

__version__ = "0.1.0"
