"""The agent's system prompt and opening messages, kept short on purpose.

The prompt is paid for in every trained trajectory (DESIGN.md: with the tool schemas it was
419 of ~930 tokens), so it says only who the agent is, whose inbox, what day it is and how to answer.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

SYSTEM_PROMPT = (
    "You answer questions about the email inbox of {inbox}. Today is {today}.\n"
    "Search the emails with a few keywords, read the relevant ones, then call return_final_answer "
    "with a short answer and the ids of the emails it comes from. "
    "If the emails do not tell, answer \"I don't know\"."
)


def system_prompt(inbox: str, query_date: datetime | None = None) -> str:
    """The system prompt for one inbox on one day: the scenario's query date, else (live traffic) today."""
    day = query_date or datetime.now(timezone.utc)
    return SYSTEM_PROMPT.format(inbox=inbox, today=day.strftime("%A, %Y-%m-%d"))


def initial_messages(inbox: str, question: str, query_date: datetime | None = None) -> list[dict[str, Any]]:
    """System and user messages that open an episode."""
    return [
        {"role": "system", "content": system_prompt(inbox, query_date)},
        {"role": "user", "content": question},
    ]
