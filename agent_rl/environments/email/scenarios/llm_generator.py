"""ART-E style scenario generation for real corpora: an LLM reads batches of one inbox's emails and
writes questions with answers and cited message ids, which are validated and filtered here.

Replies that are not JSON are retried and then reported; items with missing fields, unknown
categories, citations outside the batch or low realism are dropped, each reason counted.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from agent_rl.records import Split, utcnow
from agent_rl.environments.email.records import Category, Email, Scenario
from agent_rl.chat_client import ChatClient, ChatEndpoint, ChatEndpointError, ChatReply, extract_json
from agent_rl.environments.email.scenarios.generate import IDK_ANSWER


class LLMGeneratorConfig(BaseModel):
    """How to batch emails, which endpoint writes the questions, and what to keep."""

    model_config = ConfigDict(frozen=True)

    endpoint: ChatEndpoint
    batch_size: PositiveInt = Field(default=20, description="emails of one inbox per request")
    questions_per_batch: PositiveInt = Field(default=10, description="how many questions to ask the model for")
    min_realism: float = Field(default=0.5, ge=0.0, le=1.0, description="drop questions the model rates below this")
    max_body_chars: PositiveInt = Field(default=2000, description="email bodies are cut to this length in the prompt")
    test_fraction: float = Field(default=0.2, ge=0.0, le=1.0, description="share of batches whose questions go to test")
    seed: int = 0


@dataclass
class GenerationReport:
    """What happened: batches sent, failed (with why), questions kept and dropped (by reason)."""

    batches: int = 0
    failed_batches: list[str] = field(default_factory=list)
    accepted: int = 0
    dropped: Counter = field(default_factory=Counter)
    http_attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


_SYSTEM = """You write realistic questions that the owner of an email inbox might ask an assistant, \
with answers found in the emails shown. Ask about specific facts: dates and times, amounts, people \
and who is responsible, locations, decisions and their status. Word questions the way a busy person \
would type them ("When is Sherry's move to Portland targeted for?"). Every answer must be supported \
by the emails; cite the Message-ID of each email that states it.
Reply with JSON only: {"questions": [{"question": str, "answer": str, "source_ids": [message ids], \
"category": one of CATEGORIES, "realism": number from 0 to 1 (how likely a real user asks this)}]}"""


def _render(email: Email, max_chars: int) -> str:
    body = email.body if len(email.body) <= max_chars else email.body[:max_chars] + "\n[...]"
    return (
        f"Message-ID: {email.message_id}\nDate: {email.date.isoformat() if email.date else ''}\n"
        f"From: {email.sender}\nTo: {', '.join(email.to)}\nSubject: {email.subject}\n\n{body}"
    )


def build_messages(inbox: str, batch: list[Email], config: LLMGeneratorConfig) -> list[dict[str, str]]:
    categories = ", ".join(c.value for c in Category if c != Category.UNANSWERABLE)
    emails = "\n\n=====\n\n".join(_render(e, config.max_body_chars) for e in batch)
    user = (
        f"Inbox owner: {inbox}\nWrite up to {config.questions_per_batch} questions about these "
        f"{len(batch)} emails.\n\n{emails}"
    )
    return [{"role": "system", "content": _SYSTEM.replace("CATEGORIES", categories)}, {"role": "user", "content": user}]


def _parse_items(reply: ChatReply) -> list[Any]:
    data = extract_json(reply.content)
    if isinstance(data, dict):
        data = data.get("questions", data.get("items"))
    if not isinstance(data, list):
        raise ValueError(f'expected a JSON list or {{"questions": [...]}}, got {reply.content[:120]!r}')
    return data


def _resolve(source_id: Any, known: dict[str, Email]) -> Email | None:
    """Models drop or add the angle brackets of Message-IDs; accept either."""
    if not isinstance(source_id, str):
        return None
    sid = source_id.strip()
    return known.get(sid) or known.get(f"<{sid.strip('<>')}>") or known.get(sid.strip("<>"))


def validate_items(
    items: list[Any], inbox: str, batch: list[Email], config: LLMGeneratorConfig, split: Split,
    seen: set[tuple[str, str]] | None = None,
) -> tuple[list[Scenario], Counter]:
    """Turn model items into scenarios; return them and the count of dropped items per reason.

    `seen` holds (inbox, lowercased question) pairs already kept, so repeats across batches drop too.
    """
    known = {e.message_id: e for e in batch}
    dropped: Counter = Counter()
    kept: list[Scenario] = []
    seen = set() if seen is None else seen
    batch_end = max((e.date for e in batch if e.date), default=None)
    for item in items:
        if not isinstance(item, dict):
            dropped["not_an_object"] += 1
            continue
        missing = [k for k in ("question", "answer", "source_ids", "category") if item.get(k) in (None, "")]
        if missing:
            dropped["missing_field"] += 1
            continue
        question, answer = str(item["question"]).strip(), str(item["answer"]).strip()
        try:
            category = Category(str(item["category"]).strip().lower())
        except ValueError:
            dropped["unknown_category"] += 1
            continue
        if not isinstance(item["source_ids"], list):
            dropped["bad_source_ids"] += 1
            continue
        sources = [_resolve(s, known) for s in item["source_ids"]]
        if any(s is None for s in sources):
            dropped["unknown_source"] += 1
            continue
        if category == Category.UNANSWERABLE:
            if sources:
                dropped["unanswerable_with_sources"] += 1
                continue
            answer = IDK_ANSWER
        elif not sources:
            dropped["no_source"] += 1
            continue
        try:
            realism = float(item.get("realism", 0.0))
        except (TypeError, ValueError):
            dropped["bad_realism"] += 1
            continue
        if not 0.0 <= realism <= 1.0:
            dropped["bad_realism"] += 1
            continue
        if realism < config.min_realism:
            dropped["low_realism"] += 1
            continue
        if (inbox, question.lower()) in seen:
            dropped["duplicate"] += 1
            continue
        seen.add((inbox, question.lower()))
        cited_end = max((s.date for s in sources if s.date), default=batch_end)
        query_date: datetime = (cited_end + timedelta(days=1)) if cited_end else utcnow()
        digest = hashlib.sha1(f"{inbox}\n{question}".encode()).hexdigest()[:16]
        kept.append(Scenario(
            id=f"llm-{digest}", inbox_id=inbox, question=question, answer=answer,
            source_ids=list(dict.fromkeys(s.message_id for s in sources)), category=category, split=split,
            query_date=query_date, realism=realism,
        ))  # fmt: skip
    return kept, dropped


def _batches(emails: Iterable[Email], size: int) -> list[tuple[str, list[Email]]]:
    by_inbox: dict[str, list[Email]] = {}
    for email in emails:
        by_inbox.setdefault(email.inbox, []).append(email)
    result = []
    for inbox in sorted(by_inbox):
        ordered = sorted(by_inbox[inbox], key=lambda e: (e.date is None, e.date or datetime.min, e.message_id))
        result.extend((inbox, ordered[i : i + size]) for i in range(0, len(ordered), size))
    return result


def generate_llm_scenarios(
    emails: Iterable[Email], config: LLMGeneratorConfig, *, client: ChatClient | None = None
) -> tuple[list[Scenario], GenerationReport]:
    """Questions for every batch of every inbox in `emails`; a batch's questions share one split,
    so no email supports questions in both train and test."""
    report = GenerationReport()
    scenarios: list[Scenario] = []
    seen: set[tuple[str, str]] = set()
    owns_client = client is None
    client = client or ChatClient(config.endpoint)
    try:
        for inbox, batch in _batches(emails, config.batch_size):
            report.batches += 1
            draw = random.Random(f"{config.seed}:{batch[0].message_id}").random()
            split = Split.TEST if draw < config.test_fraction else Split.TRAIN
            usage: list[ChatReply] = []

            def parse(reply: ChatReply) -> list[Any]:
                usage.append(reply)
                return _parse_items(reply)

            try:
                items = client.complete(build_messages(inbox, batch, config), parse)
            except ChatEndpointError as exc:
                report.failed_batches.append(f"{inbox} batch starting {batch[0].message_id}: {exc}")
                continue
            finally:
                report.prompt_tokens += sum(r.prompt_tokens for r in usage)
                report.completion_tokens += sum(r.completion_tokens for r in usage)
            kept, dropped = validate_items(items, inbox, batch, config, split, seen)
            scenarios.extend(kept)
            report.accepted += len(kept)
            report.dropped.update(dropped)
    finally:
        report.http_attempts = client.attempts
        if owns_client:
            client.close()
    return scenarios, report
