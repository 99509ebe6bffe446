"""The inbox store interface: one API over SQLite FTS5 (default) and PostgreSQL full-text.

Every read is scoped to one inbox address, so an agent can never see another mailbox.
Keywords are data: backends must quote them, never pass them through as query syntax.
The backends (sqlite_store.py, postgres_store.py) implement it; store.py opens the one a URL names. A module of
its own so that the backends do not import store.py, which imports them.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from agent_rl.environments.email.records import Email, SearchHit

MAX_RESULTS = 10


def check_max_results(max_results: int) -> int:
    if isinstance(max_results, bool) or not isinstance(max_results, int):
        raise ValueError(f"max_results must be an integer from 1 to {MAX_RESULTS}, got {max_results!r}")
    if not 1 <= max_results <= MAX_RESULTS:
        raise ValueError(f"max_results must be between 1 and {MAX_RESULTS}, got {max_results}")
    return max_results


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
