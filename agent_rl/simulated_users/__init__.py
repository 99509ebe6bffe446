"""Simulated users, to measure what the loop does with feedback where no real user is at hand: one model of
behaviour (`behaviour.py`: leaving, reacting, following up, rating and mis-clicking, with noise presets) that both
the bench's population of scripted conversations (`population.py`, `conversations.py`) and the demo's users of a
real outside agent (`users.py`, driving `outside_agent.py` through the gateway) draw from. Each carries a hidden
truth the loop never reads. Nothing here runs in production; the labeler they measure is agent_rl/feedback/."""
