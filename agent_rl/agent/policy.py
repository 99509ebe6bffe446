"""The policy interface, as the agent layer serves it: the types every policy speaks live on the ground floor
(agent_rl/environments/policy.py, where environments write their teachers) and are importable here under their
old names; `RowRoutedPolicy`, a policy that answers each row with its own version, is the agent's."""

from __future__ import annotations

import abc

from agent_rl.environments.policy import Conversation, Message, Policy, PolicyTurn, ToolCall, ToolSchema

__all__ = ["Conversation", "Message", "Policy", "PolicyTurn", "RowRoutedPolicy", "ToolCall", "ToolSchema"]


class RowRoutedPolicy(Policy):
    """A policy that can answer each conversation with a different version (per-row adapters on one shared
    base, agent/shared_base.py): the runner passes every row's routed version to `act_rows`."""

    @abc.abstractmethod
    def act_rows(
        self,
        rows: list[str | None],
        conversations: list[Conversation],
        tools: list[ToolSchema],
        max_new_tokens: int = 256,
    ) -> list[PolicyTurn]:
        """Next turn for each conversation, conversation i answered by version rows[i]."""
