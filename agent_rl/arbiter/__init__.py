"""The serving router: splits traffic between policy versions, logs every episode to the pool, takes feedback.

Import `agent_rl.arbiter.app` (FastAPI) or `agent_rl.arbiter.policies` directly; this package
imports nothing heavy so that `register_policy_loader` can be called cheaply.
"""
