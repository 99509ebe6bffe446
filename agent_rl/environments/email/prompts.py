"""The agent's system prompt and opening messages, kept short on purpose.

The prompt is in every trained trajectory (with the tool schemas, 616 of a ~1,450-token demo SFT row), so it
says only what the agent does and how to answer; a second system message says whose inbox and what day it is.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

# Instructions are the same for every inbox and day, so the system block they open (with the tool schemas,
# ~610 of a ~1,450-token demo trajectory) renders to the same tokens everywhere: serving computes its attention
# cache once, and SFT computes it once per optimizer step without gradient (train/sft.py). What varies (whose
# inbox, which day) follows in a second system message.
SYSTEM_PROMPT = (
    "You answer questions about the user's email inbox.\n"
    "Search the emails with a few keywords, read the relevant ones, then call return_final_answer "
    "with a short answer and the ids of the emails it comes from. "
    "If the emails do not tell, answer \"I don't know\"."
)
CONTEXT_PROMPT = "The inbox is {inbox}. Today is {today}."


def context_prompt(inbox: str, query_date: datetime | None = None) -> str:
    """Whose inbox and which day: the scenario's query date, else (live traffic) today."""
    day = query_date or datetime.now(timezone.utc)
    return CONTEXT_PROMPT.format(inbox=inbox, today=day.strftime("%A, %Y-%m-%d"))


def system_prompt(inbox: str, query_date: datetime | None = None) -> str:
    """Everything the system messages tell the agent, as one text (for one-system-message consumers)."""
    return f"{SYSTEM_PROMPT}\n{context_prompt(inbox, query_date)}"


def initial_messages(inbox: str, question: str, query_date: datetime | None = None) -> list[dict[str, Any]]:
    """The messages that open an episode: the shared instructions, this episode's inbox and day, the question."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "system", "content": context_prompt(inbox, query_date)},
        {"role": "user", "content": question},
    ]
