"""Fact-based scenario generation for the demo corpus, split by fact, and JSONL save/load.

Every answerable scenario asks about one fact of its inbox; unanswerable ones ask the same kind of
question about a fact of another inbox whose subject never appears in this one.
"""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

from pydantic import ValidationError

from agent_rl.environments.email.inbox.demo_corpus import DemoCorpus, Fact
from agent_rl.records import Split
from agent_rl.environments.email.records import Category, Scenario
from agent_rl.environments.email.scenarios.facts import UNANSWERABLE_KINDS, question_for

IDK_ANSWER = "I don't know"


def _assign_splits(facts: list[Fact], rng: random.Random, test_fraction: float) -> dict[str, Split]:
    """Per category, a `test_fraction` share of facts goes to test; a fact never lands in both."""
    by_category: dict[Category, list[Fact]] = defaultdict(list)
    for fact in facts:
        by_category[fact.category].append(fact)
    splits: dict[str, Split] = {}
    for category in sorted(by_category):
        group = sorted(by_category[category], key=lambda f: f.id)
        rng.shuffle(group)
        n_test = round(len(group) * test_fraction)
        for i, fact in enumerate(group):
            splits[fact.id] = Split.TEST if i < n_test else Split.TRAIN
    return splits


def _query_date(fact: Fact, rng: random.Random):
    return (fact.stated_at + timedelta(days=rng.uniform(1, 21))).replace(microsecond=0)


def generate_scenarios(
    corpus: DemoCorpus, seed: int = 0, test_fraction: float = 0.2, unanswerable_per_inbox: int | None = None
) -> list[Scenario]:
    """One question per fact plus unanswerable ones (by default as many per inbox as the mean answerable category)."""
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction={test_fraction}: must be between 0 and 1")
    if not corpus.facts:
        raise ValueError("the corpus has no facts to ask about")
    rng = random.Random(seed)
    splits = _assign_splits(corpus.facts, rng, test_fraction)
    scenarios = []
    for fact in corpus.facts:
        question, realism = question_for(fact, rng)
        scenarios.append(Scenario(
            id=f"demo-{fact.id}", inbox_id=fact.inbox, question=question, answer=fact.value,
            source_ids=list(fact.source_ids), category=fact.category, split=splits[fact.id],
            query_date=_query_date(fact, rng), realism=realism,
        ))  # fmt: skip
    scenarios.extend(_unanswerable(corpus, rng, splits, unanswerable_per_inbox))
    return scenarios


def _unanswerable(
    corpus: DemoCorpus, rng: random.Random, splits: dict[str, Split], per_inbox: int | None
) -> list[Scenario]:
    answerable_categories = {f.category for f in corpus.facts}
    facts_by_inbox: dict[str, list[Fact]] = defaultdict(list)
    for fact in corpus.facts:
        facts_by_inbox[fact.inbox].append(fact)
    result = []
    for inbox in corpus.inboxes:
        mean_per_category = len(facts_by_inbox[inbox]) / max(1, len(answerable_categories))
        want = per_inbox if per_inbox is not None else round(mean_per_category)
        texts = [f"{e.subject}\n{e.body}".lower() for e in corpus.emails_of(inbox)]
        word_sets = [set(re.findall(r"[a-z0-9]+", t)) for t in texts]
        foreign = [f for f in corpus.facts if f.inbox != inbox and f.kind in UNANSWERABLE_KINDS]
        rng.shuffle(foreign)
        made = 0
        for fact in foreign:
            if made >= want:
                break
            key_words = set(re.findall(r"[a-z0-9]+", fact.key.lower()))
            # Skip subjects this inbox mentions, or nearly so ("Safety offsite" vs "Safety leadership
            # offsite"): a question about them would be ambiguous rather than unanswerable.
            if any(key_words <= words for words in word_sets):
                continue
            question, realism = question_for(fact, rng)
            result.append(Scenario(
                id=f"demo-{fact.id}-absent-{inbox.split('@')[0]}", inbox_id=inbox, question=question,
                answer=IDK_ANSWER, source_ids=[], category=Category.UNANSWERABLE, split=splits[fact.id],
                query_date=_query_date(fact, rng), realism=realism,
            ))  # fmt: skip
            made += 1
    return result


def save_scenarios(scenarios: list[Scenario], path: str | Path) -> Path:
    """Write scenarios as JSON Lines, one per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for scenario in scenarios:
            out.write(scenario.model_dump_json() + "\n")
    return path


def load_scenarios(path: str | Path) -> list[Scenario]:
    """Read scenarios written by `save_scenarios`; a bad line is reported with its number."""
    path = Path(path)
    scenarios = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                scenarios.append(Scenario.model_validate(json.loads(line)))
            except (ValueError, ValidationError) as exc:
                raise ValueError(f"{path}:{number}: not a valid scenario: {exc}") from exc
    return scenarios
