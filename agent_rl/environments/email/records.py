"""The email assistant's records: stored emails, search hits, and scenarios (a question about one inbox with its
golden answer). The loop never reads them: it sees the environment's tasks and episodes (agent_rl/records.py)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from agent_rl.records import Split


class Category(StrEnum):
    """Task categories; the quality gate wants at least five of them in a training set."""

    DATE = "date"
    AMOUNT = "amount"
    PERSON = "person"
    LOCATION = "location"
    STATUS = "status"
    UNANSWERABLE = "unanswerable"


class Email(BaseModel):
    """One stored email; `inbox` is the address of the mailbox it belongs to."""

    model_config = ConfigDict(frozen=True)

    message_id: str
    inbox: str
    date: datetime | None = None
    subject: str = ""
    sender: str = ""
    to: tuple[str, ...] = ()
    cc: tuple[str, ...] = ()
    bcc: tuple[str, ...] = ()
    body: str = ""
    folder: str = ""
    file: str = ""


class SearchHit(BaseModel):
    model_config = ConfigDict(frozen=True)

    message_id: str
    subject: str
    sender: str
    date: datetime | None
    snippet: str


class Scenario(BaseModel):
    """A question about one inbox with its golden answer and the emails that support it."""

    id: str
    inbox_id: str
    question: str
    answer: str
    source_ids: list[str] = Field(default_factory=list)
    category: Category
    split: Split
    query_date: datetime
    realism: float = 1.0

    @property
    def answerable(self) -> bool:
        return self.category != Category.UNANSWERABLE


__all__ = ["Category", "Email", "Scenario", "SearchHit"]
