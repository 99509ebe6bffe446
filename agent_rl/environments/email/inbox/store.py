"""Opening the inbox store: the backend its URL names, SQLite FTS5 (default) or PostgreSQL full-text.

The interface every backend implements (`InboxStore`, its search arguments and limits) is in store_interface.py.
"""

from __future__ import annotations

from agent_rl.environments.email.inbox.store_interface import InboxStore


def open_inbox_store(url: str | None = None) -> InboxStore:
    """Open the store at `url` (sqlite:///path or postgresql://...); default `settings.store_url()`."""
    from agent_rl import settings

    url = url or settings.store_url()
    if url.startswith("sqlite"):
        from agent_rl.environments.email.inbox.sqlite_store import SQLiteInboxStore

        return SQLiteInboxStore(url)
    if url.startswith(("postgres://", "postgresql")):
        from agent_rl.environments.email.inbox.postgres_store import PostgresInboxStore

        return PostgresInboxStore(url)
    raise ValueError(f"inbox URL {url!r}: expected sqlite:///PATH or postgresql://HOST/DB")
