"""The prompt pass in groups of similar length (agent/ragged_prefill.py): same answers as the padded pass and as
each conversation alone, on a batch whose rows bring very different amounts of new text, as an episode batch's
turns do (a short tool error next to a long email body)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from agent_rl.agent import ragged_prefill
from agent_rl.agent.local_policy import LocalPolicy
from agent_rl.agent.models import build_tiny_model
from tests.agent.test_local_policy import TOOLS, varied_tiny_model

BODY = ("From: budget office. The quarterly review moved to Friday at 3pm in the Houston office; the invoice "
        "of the pipeline contractor was approved for the amount in the schedule. ")


def conversation(i: int, repeats: int) -> list[dict]:
    return [{"role": "system", "content": "Answer questions about the inbox."},
            {"role": "user", "content": f"Question {i}: when is the review?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "read_email", "arguments": {"message_id": f"m{i}"}}}]},
            {"role": "tool", "name": "read_email", "content": BODY * repeats}]


MIXED = [conversation(i, r) for i, r in enumerate([0, 12, 1, 10, 0, 6, 12, 2])]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")
    return path, AutoTokenizer.from_pretrained(path)


def test_groups_bound_the_padding_and_cover_every_row_once():
    lengths = [20, 700, 30, 650, 25, 300, 690, 60]
    groups = ragged_prefill.prefill_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert len(groups) > 1
    for group in groups:
        widest = max(lengths[i] for i in group)
        padding = widest * len(group) - sum(lengths[i] for i in group)
        assert padding <= ragged_prefill.MAX_PADDING * widest * len(group)
    computed = sum(max(lengths[i] for i in g) * len(g) for g in groups)
    assert computed < 0.6 * max(lengths) * len(lengths)  # the padded pass computes 5,600 tokens for 2,475 real


def test_a_batch_of_even_lengths_stays_one_pass():
    assert ragged_prefill.prefill_groups([300, 310, 290, 305]) == [[0, 1, 2, 3]]
    assert ragged_prefill.prefill_groups([]) == [[]]


def test_grouped_prompt_pass_answers_like_the_padded_one_and_like_each_alone(tiny, monkeypatch):
    path, tokenizer = tiny
    model = varied_tiny_model(path)
    calls = []
    original = ragged_prefill.grouped_prefill

    def counted(*args, **kwargs):
        calls.append(len(args[7]))
        return original(*args, **kwargs)

    monkeypatch.setattr(ragged_prefill, "grouped_prefill", counted)
    grouped = LocalPolicy.from_model(model, tokenizer, version="v", batch_size=8).act(MIXED, TOOLS, max_new_tokens=16)
    assert calls and calls[0] > 1  # the batch did run in groups
    monkeypatch.setattr(ragged_prefill, "MIN_BATCH_PADDING", 1.0)  # every batch one padded pass
    padded = LocalPolicy.from_model(model, tokenizer, version="v", batch_size=8).act(MIXED, TOOLS, max_new_tokens=16)
    alone = LocalPolicy.from_model(model, tokenizer, version="v", batch_size=1)
    single = [alone.act([c], TOOLS, max_new_tokens=16)[0] for c in MIXED]
    assert len(calls) == 1
    assert [t.as_message() for t in grouped] == [t.as_message() for t in padded] == [t.as_message() for t in single]
    assert len({str(t.as_message()) for t in grouped}) > 1  # outputs differ per prompt: the comparison means something


def test_grouped_cache_is_laid_out_like_the_padded_one(tiny):
    """Every unmasked position of the batch cache holds the same keys as the padded pass left there, so decoding,
    the turn cache and rows leaving the batch work on it unchanged."""
    path, tokenizer = tiny
    model = varied_tiny_model(path).eval()
    policy = LocalPolicy.from_model(model, tokenizer, version="v", batch_size=8, reuse_prefix_cache=False,
                                    turn_cache_tokens=0)
    prompts = [tokenizer(tokenizer.apply_chat_template(c, tools=TOOLS, tokenize=False), add_special_tokens=False)
               ["input_ids"] for c in MIXED]
    batch = policy._batch(prompts, 0, [None] * len(prompts))
    ids, mask, cache = batch["input_ids"], batch["attention_mask"], batch["past_key_values"]
    cached = cache.get_seq_length()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    lengths = ragged_prefill.new_token_lengths(mask, ids.shape[1] - cached)
    groups = ragged_prefill.prefill_groups(lengths)
    assert len(groups) > 1

    def forward(input_ids, attention_mask, position_ids, past_key_values):
        return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     past_key_values=past_key_values, use_cache=True, logits_to_keep=1).logits[:, -1, :]

    with torch.inference_mode():
        logits, grouped = ragged_prefill.grouped_prefill(forward, cache, ids, mask, positions, cached, lengths, groups,
                                                         lambda rows: None, model.config)
        again = policy._batch(prompts, 0, [None] * len(prompts))
        padded_logits = forward(ids[:, cached:], mask, positions[:, cached:], again["past_key_values"])
    torch.testing.assert_close(logits, padded_logits, atol=1e-4, rtol=1e-4)
    real = mask.bool()
    for mine, theirs in zip(grouped.layers, again["past_key_values"].layers):
        assert mine.keys.shape == theirs.keys.shape
        torch.testing.assert_close(mine.keys.transpose(1, 2)[real], theirs.keys.transpose(1, 2)[real],
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(mine.values.transpose(1, 2)[real], theirs.values.transpose(1, 2)[real],
                                   atol=1e-4, rtol=1e-4)
