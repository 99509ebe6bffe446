"""The agent's three tools (search, read, answer), bound to one episode's inbox.

The tool methods are plain typed functions with Google-style docstrings, so
`transformers.utils.get_json_schema` (and TRL, which calls it) derives their schemas. Every
call is recorded in an `EpisodeTrace` for the rubric and the reward-hacking detectors. A tool
never raises: bad arguments come back to the model as a short JSON error it can act on.
"""

from __future__ import annotations

import inspect
import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent_rl.environments.core import session_tool_schemas
from agent_rl.environments.rollouts import ANSWER_ACK
from agent_rl.environments.sessions import tool_parameters
from agent_rl.environments.email.inbox.store_interface import MAX_RESULTS, InboxStore
from agent_rl.environments.email.records import Email
from agent_rl.utc import as_utc

TOOL_NAMES = ("search_emails", "read_email", "return_final_answer")
# Results of a search that does not ask for a number: the gold email ranks in the top 5 of the first search in
# >99% of demo questions that find it, and each further hit costs ~140 prompt tokens in every later turn.
DEFAULT_RESULTS = 5


class ToolConfig(BaseModel):
    """Size limits for what the tools show the model: every character is a trained token."""

    model_config = ConfigDict(frozen=True)

    snippet_chars: int = Field(120, ge=20, description="longest search-hit snippet shown")
    # Demo bodies are at most ~900 characters; a longer (real) email shows its first 1,000, where the news is.
    body_chars: int = Field(1000, ge=100, description="longest email body shown by read_email")
    max_keywords: int = Field(8, ge=1, description="most keywords accepted in one search")
    max_keyword_chars: int = Field(60, ge=1, description="longest single keyword accepted")


@dataclass
class SearchRecord:
    keywords: list[str]
    sender: str | None
    sent_after: str | None
    sent_before: str | None
    hit_ids: list[str]


@dataclass
class ToolError:
    tool: str
    message: str


@dataclass
class EpisodeTrace:
    """What the agent did with the tools in one episode: searches with their hits, reads, errors, answer."""

    searches: list[SearchRecord] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    errors: list[ToolError] = field(default_factory=list)
    final_answer: str | None = None
    sources: list[str] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return self.final_answer is not None

    @property
    def seen_ids(self) -> set[str]:
        """Every message id that appeared in any search result."""
        return {hit for search in self.searches for hit in search.hit_ids}


class ToolArgumentError(ValueError):
    """An argument the model gave is unusable; the message is shown to the model."""


def _error(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)


# What a search that matched nothing returns. A bare "[]" was two tokens a 135M policy learned to skip: after
# it, the SFT model invented an email id to read on 6 of 8 unanswerable test questions. A sentence is a cue it
# can condition on (the answer then is a broader search or "I don't know").
NO_RESULTS_PREFIX = "No emails match"


def no_results(words: list[str], sender: str | None) -> str:
    """The search result when nothing matched: says so in words, naming the keywords (and sender) tried."""
    text = f"{NO_RESULTS_PREFIX} all of the keywords {_compact(words)}"
    return text + (f" from {sender}." if sender else ".")


def is_no_results(result: str | None) -> bool:
    return bool(result) and (result.startswith(NO_RESULTS_PREFIX) or result.strip() == "[]")


def _compact(value: Any) -> str:
    # Compact separators: fewer tokens for the same content.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _parse_date(name: str, value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ToolArgumentError(f"{name} must be a date string like 2001-05-31, got {type(value).__name__}")
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        return as_utc(datetime.fromisoformat(text))
    except ValueError:
        raise ToolArgumentError(f"{name} {value[:40]!r} is not a date; use YYYY-MM-DD") from None


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _day(value: datetime | None) -> str | None:
    return value.strftime("%Y-%m-%d") if value else None


class InboxTools:
    """The tools of one episode. Public methods are exactly the tools (TRL lists public methods)."""

    def __init__(
        self,
        store: InboxStore,
        inbox: str,
        query_date: datetime | None = None,
        config: ToolConfig | None = None,
    ) -> None:
        self._store = store
        self._inbox = inbox
        self._query_date = as_utc(query_date) if query_date else None
        self._config = config or ToolConfig()
        self.trace = EpisodeTrace()

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """JSON schemas of the tools, as `get_json_schema` (and so TRL) renders them."""
        return tool_schemas()

    def search_emails(
        self,
        keywords: list[str],
        sender: str | None = None,
        sent_after: str | None = None,
        sent_before: str | None = None,
        max_results: int = DEFAULT_RESULTS,
    ) -> str:
        """Search the inbox for emails that contain all the keywords.

        Args:
            keywords: Words that must all appear in the email.
            sender: Only emails from this address.
            sent_after: Only emails sent after this date, YYYY-MM-DD.
            sent_before: Only emails sent before this date, YYYY-MM-DD.
            max_results: Most results to return, 1 to 10.
        """
        try:
            return self._search(keywords, sender, sent_after, sent_before, max_results)
        except ToolArgumentError as exc:
            return self._fail("search_emails", str(exc))
        except Exception as exc:  # a backend failure must not end the episode with a traceback
            return self._fail("search_emails", f"search failed: {type(exc).__name__}")

    def read_email(self, message_id: str) -> str:
        """Read one email in full.

        Args:
            message_id: The id of the email, from search results.
        """
        try:
            return self._read(message_id)
        except ToolArgumentError as exc:
            return self._fail("read_email", str(exc))
        except Exception as exc:
            return self._fail("read_email", f"read failed: {type(exc).__name__}")

    def return_final_answer(self, answer: str, sources: list[str]) -> str:
        """Give the final answer to the question; this ends the task.

        Args:
            answer: The answer, or "I don't know" if the emails do not say.
            sources: Ids of the emails that support the answer.
        """
        try:
            return self._answer(answer, sources)
        except ToolArgumentError as exc:
            return self._fail("return_final_answer", str(exc))
        except Exception as exc:
            return self._fail("return_final_answer", f"answer failed: {type(exc).__name__}")

    # -- implementations -------------------------------------------------------------------

    def _fail(self, tool: str, message: str) -> str:
        self.trace.errors.append(ToolError(tool, message))
        return _error(message)

    def _keywords(self, keywords: Any) -> list[str]:
        if not isinstance(keywords, list):
            raise ToolArgumentError('keywords must be a list of strings, e.g. ["budget", "meeting"]')
        if not all(isinstance(word, str) for word in keywords):
            raise ToolArgumentError("every keyword must be a string")
        words = [word.strip() for word in keywords if word.strip()]
        if not words:
            raise ToolArgumentError("give at least one non-empty keyword")
        if len(words) > self._config.max_keywords:
            raise ToolArgumentError(f"at most {self._config.max_keywords} keywords")
        if any(len(word) > self._config.max_keyword_chars for word in words):
            raise ToolArgumentError(f"keywords must be at most {self._config.max_keyword_chars} characters")
        return words

    def _search(self, keywords: Any, sender: Any, sent_after: Any, sent_before: Any, max_results: Any) -> str:
        words = self._keywords(keywords)
        if sender == "":
            sender = None
        if sender is not None and not isinstance(sender, str):
            raise ToolArgumentError("sender must be an email address string")
        after = _parse_date("sent_after", sent_after)
        before = _parse_date("sent_before", sent_before)
        # The agent lives on the scenario's query date: nothing later exists for it.
        if self._query_date and (before is None or before > self._query_date):
            before = self._query_date
        if isinstance(max_results, bool) or not isinstance(max_results, int):
            raise ToolArgumentError("max_results must be an integer from 1 to 10")
        if not 1 <= max_results <= MAX_RESULTS:
            raise ToolArgumentError(f"max_results must be from 1 to {MAX_RESULTS}, got {max_results}")
        hits = self._store.search(
            self._inbox, words, sender=sender, sent_after=after, sent_before=before, max_results=max_results
        )
        hits = [hit for hit in hits if self._visible(hit.date)]
        self.trace.searches.append(
            SearchRecord(words, sender, _day(after), _day(before), [hit.message_id for hit in hits])
        )
        if not hits:
            return no_results(words, sender)
        return _compact(
            [
                {
                    "id": hit.message_id,
                    "date": _day(hit.date),
                    "from": hit.sender,
                    "subject": _short(hit.subject, 80),
                    "snippet": _short(hit.snippet, self._config.snippet_chars),
                }
                for hit in hits
            ]
        )

    def _visible(self, date: datetime | None) -> bool:
        return self._query_date is None or date is None or as_utc(date) <= self._query_date

    def _read(self, message_id: Any) -> str:
        if not isinstance(message_id, str) or not message_id.strip():
            raise ToolArgumentError("message_id must be the id string of an email from search results")
        message_id = message_id.strip()
        email = cached_read(self._store, self._inbox, message_id)
        # Another inbox's email and a future email look exactly like a missing one.
        if email is None or not self._visible(email.date):
            raise ToolArgumentError(f"email {message_id[:80]} not found")
        self.trace.reads.append(email.message_id)
        shown: dict[str, Any] = {
            "id": email.message_id,
            "date": email.date.strftime("%Y-%m-%d %H:%M") if email.date else None,
            "from": email.sender,
            "to": list(email.to),
        }
        if email.cc:
            shown["cc"] = list(email.cc)
        shown["subject"] = email.subject
        body = email.body.strip()
        if len(body) > self._config.body_chars:
            body = body[: self._config.body_chars] + " [...]"
        shown["body"] = body
        return _compact(shown)

    def _answer(self, answer: Any, sources: Any) -> str:
        if not isinstance(answer, str) or not answer.strip():
            raise ToolArgumentError('answer must be a non-empty string (or "I don\'t know")')
        if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
            raise ToolArgumentError("sources must be a list of email id strings (may be empty)")
        if self.trace.answered:
            raise ToolArgumentError("an answer was already given")
        self.trace.final_answer = answer.strip()
        self.trace.sources = list(dict.fromkeys(s.strip() for s in sources if s.strip()))
        return ANSWER_ACK  # the trainer ends a rollout on it (environments/rollouts.py)


READ_CACHE_SIZE = 4096
_read_caches: weakref.WeakKeyDictionary[InboxStore, OrderedDict[tuple[str, str], Email]] = weakref.WeakKeyDictionary()
_read_lock = threading.Lock()


def cached_read(store: InboxStore, inbox: str, message_id: str) -> Email | None:
    """`store.read(inbox, message_id)`, remembered per store (LRU of READ_CACHE_SIZE emails).

    A stored email never changes (adding one with a known message_id is skipped), so a read
    can be reused for as long as the store lives; misses are not remembered, since the email
    may be ingested later. Agents read the same few emails over and over in load tests and
    GRPO groups, and each read is a database round trip.
    """
    key = (inbox, message_id)
    try:
        with _read_lock:
            cache = _read_caches.get(store)
            if cache is None:
                cache = _read_caches[store] = OrderedDict()
            email = cache.get(key)
            if email is not None:
                cache.move_to_end(key)
                return email
    except TypeError:  # a store that cannot be weakly referenced or hashed is read directly
        return store.read(inbox, message_id)
    email = store.read(inbox, message_id)
    if email is not None:
        with _read_lock:
            cache[key] = email
            if len(cache) > READ_CACHE_SIZE:
                cache.popitem(last=False)
    return email


def make_tools(
    store: InboxStore, inbox: str, query_date: datetime | None = None, config: ToolConfig | None = None
) -> InboxTools:
    """The tools for one episode on `inbox`, seeing only emails up to `query_date`."""
    return InboxTools(store, inbox, query_date, config)


def tool_schemas() -> list[dict[str, Any]]:
    """The tools' JSON schemas, as every environment's are derived (copies: callers may not corrupt the cache)."""
    return session_tool_schemas(InboxTools)


def call_tool(tools: InboxTools, name: str, arguments: Any) -> str:
    """Run one tool call by name with the model's arguments; unknown argument names are an error result."""
    if name not in TOOL_NAMES:
        return tools._fail(str(name)[:40], f"unknown tool {str(name)[:40]!r}; use one of {', '.join(TOOL_NAMES)}")
    if not isinstance(arguments, dict):
        return tools._fail(name, "arguments must be a JSON object")
    method = getattr(tools, name)
    if name in vars(tools):  # replaced on the instance: its own signature counts
        parameters = inspect.signature(method).parameters
        names = tuple(parameters)
        required = tuple(p for p in names if parameters[p].default is inspect.Parameter.empty)
    else:
        names, required = tool_parameters(type(tools), name)
    unknown = sorted(str(key) for key in arguments if key not in names)
    if unknown:
        return tools._fail(name, f"unknown argument(s) {', '.join(unknown)[:80]}; expected {', '.join(names)}")
    missing = [p for p in required if p not in arguments]
    if missing:
        return tools._fail(name, f"missing argument(s) {', '.join(missing)}")
    return method(**arguments)
