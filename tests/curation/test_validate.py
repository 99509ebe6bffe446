import copy
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_rl.curation.validate import (
    GateConfig,
    ValidationResult,
    conversation_errors,
    evaluate_gates,
    config_for,
    validate_episodes,
)
from agent_rl.environments.email.environment import EmailEnvironment

EMAIL_CHECKS = config_for([EmailEnvironment()])


def _prefixes(reasons):
    return {r.split(":", 1)[0] if not r.startswith(("type:", "json:")) else ":".join(r.split(":", 2)[:2])
            for r in reasons}


def test_heuristic_episodes_are_clean_and_normalized(demo_env):
    rows = copy.deepcopy(demo_env.episodes)
    rows[0]["messages"] = json.dumps(rows[0]["messages"])  # exports may carry messages as JSON text
    result = validate_episodes(rows, EMAIL_CHECKS)
    assert result.quarantined == []
    assert len(result.clean) == len(rows)
    assert isinstance(result.clean[0]["messages"], list)
    assert result.report["count_in"] == len(rows) == result.report["clean"]


def _bad_corpus(good):
    def variant(**changes):
        row = copy.deepcopy(good)
        row["episode_id"] = f"bad-{len(bad)}"
        row.update(changes)
        return row

    bad = []
    bad.append(("malformed messages JSON", variant(messages='[{"role": "user", "content": '), {"json:messages"}))
    missing = variant()
    del missing["question"], missing["outcome"]
    bad.append(("missing fields", missing, {"type:question", "type:outcome"}))
    bad.append(("wrong types", variant(turns="three", reward="high", citations="a,b"),
                {"type:turns", "type:reward", "type:citations"}))
    huge = copy.deepcopy(good["messages"])
    huge[-1] = {**huge[-1], "content": "x" * 1_500_000}
    bad.append(("megabyte message", variant(messages=huge), {"message_size", "conversation_size"}))
    bad.append(("lone surrogate", variant(question="When is the \ud83d meeting?"), {"unicode"}))
    bad.append(("NUL byte", variant(final_answer="Tulsa\x00"), {"unicode"}))
    unknown_tool = copy.deepcopy(good["messages"])
    unknown_tool[3]["tool_calls"][0]["function"]["name"] = "delete_inbox"
    bad.append(("unknown tool", variant(messages=unknown_tool), {"conversation"}))
    no_result = [m for m in good["messages"] if m["role"] != "tool"]
    bad.append(("tool call without result", variant(messages=no_result), {"conversation"}))
    bad.append(("reward out of bounds", variant(reward=7.5), {"reward_range"}))
    bad.append(("unknown category", variant(task_category="astrology"), {"category"}))
    bad.append(("empty correct answer", variant(outcome="correct", final_answer=""), {"empty_correct_answer"}))
    bad.append(("turns out of range", variant(turns=10_000, prompt_tokens=-5), {"turns_range", "prompt_tokens_range"}))
    bad.append(("not an object", "{this is not json", {"row"}))
    bad.append(("a list", [1, 2, 3], {"row"}))
    bad.append(("None", None, {"row"}))
    return bad


def test_bad_corpus_ends_in_quarantine_with_every_reason(demo_env):
    good = next(e for e in demo_env.episodes if e["outcome"] == "correct")
    bad = _bad_corpus(good)
    rows = [copy.deepcopy(good)] + [row for _, row, _ in bad]
    result = validate_episodes(rows, EMAIL_CHECKS)
    assert len(result.clean) + len(result.quarantined) == len(rows)
    assert len(result.clean) == 1
    by_payload = {id(raw): reasons for raw, reasons in result.quarantined}
    for name, row, expected in bad:
        reasons = by_payload[id(row)]
        assert expected <= _prefixes(reasons), f"{name}: {reasons}"
    assert result.report["quarantined"] == len(bad)


def test_duplicates_keep_the_first_occurrence(demo_env):
    rows = copy.deepcopy(demo_env.episodes[:3]) + copy.deepcopy(demo_env.episodes[:1])
    result = validate_episodes(rows, EMAIL_CHECKS)
    assert len(result.clean) == 3
    (raw, reasons), = result.quarantined
    assert raw["episode_id"] == rows[0]["episode_id"]
    assert reasons == ["duplicate: duplicate episode_id (first seen at row 0)"]


def test_conversation_rules():
    config = EMAIL_CHECKS
    opening = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_email", "arguments": '{"message_id": "m"}'}}]}
    assert conversation_errors(opening + [call, {"role": "tool", "tool_call_id": "c1", "content": "{}"}], config) == []
    assert any("opens with" in e for e in conversation_errors([call], config))
    assert any("without a pending" in e for e in conversation_errors(opening + [{"role": "tool", "content": "x"}], config))
    bad_args = copy.deepcopy(call)
    bad_args["tool_calls"][0]["function"]["arguments"] = "{not json"
    assert any("malformed JSON" in e for e in conversation_errors(opening + [bad_args], config))


def test_gates_name_what_is_missing(demo_env):
    result = validate_episodes(copy.deepcopy(demo_env.episodes), EMAIL_CHECKS)
    gates = {g.name: g for g in evaluate_gates(result, GateConfig())}
    assert not gates["volume"].passed and f"{len(result.clean)} clean" in gates["volume"].message
    assert gates["clean_ratio"].passed
    assert gates["diversity"].observed == len({e["task_category"] for e in demo_env.episodes})
    relaxed = evaluate_gates(result, GateConfig(min_points=10, min_categories=5))
    assert all(g.passed for g in relaxed)
    empty = {g.name: g for g in evaluate_gates(ValidationResult([], [], {"count_in": 0}), GateConfig(min_points=0))}
    assert not empty["clean_ratio"].passed


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(junk | st.fixed_dictionaries({"episode_id": st.text(max_size=5), "messages": junk,
                                              "turns": junk, "reward": junk}), max_size=6))
def test_arbitrary_rows_never_crash_and_nothing_is_lost(rows):
    result = validate_episodes(rows, EMAIL_CHECKS)
    assert len(result.clean) + len(result.quarantined) == len(rows)
    assert all(reasons for _, reasons in result.quarantined)
