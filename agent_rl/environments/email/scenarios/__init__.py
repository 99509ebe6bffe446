"""Question-answer scenarios: fact-based for the demo corpus, LLM-generated for real corpora."""

from agent_rl.environments.email.scenarios.generate import IDK_ANSWER, generate_scenarios, load_scenarios, save_scenarios

__all__ = ["IDK_ANSWER", "generate_scenarios", "load_scenarios", "save_scenarios"]
