"""The policy interface under its old names: the types every policy speaks live on the ground floor
(agent_rl/environments/policy.py, where environments write their teachers and the runner plays them)."""

from __future__ import annotations

from agent_rl.environments.policy import (Conversation, Message, Policy, PolicyTurn, RowRoutedPolicy, ToolCall,
                                          ToolSchema)

__all__ = ["Conversation", "Message", "Policy", "PolicyTurn", "RowRoutedPolicy", "ToolCall", "ToolSchema"]
