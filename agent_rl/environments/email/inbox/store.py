"""The inbox store interface: one API over SQLite FTS5 (default) and PostgreSQL full-text.

Every read is scoped to one inbox address, so an agent can never see another mailbox.
Keywords are data: backends must quote them, never pass them through as query syntax.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from agent_rl.records import Email, SearchHit

MAX_RESULTS = 10


@dataclass(frozen=True)
class SearchQuery:
    """A search's arguments as a backend receives them (`InboxStore.search` checked them)."""

    inbox: str
    keywords: list[str]
    sender: str | None
    sent_after: datetime | None
    sent_before: datetime | None
    max_results: int


@dataclass
class AddReport:
    inserted: int = 0
    duplicates: int = 0


class InboxStore(abc.ABC):
    """Email storage with full-text search, scoped per inbox."""

    @abc.abstractmethod
    def add_emails(self, emails: Iterable[Email]) -> AddReport:
        """Store emails; an email already present (same message_id, or same inbox+sender+subject+body) is skipped."""

    def search(
        self,
        inbox: str,
        keywords: list[str],
        sender: str | None = None,
        sent_after: datetime | None = None,
        sent_before: datetime | None = None,
        max_results: int = MAX_RESULTS,
    ) -> list[SearchHit]:
        """Emails of `inbox` containing all keywords, best match first (ties: newest first)."""
        from agent_rl.environments.email.inbox.backend_rules import check_max_results

        check_max_results(max_results)
        return self._search(SearchQuery(inbox, keywords, sender, sent_after, sent_before, max_results))

    @abc.abstractmethod
    def _search(self, query: SearchQuery) -> list[SearchHit]:
        """`search` in this backend, its arguments checked."""

    @abc.abstractmethod
    def read(self, inbox: str, message_id: str) -> Email | None:
        """The full email with recipients, or None if it is not in `inbox`."""

    @abc.abstractmethod
    def inboxes(self) -> list[str]:
        """Addresses of all inboxes in the store."""

    @abc.abstractmethod
    def count(self, inbox: str | None = None) -> int:
        """Number of stored emails (in one inbox, or in all)."""

    @abc.abstractmethod
    def iter_emails(self, inbox: str) -> Iterator[Email]:
        """Every email of one inbox, oldest first."""

    def close(self) -> None:  # pragma: no cover - backends override when they hold connections
        pass


def open_inbox_store(url: str | None = None) -> InboxStore:
    """Open the store at `url` (sqlite:///path or postgresql://...); default from AGENT_RL_INBOX_URL."""
    from agent_rl import settings

    url = url or settings.inbox_url()
    if url.startswith("sqlite"):
        from agent_rl.environments.email.inbox.sqlite_store import SQLiteInboxStore

        return SQLiteInboxStore(url)
    if url.startswith(("postgres://", "postgresql")):
        from agent_rl.environments.email.inbox.postgres_store import PostgresInboxStore

        return PostgresInboxStore(url)
    raise ValueError(f"inbox URL {url!r}: expected sqlite:///PATH or postgresql://HOST/DB")
