"""A week with one hostile episode among good ones: the good ones are anonymized, the hostile one quarantined with
its reason, and nothing in curation's walk can crash on what somehow got into the pool.

Before: a tool result holding JSON a few hundred levels deep crashed the week's anonymization (RecursionError),
so no tenant's traffic trained that week, and one large episode stalled the privacy pass for hours.
"""

from __future__ import annotations

import json
from typing import Any

from agent_rl.privacy.anonymize import Anonymizer, AnonymizerConfig, Directory, episode_texts
from agent_rl.privacy.leak_check import LeakAuditor
from agent_rl.curation.live import judge_by_feedback, live_validation_config
from agent_rl.curation.plugin_privacy import anonymize_plugin_partition
from agent_rl.curation.validate import DEFAULT_EPISODE_CHARS, DEFAULT_EPISODE_DEPTH, ValidationConfig, validate_episodes
from agent_rl.pool import PoolRepository
from tests.curation.test_live import live_episode

PERSON, ADDRESS = "Marguerite Szymanski", "marguerite.szymanski@northwind-energy.com"
BUDGET = 20_000
WEEK = "2026-11-16"


def nested(levels: int, leaf: Any = "x") -> Any:
    value = leaf
    for _ in range(levels):
        value = {"k": value}
    return value


def good(i: int) -> dict[str, Any]:
    row = live_episode(i, "up")
    row["messages"][3]["content"] = json.dumps({"owner": PERSON, "email": ADDRESS, "value": i})
    row["messages"][4]["content"] = f"{PERSON} owns value {i}; write to {ADDRESS}."
    return judge_by_feedback(row)


def hostile() -> dict[str, dict[str, Any]]:
    """One episode of each kind that used to break the week, by id."""
    deep_result = live_episode(100, "up")
    deep_result["messages"][3]["content"] = json.dumps(nested(400, PERSON))  # a tool result 400 levels deep
    past_the_parser = live_episode(101, "up")
    past_the_parser["messages"][2]["tool_calls"][0]["function"]["arguments"] = "[" * 5_000 + "]" * 5_000
    deep_schema = live_episode(102, "up")
    deep_schema["tools"] = [{"type": "function", "function": {"name": "lookup", "parameters": nested(130)}}]
    too_large = live_episode(103, "up")
    too_large["messages"][4]["content"] = f"{PERSON} wrote: " + "the quarterly figures are in. " * 1_000
    return {row["episode_id"]: judge_by_feedback(row) for row in (deep_result, past_the_parser, deep_schema, too_large)}


def test_a_hostile_episode_is_quarantined_with_its_reason_and_the_good_ones_are_anonymized(sqlite_url):
    goods, bad = [good(i) for i in range(4)], hostile()
    rows = goods[:2] + list(bad.values()) + goods[2:]
    result = validate_episodes(rows, live_validation_config(rows, max_episode_chars=BUDGET))

    assert [row["episode_id"] for row in result.clean] == [row["episode_id"] for row in goods]
    reasons = {row["episode_id"]: why for row, why in result.quarantined}
    assert set(reasons) == set(bad)
    limit = DEFAULT_EPISODE_DEPTH
    assert reasons["ep-100"] == [f"depth: messages[3].content is nested more than {limit} levels deep"]
    assert reasons["ep-101"] == [f"depth: messages[2].tool_calls[0].function.arguments is nested more than {limit} "
                                 "levels deep"]
    assert reasons["ep-102"] == [f"depth: tools[0].function.parameters is nested more than {limit} levels deep"]
    chars = sum(len(text) for text in episode_texts(bad["ep-103"]))
    assert reasons["ep-103"] == [f"episode too large: {chars} characters > {BUDGET}"]
    assert result.report["reasons"] == {"depth": 3, "episode too large": 1}

    # What the validated_episodes asset does with them: the pool's quarantine keeps each with its reason.
    pool = PoolRepository(sqlite_url)
    try:
        assert pool.quarantine(result.quarantined, partition=WEEK) == 4
        assert {row.episode_id: row.reasons for row in pool.quarantined(WEEK)} == reasons
    finally:
        pool.close()

    # The anonymization of the week: the good episodes, with no original value left.
    anonymized = anonymize_plugin_partition(None, result.clean, [])
    assert [row["episode_id"] for row in anonymized.episodes] == [row["episode_id"] for row in goods]
    written = json.dumps(anonymized.episodes)
    assert PERSON.split()[1] not in written and ADDRESS not in written
    assert anonymized.report["leaks"] == 0


def test_the_episode_budget_is_generous_by_default_and_configurable():
    assert ValidationConfig(categories=(), tools=(), environments=()).max_episode_chars == DEFAULT_EPISODE_CHARS
    assert DEFAULT_EPISODE_CHARS == 1_000_000
    row = good(7)
    within = validate_episodes([row], live_validation_config([row]))
    assert [r["episode_id"] for r in within.clean] == ["ep-7"]
    tight = validate_episodes([row], live_validation_config([row], max_episode_chars=100))
    assert tight.quarantined[0][1][0].startswith("episode too large: ")


def test_what_got_in_deeper_than_the_interpreter_stack_is_walked_not_crashed():
    """Rows older than the limits, or from another ingest path: the anonymizer and the auditor walk them
    without recursion, and the name at the bottom is still replaced and still found."""
    directory = Directory()
    directory.add_name(PERSON)
    directory.add_address(PERSON, ADDRESS)
    anonymizer = Anonymizer(AnonymizerConfig(ner=False, name_finder=False), directory)
    deep = nested(5_000, f"call {PERSON}")
    deep_text = '{"k":' * 5_000 + json.dumps(f"call {PERSON}") + "}" * 5_000  # json.dumps would hit the limit itself
    episode = {"episode_id": "old-row", "question": "q", "messages": [
        {"role": "user", "content": "hi"}, [deep], {"role": "tool", "tool_call_id": "c", "content": deep_text}]}

    out = anonymizer.anonymize_episode(episode)
    bottom = out["messages"][1][0]
    for _ in range(5_000):
        bottom = bottom["k"]
    assert bottom.startswith("call ") and PERSON.split()[1] not in bottom
    text = out["messages"][2]["content"]  # past the JSON parser's limit: anonymized as text, its layout kept
    assert text.count('{"k":') == 5_000 and "call " in text and PERSON.split()[1] not in text

    auditor = LeakAuditor(b"salt")
    auditor.add_literals([PERSON])
    findings = auditor.scan("episodes.jsonl", "line 1", episode)
    assert {finding.kind for finding in findings} == {"canary"}
    assert len(findings) == 2  # the structure and the JSON text, each read to the bottom
    assert sum(PERSON in text for text in episode_texts(episode)) == 2


def test_findings_name_the_field_they_sit_in_whatever_came_before():
    """The auditor's walk keeps each part's own path (a list's items were once named after the last field read)."""
    auditor = LeakAuditor(b"salt")
    auditor.add_literals([PERSON])
    record = {"messages": [{"role": "tool", "content": json.dumps({"rows": [["a"], ["b"]]})},
                           {"role": "assistant", "content": f"Ask {PERSON}."}],
              "tags": ["x", PERSON]}
    fields = sorted(finding.field for finding in auditor.scan("episodes.jsonl", "line 1", record))
    assert fields == ["messages[1].content", "tags[1]"]
