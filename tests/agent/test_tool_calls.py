"""One reader of tool calls in conversations: both layouts (OpenAI's nested "function", TRL's flat call) and
arguments as objects or JSON text are read alike by the runner, curation, the hacking detectors and training."""

import pytest

from agent_rl.agent.tool_calls import MalformedArguments, call_function, call_name, decode_arguments
from agent_rl.environments.email.tools import TOOL_NAMES
from agent_rl.curation.datasets import final_answer

from agent_rl.reward.hacking import tool_calls

NESTED = {"id": "c1", "type": "function", "function": {"name": "read_email", "arguments": '{"message_id": "m-1"}'}}
FLAT = {"name": "read_email", "arguments": {"message_id": "m-1"}}


def test_both_layouts_name_the_same_call():
    assert call_name(NESTED) == call_name(FLAT) == "read_email"
    assert decode_arguments(call_function(NESTED)["arguments"]) == decode_arguments(call_function(FLAT)["arguments"])


@pytest.mark.parametrize("call", ["read_email", None, 3, {"function": "read_email"}])
def test_a_call_that_is_not_an_object_has_no_function_and_no_name(call):
    assert call_function(call) is None and call_name(call) == ""


def test_arguments_that_are_not_an_object_say_what_they_are():
    with pytest.raises(MalformedArguments, match="malformed JSON"):
        decode_arguments('{"message_id": ')
    with pytest.raises(ValueError, match="list, not an object"):
        decode_arguments("[1]")
    with pytest.raises(ValueError, match="str, not an object"):
        decode_arguments('"text"')


@pytest.mark.parametrize("raw", [None, "", "  \n"])
def test_no_arguments_are_an_empty_object(raw):
    """None and blank text are a call without arguments (OpenAI-style servers send "" for one), for the runner,
    the validation suite and the hacking detectors alike."""
    assert decode_arguments(raw) == {}


def test_readers_agree_on_a_conversation():
    answer = {"type": "function", "function": {"name": "return_final_answer",
                                               "arguments": '{"answer": "Tuesday", "sources": ["m-1"]}'}}
    messages = [{"role": "user", "content": "When?"},
                {"role": "assistant", "content": "", "tool_calls": [NESTED]},
                {"role": "tool", "name": "read_email", "content": "{}"},
                {"role": "assistant", "content": "", "tool_calls": [answer]}]
    calls = tool_calls(messages)
    assert [(c.name, c.arguments) for c in calls] == [("read_email", {"message_id": "m-1"}),
                                                        ("return_final_answer",
                                                         {"answer": "Tuesday", "sources": ["m-1"]})]
    assert final_answer(messages) == "Tuesday"
    # unreadable arguments: the detectors keep the text, the final answer is empty
    bad = {"role": "assistant", "tool_calls": [{"name": "return_final_answer", "arguments": "{oops"}]}
    assert tool_calls([bad])[0].arguments == {"_raw": "{oops"}
    assert final_answer([bad]) == ""


def test_validation_knows_the_agents_tools():
    from agent_rl.curation.validate import config_for
    from agent_rl.environments.email.environment import EmailEnvironment

    assert config_for([EmailEnvironment()]).tools == TOOL_NAMES
