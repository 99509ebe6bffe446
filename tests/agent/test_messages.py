"""One set of rules for messages (environments/messages.py), toward the chat template's shape and toward OpenAI's wire
shape, and the callers that once had copies of their own: the gateway, render_prompt, curation's SFT rows and
replay steps, the training rows, the HTTP policy and the runner."""

from __future__ import annotations

import json

import pytest

from agent_rl.agent.chat_format import parse_tool_call, render_prompt
from agent_rl.environments.messages import (
    call_arguments,
    is_malformed,
    policy_calls,
    template_messages,
    text_of,
    training_messages,
    wire_arguments,
    wire_messages,
)
from agent_rl.agent.policy import PolicyTurn, ToolCall
from agent_rl.curation.datasets import conversation, final_answer, sft_rows

TOOLS = [
    {"type": "function", "function": {"name": "lookup_order", "description": "Find an order.", "parameters": {
        "type": "object", "properties": {"order_number": {"type": "string"}}, "required": ["order_number"]}}},
    {"type": "function", "function": {"name": "send_reply", "description": "Answer the customer.", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}, "cite": {"type": "array"}},
        "required": ["text", "cite"]}}},
]


def assistant(*calls, content=None):
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        for call_id, name, arguments in calls]}


# A gateway client's conversation, in OpenAI's wire shape: a developer message, content parts, JSON-text arguments.
WIRE = [
    {"role": "developer", "content": "You are the order desk."},
    {"role": "user", "content": [{"type": "text", "text": "Where is "}, {"type": "image_url", "image_url": {"url": "x"}},
                                 {"type": "text", "text": "W1?"}]},
    assistant(("c1", "lookup_order", '{"order_number": "W1"}')),
    {"role": "tool", "tool_call_id": "c1", "content": "shipped on day 2"},
    assistant(("c2", "send_reply", '{"text": "Shipped on day 2.", "cite": ["W1"]}')),
]


# -- content ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "text"), [
    (None, ""),
    ("plain", "plain"),
    ([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}, "b", {"type": "text", "text": "c"}],
     "abc"),
    ([{"type": "refusal", "refusal": "no"}], ""),
    (42, "42"),
])
def test_content_toward_a_template_is_text(content, text):
    assert text_of(content) == text
    assert template_messages([{"role": "user", "content": content}])[0]["content"] == text


def test_content_on_the_wire_stays_as_given_and_none_with_calls_is_null():
    parts = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "u"}}]
    call = assistant(("c1", "lookup_order", {"order_number": "W1"}))
    wire = wire_messages([{"role": "user", "content": parts}, call, {"role": "user", "content": None}])
    assert wire[0]["content"] == parts and wire[1]["content"] is None and wire[2]["content"] == ""
    assert template_messages([call])[0]["content"] == ""  # toward a template: text, never null


# -- roles -----------------------------------------------------------------------------------------------------------


def test_the_developer_role_is_system_toward_a_template_and_developer_on_the_wire():
    message = {"role": "developer", "content": "Be brief."}
    assert template_messages([message]) == [{"role": "system", "content": "Be brief."}]
    assert wire_messages([message]) == [message]
    assert training_messages([message, {"role": "user", "content": "q"}], "row")[0]["role"] == "system"


def test_a_missing_role_is_user_and_an_unknown_one_is_shown_but_never_trained():
    assert template_messages([{"content": "hi"}])[0]["role"] == "user"
    assert wire_messages([{"content": "hi"}])[0]["role"] == "user"
    odd = {"role": "critic", "content": "meh"}
    assert template_messages([odd]) == [odd]
    for bad in (odd, {"content": "hi"}, "not a message"):
        with pytest.raises(ValueError, match=r"row: messages\[1\] needs a role"):
            training_messages([{"role": "user", "content": "q"}, bad], "row")
    with pytest.raises(ValueError, match="non-empty list"):
        training_messages([], "row")


# -- tool calls and arguments ----------------------------------------------------------------------------------------


def test_dict_and_json_text_arguments_are_the_same_call():
    as_text = assistant(("c1", "lookup_order", '{"order_number": "W1"}'))
    as_object = assistant(("c1", "lookup_order", {"order_number": "W1"}))
    flat = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "lookup_order",
                                                                  "arguments": {"order_number": "W1"}}]}
    expected = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": {"order_number": "W1"}}}]}]
    assert template_messages([as_text]) == template_messages([as_object]) == template_messages([flat]) == expected
    assert wire_messages([as_text])[0]["tool_calls"][0]["function"]["arguments"] == '{"order_number": "W1"}'
    assert wire_messages([as_object])[0]["tool_calls"][0]["function"]["arguments"] == '{"order_number": "W1"}'


@pytest.mark.parametrize("raw", ["", "  ", None])
def test_no_arguments_are_an_empty_object_everywhere(raw):
    call = assistant(("c1", "lookup_order", raw))
    assert call_arguments(raw) == {} and wire_arguments(raw) == "{}"
    assert template_messages([call])[0]["tool_calls"][0]["function"]["arguments"] == {}
    assert wire_messages([call])[0]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert policy_calls(PolicyTurn(tool_calls=[ToolCall("lookup_order", raw)])) == [ToolCall("lookup_order", {})]  # type: ignore[arg-type]
    assert parse_tool_call(json.dumps({"name": "lookup_order", "arguments": raw})).arguments == {}


@pytest.mark.parametrize(("raw", "text"), [
    ('{"order_number": ', '{"order_number": '),  # not JSON
    ("[1, 2]", "[1, 2]"),  # JSON, not an object
    ('"W1"', '"W1"'),
    ([1, 2], "[1, 2]"),  # a value that is not an object: its JSON text
])
def test_malformed_arguments_keep_their_raw_text_and_are_never_an_empty_object(raw, text):
    call = assistant(("c1", "lookup_order", raw))
    assert call_arguments(raw) == text and is_malformed(call_arguments(raw))
    shown = template_messages([{"role": "user", "content": "q"}, call])
    assert shown[1]["tool_calls"][0]["function"]["arguments"] == text  # shown as it was written
    assert wire_messages([call])[0]["tool_calls"][0]["function"]["arguments"] == wire_arguments(raw) == text
    assert conversation([call], TOOLS)[0]["tool_calls"][0]["function"]["arguments"] == text  # a replayed step
    with pytest.raises(ValueError, match=r"row: messages\[1\] has tool-call arguments that are not a JSON object"):
        training_messages([{"role": "user", "content": "q"}, call], "row")
    assert policy_calls(PolicyTurn(tool_calls=[ToolCall("lookup_order", raw)])) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not valid JSON|must be a JSON object"):
        parse_tool_call(json.dumps({"name": "lookup_order", "arguments": raw}))


def test_the_wire_keeps_text_as_written():
    call = assistant(("c1", "send_reply", {"text": "Grüße, Zoë", "cite": []}))
    assert wire_messages([call])[0]["tool_calls"][0]["function"]["arguments"] == '{"text": "Grüße, Zoë", "cite": []}'


def test_tool_results_name_the_tool_they_answer_and_ids_travel():
    shown = template_messages(WIRE)
    assert shown[3] == {"role": "tool", "name": "lookup_order", "content": "shipped on day 2", "tool_call_id": "c1"}
    assert [c["id"] for c in shown[2]["tool_calls"]] == ["c1"]
    without = template_messages(WIRE, ids=False)
    assert without[3] == {"role": "tool", "name": "lookup_order", "content": "shipped on day 2"}
    assert set(without[2]["tool_calls"][0]) == {"type", "function"}
    # a policy's reply goes back out with the ids it was handed (servers reject unmatched tool results)
    wire = wire_messages(shown)
    assert wire[2]["tool_calls"][0]["id"] == wire[3]["tool_call_id"] == "c1"


def test_calls_on_other_roles_and_other_keys_are_not_part_of_the_conversation():
    odd = {"role": "user", "content": "q", "name": "maria", "refusal": None,
           "tool_calls": [{"function": {"name": "x", "arguments": "{}"}}]}
    assert template_messages([odd]) == [{"role": "user", "content": "q"}]


def test_policy_calls_decode_and_refuse_what_is_not_a_call():
    turn = PolicyTurn(tool_calls=[ToolCall("lookup_order", '{"order_number": "W1"}', id="c1")])  # type: ignore[arg-type]
    assert policy_calls(turn) == [ToolCall("lookup_order", {"order_number": "W1"}, id="c1")]
    assert policy_calls(PolicyTurn(tool_calls=["lookup_order"])) is None  # type: ignore[list-item]
    assert policy_calls(PolicyTurn(tool_calls=[ToolCall(3, {})])) is None  # type: ignore[arg-type]
    assert policy_calls(PolicyTurn(tool_calls=None)) is None  # type: ignore[arg-type]


# -- training and serving read a conversation alike --------------------------------------------------------------------


def _episode(messages):
    return {"episode_id": "e1", "environment": "gateway", "outcome": "correct", "reward": 1.0,
            "messages": messages, "tools": TOOLS}


def test_a_gateway_episode_trains_on_what_serving_rendered(tmp_path):
    """Developer messages, content parts and JSON-text arguments: the SFT row renders, token for token, what the
    gateway handed the policy at each turn (before, the row lost the parts' text and kept a role SFT refused)."""
    from transformers import AutoTokenizer

    from agent_rl.agent.models import build_tiny_model
    from agent_rl.train.chat_rows import row_tools
    from agent_rl.train.sft import tokenize_rows

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "tiny"))
    [row] = sft_rows([_episode(WIRE)], min_quality=0.0, tools=[])
    assert row["messages"][0] == {"role": "system", "content": "You are the order desk."}
    assert row["messages"][1]["content"] == "Where is W1?"
    [ids] = tokenize_rows(tokenizer, [row], max_length=100_000).input_ids
    trained = tokenizer.apply_chat_template(training_messages(row["messages"], "row"), tools=row_tools(row["tools"]),
                                            tokenize=False)
    assert ids == tokenizer(trained, add_special_tokens=False)["input_ids"]
    for k in (2, 4):  # each assistant turn: the prompt serving rendered is where the row's turn starts
        served = render_prompt(tokenizer, template_messages(WIRE[:k]), TOOLS)
        assert trained.startswith(served) and "You are the order desk." in served and "Where is W1?" in served
        assert trained[len(served):].startswith("<tool_call>\n" + json.dumps(
            {"name": WIRE[k]["tool_calls"][0]["function"]["name"],
             "arguments": json.loads(WIRE[k]["tool_calls"][0]["function"]["arguments"])}, ensure_ascii=False))


def test_sft_rows_leave_out_an_episode_with_a_malformed_call(caplog):
    bad = [*WIRE[:2], assistant(("c1", "lookup_order", '{"order_number": ')), *WIRE[3:]]
    rows = sft_rows([_episode(WIRE), _episode(bad)], min_quality=0.0, tools=[], max_idk_share=None)
    assert len(rows) == 1 and "left out 1 episode" in caplog.text
    assert final_answer(bad) is None and final_answer([assistant(("c", "return_final_answer", "{oops"))]) == ""


def test_rendering_an_already_normalized_conversation_changes_nothing():
    once = template_messages(WIRE)
    assert template_messages(once) == once
    assert training_messages(once, "row") == once


def test_the_old_module_names_of_the_runner_and_the_message_rules_are_the_moved_modules_warned():
    import importlib
    import sys

    from agent_rl.environments import messages, runner

    for name, moved in (("agent_rl.agent.runner", runner), ("agent_rl.agent.messages", messages)):
        sys.modules.pop(name, None)
        with pytest.warns(DeprecationWarning, match=f"now {moved.__name__}"):
            assert importlib.import_module(name) is moved
