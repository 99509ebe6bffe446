"""The chat format (render prompts, parse tool calls) and the batched transformers policy, on the tiny model."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent_rl.agent.chat_format import END_MARKERS, parse_completion, render_prompt
from agent_rl.agent.local_policy import LocalPolicy
from agent_rl.environments.messages import template_messages
from agent_rl.agent.models import build_tiny_model
from agent_rl.agent.policy import PolicyTurn

TOOLS = [
    {"type": "function", "function": {"name": "search_emails", "description": "Search the inbox",
                                      "parameters": {"type": "object", "properties": {
                                          "keywords": {"type": "array", "items": {"type": "string"}}}}}},
    {"type": "function", "function": {"name": "read_email", "description": "Read one email",
                                      "parameters": {"type": "object", "properties": {
                                          "message_id": {"type": "string"}}}}},
]
WORDS = "meeting budget invoice contract Houston Friday approved amount schedule".split()
QUESTIONS = [[{"role": "system", "content": "Answer questions about the inbox."},
              {"role": "user", "content": " ".join(WORDS[: i + 1]) + "?"}] for i in range(8)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")
    return path, AutoTokenizer.from_pretrained(path)


def varied_tiny_model(path):
    """The tiny model with larger random weights: its greedy output depends on the prompt (at the standard init
    it prints newlines whatever it is asked), so batched-vs-single comparisons mean something."""
    model = AutoModelForCausalLM.from_pretrained(path)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.15)
    return model


# ------------------------------------------------------------------------------------------------- parsing


def test_parse_a_tool_call():
    turn = parse_completion('<tool_call>\n{"name": "read_email", "arguments": {"message_id": "m-7"}}\n</tool_call>')
    assert turn.parse_error is None and turn.content == ""
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("read_email", {"message_id": "m-7"})]
    assert turn.tool_calls[0].id


def test_parse_text_and_several_calls_and_stop_at_turn_end():
    text = ('Let me look.\n<tool_call>\n{"name": "search_emails", "arguments": {"keywords": ["gas"]}}\n</tool_call>'
            '\n<tool_call>{"name": "read_email", "arguments": "{\\"message_id\\": \\"m-1\\"}"}</tool_call>'
            '<|im_end|>\n<|im_start|>user\n<tool_call>{"name": "ignored", "arguments": {}}</tool_call>')
    turn = parse_completion(text)
    assert turn.content == "Let me look."
    assert [c.name for c in turn.tool_calls] == ["search_emails", "read_email"]
    assert turn.tool_calls[1].arguments == {"message_id": "m-1"}
    assert len({c.id for c in turn.tool_calls}) == 2


def test_plain_answer_has_no_calls_and_no_error():
    turn = parse_completion("The meeting is on Friday.<|im_end|>")
    assert (turn.content, turn.tool_calls, turn.parse_error) == ("The meeting is on Friday.", [], None)


@pytest.mark.parametrize("body, reason", [
    ('{"name": "read_email", "arguments": {"message_id": }', "not valid JSON"),
    ('{"arguments": {"message_id": "m-1"}}', "no 'name'"),
    ('{"name": "", "arguments": {}}', "no 'name'"),
    ('["read_email"]', "JSON object"),
    ('{"name": "read_email", "arguments": [1, 2]}', "'arguments' must be a JSON object"),
    ('{"name": "read_email", "arguments": "{oops"}', "not valid JSON"),
])
def test_malformed_tool_calls_set_a_reason(body, reason):
    turn = parse_completion(f"<tool_call>\n{body}\n</tool_call>")
    assert turn.parse_error and reason in turn.parse_error
    assert turn.tool_calls == []


def test_bad_call_next_to_good_call_keeps_the_good_one():
    turn = parse_completion('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{bad</tool_call>')
    assert [c.name for c in turn.tool_calls] == ["a"] and "not valid JSON" in turn.parse_error


def test_truncated_tool_call_is_a_parse_error():
    turn = parse_completion('Searching.\n<tool_call>\n{"name": "search_emails", "argu')
    assert "unterminated" in turn.parse_error and turn.content == "Searching." and turn.tool_calls == []


FRAGMENTS = st.sampled_from(["<tool_call>", "</tool_call>", "<|im_end|>", "{", "}", '"name"', '"arguments"', ":",
                             ",", "[", "]", '"x"', "null", "\n", " ", "\\", '"', "<|im_start|>", "1e999"])


@given(st.lists(st.one_of(FRAGMENTS, st.text(max_size=8)), max_size=30).map("".join))
@settings(max_examples=300, deadline=None)
def test_parsing_never_raises(text):
    turn = parse_completion(text)
    assert isinstance(turn, PolicyTurn)
    assert all(isinstance(c.arguments, dict) and c.name for c in turn.tool_calls)
    assert turn.parse_error is None or isinstance(turn.parse_error, str)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


@given(name=st.sampled_from(["search_emails", "read_email", "return_final_answer"]),
       arguments=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4),
       content=st.sampled_from(["", "Let me search."]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_what_the_template_renders_for_a_call_parses_back(tiny, name, arguments, content):
    # A generated turn cannot hold an end marker: decoding stops at it (Hypothesis once drew {"": "<|im_end|>"}).
    assume(not any(marker in json.dumps(arguments, ensure_ascii=False) for marker in END_MARKERS))
    _, tokenizer = tiny
    conversation = QUESTIONS[0]
    prompt = render_prompt(tokenizer, conversation, TOOLS)
    assistant = {"role": "assistant", "content": content,
                 "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}
    full = tokenizer.apply_chat_template(conversation + [assistant], tools=TOOLS, tokenize=False)
    assert full.startswith(prompt)
    turn = parse_completion(full[len(prompt):])
    assert turn.parse_error is None
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [(name, arguments)]
    assert turn.content == content


# ------------------------------------------------------------------------------------------------ rendering


def test_generation_prompt_is_a_token_prefix_of_the_training_text(tiny):
    """Training renders `<|im_start|>assistant\\n<tool_call>...`; generation must start from exactly that prefix."""
    _, tokenizer = tiny
    assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "read_email", "arguments": {"message_id": "m-1"}}}]}
    prompt = render_prompt(tokenizer, QUESTIONS[3], TOOLS)
    assert prompt.endswith("<|im_start|>assistant\n")
    full = tokenizer.apply_chat_template(QUESTIONS[3] + [assistant], tools=TOOLS, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    assert full_ids[: len(prompt_ids)] == prompt_ids


def test_openai_style_string_arguments_render_like_objects(tiny):
    _, tokenizer = tiny
    as_object = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_email", "arguments": {"message_id": "m-1"}}}]}
    as_string = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_email", "arguments": '{"message_id": "m-1"}'}}]}
    tool = {"role": "tool", "tool_call_id": "c1", "content": "hello"}
    a = render_prompt(tokenizer, QUESTIONS[0] + [as_object, tool], TOOLS)
    b = render_prompt(tokenizer, QUESTIONS[0] + [as_string, tool], TOOLS)
    assert a == b and '"arguments": {"message_id": "m-1"}' in a
    assert template_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])[0]["content"] == "hi"


# --------------------------------------------------------------------------------------------------- policy


def test_batched_greedy_equals_one_at_a_time(tiny):
    path, tokenizer = tiny
    policy = LocalPolicy.from_model(varied_tiny_model(path), tokenizer, version="varied", batch_size=8)
    batched = policy.act(QUESTIONS, TOOLS, max_new_tokens=24)
    single = [policy.act([conversation], TOOLS, max_new_tokens=24)[0] for conversation in QUESTIONS]
    assert [t.as_message() for t in batched] == [t.as_message() for t in single]
    assert [(t.prompt_tokens, t.completion_tokens) for t in batched] == \
        [(t.prompt_tokens, t.completion_tokens) for t in single]
    assert len({t.content for t in batched}) > 1  # outputs differ per prompt, so the comparison is meaningful
    for conversation, turn in zip(QUESTIONS, batched):
        prompt = render_prompt(tokenizer, conversation, TOOLS)
        assert turn.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert 0 < turn.completion_tokens <= 24


DIFFERENT_SYSTEMS = [[{"role": "system", "content": f"{word} rules apply."}, {"role": "user", "content": "Hi?"}]
                     for word in WORDS[:4]]


@pytest.mark.parametrize("conversations", [QUESTIONS, DIFFERENT_SYSTEMS], ids=["shared-system", "no-shared-prefix"])
def test_outputs_equal_plain_transformers_generate(tiny, conversations):
    """Our decoding loop, the system prompt's attention cache (shared in a batch, kept between calls) and rows
    leaving the batch when they stop give the same greedy text as transformers' generate() on each prompt alone."""
    path, tokenizer = tiny
    model = varied_tiny_model(path)
    policy = LocalPolicy.from_model(model, tokenizer, reuse_prefix_cache=True)
    half = len(conversations) // 2
    first = policy.act(conversations[:half], TOOLS, max_new_tokens=12)
    again = policy.act(conversations[half:], TOOLS, max_new_tokens=12)  # starts from the kept cache, if shared
    for conversation, turn in zip(conversations, first + again):
        ids = tokenizer(render_prompt(tokenizer, conversation, TOOLS), add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        expected = parse_completion(tokenizer.decode(out[0, len(ids):]))
        assert turn.as_message() == expected.as_message()


def test_loads_by_spec_and_batches_in_chunks():
    policy = LocalPolicy("tiny", batch_size=3)
    assert policy.version == "tiny"
    turns = policy.act(QUESTIONS[:5], TOOLS, max_new_tokens=4)
    assert len(turns) == 5 and all(t.completion_tokens == 4 for t in turns)


def test_seeded_sampling_is_reproducible(tiny):
    path, tokenizer = tiny
    model = varied_tiny_model(path)
    runs = [LocalPolicy.from_model(model, tokenizer, temperature=1.0, seed=seed).act(QUESTIONS[:3], TOOLS, 16)
            for seed in (7, 7, 8)]
    texts = [[t.content for t in run] for run in runs]
    assert texts[0] == texts[1] and texts[0] != texts[2]


def test_odd_conversations_become_format_errors_not_exceptions(tiny):
    path, tokenizer = tiny
    policy = LocalPolicy.from_model(AutoModelForCausalLM.from_pretrained(path), tokenizer)
    huge = [{"role": "user", "content": "word " * 5000}]
    odd = [{"role": "user", "content": None}, {"role": "assistant", "content": [{"type": "text", "text": "hm"}]},
           {"role": "user"}]
    turns = policy.act([huge, odd, []], TOOLS, max_new_tokens=3)
    assert "exceeds the context length" in turns[0].parse_error
    assert turns[1].completion_tokens == 3
    assert turns[2].parse_error  # the template cannot render an empty conversation


@pytest.fixture(scope="module")
def memorized_tool_call(tiny, tmp_path_factory):
    """The tiny model trained for a few seconds to answer one question with one tool call, then saved."""
    path, tokenizer = tiny
    target = '<tool_call>\n{"name": "search_emails", "arguments": {"keywords": ["budget"]}}\n</tool_call><|im_end|>'
    prompt = render_prompt(tokenizer, QUESTIONS[1], TOOLS)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    target_ids = tokenizer(target, add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = torch.tensor([prompt_ids + target_ids])
    labels = torch.tensor([[-100] * len(prompt_ids) + target_ids])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(150):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    out = tmp_path_factory.mktemp("models") / "memorized"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, len(target_ids)


def test_generation_stops_at_im_end_and_parses_the_call(memorized_tool_call):
    path, target_tokens = memorized_tool_call
    turn = LocalPolicy(path).act([QUESTIONS[1]], TOOLS, max_new_tokens=64)[0]
    assert turn.parse_error is None and turn.content == ""
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("search_emails", {"keywords": ["budget"]})]
    assert turn.completion_tokens == target_tokens  # stopped right after <|im_end|>, which is counted


def test_peft_adapter_is_applied(memorized_tool_call, tiny, tmp_path):
    from peft import LoraConfig, get_peft_model

    base_path, _ = tiny
    memorized, _ = memorized_tool_call
    # An adapter whose low-rank update is the difference to the memorized model would be overkill; a LoRA with
    # non-zero weights on the memorized model must change what it says.
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(memorized),
                           LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj", "o_proj"],
                                      init_lora_weights=False))
    model.save_pretrained(tmp_path / "adapter")
    plain = LocalPolicy(memorized).act([QUESTIONS[1]], TOOLS, max_new_tokens=40)[0]
    adapted_policy = LocalPolicy(memorized, adapter=tmp_path / "adapter")
    adapted = adapted_policy.act([QUESTIONS[1]], TOOLS, max_new_tokens=40)[0]
    assert adapted_policy.version == "memorized+adapter"
    assert adapted.as_message() != plain.as_message()
    with pytest.raises(ValueError, match="adapter_config.json"):
        LocalPolicy(base_path, adapter=tmp_path)
