"""Which environment GRPO trains on the rubric's reward groups. The rollouts themselves live with the
environments: the shared pieces in `agent_rl.environments.rollouts` (plug-ins may import them), the email
assistant's in its package (`agent_rl.environments.email.rollouts`, offered through `Environment.rollout_factory`)."""

from __future__ import annotations

# The environment that trains alone on the rubric's reward groups (train/grpo.py refuses to combine it).
RUBRIC_ENVIRONMENT = "email"
