"""Fact-based scenarios: grounded in the corpus, corrected values as golden, split by fact, balanced."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from agent_rl.environments.email.inbox.demo_corpus import generate_demo_corpus
from agent_rl.records import Split
from agent_rl.environments.email.records import Category
from agent_rl.reward.judge import DeterministicJudge, contains_answer, is_idk
from agent_rl.environments.email.scenarios import IDK_ANSWER, generate_scenarios, load_scenarios, save_scenarios
from tests.conftest import ART_E_STYLE_QUESTIONS


@pytest.fixture(scope="module")
def corpus():
    return generate_demo_corpus(seed=0)


@pytest.fixture(scope="module")
def scenarios(corpus):
    return generate_scenarios(corpus, seed=0)


def _fact_id(scenario_id: str) -> str:
    return re.match(r"demo-(fact-\d+)", scenario_id).group(1)


def test_hundreds_of_scenarios_balanced_over_six_categories(scenarios):
    counts = Counter(s.category for s in scenarios)
    assert set(counts) == set(Category)
    assert len(scenarios) >= 300
    assert max(counts.values()) <= 1.5 * min(counts.values())
    assert len({s.id for s in scenarios}) == len(scenarios)


def test_deterministic_for_a_seed(corpus, scenarios):
    assert generate_scenarios(corpus, seed=0) == scenarios
    other = generate_scenarios(corpus, seed=1)
    assert [s.question for s in other] != [s.question for s in scenarios]


def test_answerable_scenarios_cite_emails_of_their_inbox_that_state_the_answer(corpus, scenarios):
    for s in scenarios:
        if not s.answerable:
            continue
        assert s.source_ids
        for source_id in s.source_ids:
            email = corpus.email(source_id)
            assert email.inbox == s.inbox_id
            assert contains_answer(email.body, s.answer), (s.question, s.answer)
            assert s.query_date > email.date


def test_the_source_email_itself_would_be_judged_a_correct_answer_for_short_facts(corpus, scenarios):
    judge = DeterministicJudge()
    for s in scenarios:
        if s.category in (Category.PERSON, Category.LOCATION):
            sentence = corpus.email(s.source_ids[-1]).body.split(" wrote:\n")[0]
            answer_line = next(line for line in sentence.splitlines() if contains_answer(line, s.answer))
            if s.category == Category.LOCATION and " not " in answer_line:
                continue  # "going to Denver instead of Austin" style lines are checked elsewhere
            assert judge.judge(s.question, s.answer, answer_line).correct, (s.answer, answer_line)


def test_corrected_facts_are_asked_with_the_corrected_value(corpus, scenarios):
    facts = {f.id: f for f in corpus.facts}
    corrected = [s for s in scenarios if s.answerable and facts[_fact_id(s.id)].corrected]
    assert len(corrected) >= 40
    for s in corrected:
        fact = facts[_fact_id(s.id)]
        assert s.answer == fact.value != fact.original_value
        assert not DeterministicJudge().judge(s.question, s.answer, fact.original_value).correct


def test_unanswerable_scenarios_ask_about_subjects_absent_from_their_inbox(corpus, scenarios):
    facts = {f.id: f for f in corpus.facts}
    unanswerable = [s for s in scenarios if s.category == Category.UNANSWERABLE]
    assert len(unanswerable) >= 40
    for s in unanswerable:
        assert s.answer == IDK_ANSWER and is_idk(s.answer) and s.source_ids == []
        fact = facts[_fact_id(s.id)]
        assert fact.inbox != s.inbox_id
        inbox_text = "\n".join(e.subject + "\n" + e.body for e in corpus.emails_of(s.inbox_id)).lower()
        assert fact.key.lower() not in inbox_text


def test_train_and_test_never_share_a_fact(scenarios):
    by_split: dict[Split, set[str]] = {Split.TRAIN: set(), Split.TEST: set()}
    for s in scenarios:
        by_split[s.split].add(_fact_id(s.id))
        by_split[s.split].update(s.source_ids)
    assert not by_split[Split.TRAIN] & by_split[Split.TEST]
    test_share = sum(s.split == Split.TEST for s in scenarios) / len(scenarios)
    assert 0.15 <= test_share <= 0.25
    for category in Category:
        assert any(s.split == Split.TEST and s.category == category for s in scenarios)


def test_questions_read_like_art_e_questions(scenarios):
    # Hand-written questions in the ART-E style: their length spread is the yardstick.
    reference = [json.loads(line)["question"] for line in ART_E_STYLE_QUESTIONS.open()]
    lengths = sorted(len(q.split()) for q in reference)
    ours = [len(s.question.split()) for s in scenarios]
    assert lengths[len(lengths) // 10] <= sum(ours) / len(ours) <= lengths[9 * len(lengths) // 10]
    assert all(s.question.endswith("?") and s.question[0].isupper() for s in scenarios)
    # unanswerable ones reuse another inbox's question on purpose; within an inbox none repeats
    assert len({(s.inbox_id, s.question) for s in scenarios}) == len(scenarios)
    templates = {re.sub(r"[A-Z][\w']*(?: [A-Z][\w']*)*", "X", s.question) for s in scenarios}
    assert len(templates) >= 20  # several wordings per category
    assert all(0.0 < s.realism <= 1.0 for s in scenarios)


def test_save_and_load_round_trip(tmp_path, scenarios):
    path = save_scenarios(scenarios, tmp_path / "out" / "scenarios.jsonl")
    assert load_scenarios(path) == scenarios
    path.write_text(path.read_text() + '{"id": "x", "question": 3}\n')
    with pytest.raises(ValueError, match=r"scenarios.jsonl:\d+: not a valid scenario"):
        load_scenarios(path)


def test_bad_test_fraction_is_rejected(corpus):
    with pytest.raises(ValueError, match="test_fraction"):
        generate_scenarios(corpus, test_fraction=1.5)
