"""Earlier turns' attention caches: a conversation's next turn computes only its new tokens, and says exactly
what it would have said without the cache."""

from __future__ import annotations

import pytest
import torch

from agent_rl.agent.local_policy import LocalPolicy
from agent_rl.agent.turn_cache import TurnCache
from tests.agent.test_local_policy import QUESTIONS, TOOLS, tiny, varied_tiny_model  # noqa: F401


def _layers(n: int, value: float = 0.0):
    return [(torch.full((1, 1, n, 2), value), torch.full((1, 1, n, 2), value))]


def test_lookup_finds_the_longest_common_prefix_and_always_leaves_a_token_to_feed():
    cache = TurnCache(max_tokens=100)
    cache.add([1, 2, 3, 4], _layers(4), prompt_length=2)
    cache.add([1, 2, 9], _layers(3), prompt_length=2)
    assert cache.lookup([1, 2, 3, 4, 5, 6])[0] == 4
    assert cache.lookup([1, 2, 3, 7])[0] == 3  # a partial match is still a valid cache (causal attention)
    assert cache.lookup([1, 2, 3, 4])[0] == 3  # the whole prompt cached: its last token is fed again
    assert cache.lookup([5, 6]) == (0, None)


def test_the_previous_turn_is_superseded_a_shared_system_prompt_is_not_and_lru_goes_over_budget():
    cache = TurnCache(max_tokens=12)
    cache.add([1, 2, 3, 4], _layers(4), prompt_length=3)  # conversation A: system [1, 2], question 3, reply 4
    other = cache.lookup([1, 2, 8, 9])  # conversation B shares only the system prompt with A
    assert other[0] == 2
    cache.add([1, 2, 8, 9, 5], _layers(5), prompt_length=4, resumed=other)
    assert len(cache) == 2  # A's entry stays: B did not continue A
    resumed = cache.lookup([1, 2, 3, 4, 6, 7])  # A's next turn
    assert resumed[0] == 4
    cache.add([1, 2, 3, 4, 6, 7], _layers(6), prompt_length=6, resumed=resumed)
    assert len(cache) == 2 and cache.tokens == 11  # A's previous turn is gone
    cache.lookup([1, 2, 3, 4, 6, 7, 1])  # touch A: B is now the least recently used
    cache.add([5, 5, 5], _layers(3), prompt_length=3)
    assert cache.tokens <= 12 and cache.stats.evicted == 1
    assert cache.lookup([1, 2, 8, 9, 5, 1])[0] == 2  # B's own entry was evicted (only A's system part matches)
    assert TurnCache(0).enabled is False


def _second_turns(conversations, turns):
    """Each conversation continued by its own answer, a tool result and a user nudge, as the runner does."""
    out = []
    for i, (conversation, turn) in enumerate(zip(conversations, turns)):
        reply = {"role": "assistant", "content": turn.content or "(nothing)"}
        result = {"role": "tool", "name": "search_emails", "content": f"result {i}: " + "budget " * (3 * i + 1)}
        out.append([*conversation, reply, result])
    return out


@pytest.mark.parametrize("budget", [12, 3], ids=["until-stop-or-budget", "cut-by-the-budget"])
def test_later_turns_resume_their_own_cache_and_say_the_same(tiny, budget):  # noqa: F811
    path, tokenizer = tiny
    model = varied_tiny_model(path).to(torch.float32)
    cached = LocalPolicy.from_model(model, tokenizer, version="cached", turn_cache_tokens=100_000, batch_size=4)
    plain = LocalPolicy.from_model(model, tokenizer, version="plain", turn_cache_tokens=0, batch_size=4)
    conversations = QUESTIONS
    for _ in range(3):  # three turns, rows of different lengths, two batches per turn
        with_cache = cached.act(conversations, TOOLS, max_new_tokens=budget)
        without = plain.act(conversations, TOOLS, max_new_tokens=budget)
        assert [t.as_message() for t in with_cache] == [t.as_message() for t in without]
        assert [(t.prompt_tokens, t.completion_tokens) for t in with_cache] == \
            [(t.prompt_tokens, t.completion_tokens) for t in without]
        conversations = _second_turns(conversations, with_cache)
    assert len({t.content for t in with_cache}) > 1  # outputs differ per row, so equality means something
    stats = cached.turn_cache.stats
    assert stats.hits >= 2 * len(QUESTIONS)  # turns 2 and 3 of every conversation resumed from a cache
    assert stats.reused_tokens > 2 * sum(len(c) for c in QUESTIONS) * 10
    assert len(cached.turn_cache) <= len(QUESTIONS) + 1  # superseded entries are gone: one per conversation


def test_generated_ids_are_reused_when_the_next_prompt_extends_them(tiny):  # noqa: F811
    """A trainer's tool loop appends the sampled ids themselves: the next turn resumes after the completion."""
    path, tokenizer = tiny
    model = varied_tiny_model(path).to(torch.float32)
    cached = LocalPolicy.from_model(model, tokenizer, turn_cache_tokens=100_000)
    plain = LocalPolicy.from_model(model, tokenizer, turn_cache_tokens=0)
    prompts = [tokenizer(f"question {i}: " + "word " * i, add_special_tokens=False)["input_ids"] for i in range(5)]
    first = cached.generate_ids(prompts, 10)
    assert first == plain.generate_ids(prompts, 10)
    tool = tokenizer(" tool says ok", add_special_tokens=False)["input_ids"]
    follow = [p + c + tool * (1 + i % 2) for i, (p, c) in enumerate(zip(prompts, first))]
    follow.append(prompts[0][:3] + tool)  # a batch mate with no cache of its own
    reused_before = cached.turn_cache.stats.reused_tokens
    assert cached.generate_ids(follow, 10) == plain.generate_ids(follow, 10)
    reused = cached.turn_cache.stats.reused_tokens - reused_before
    assert reused >= sum(len(p) + len(c) - 1 for p, c in zip(prompts, first))
    cached.clear_prefix_cache()
    assert len(cached.turn_cache) == 0


def test_models_in_training_get_no_turn_cache_unless_asked(tiny):  # noqa: F811
    path, tokenizer = tiny
    model = varied_tiny_model(path)
    assert LocalPolicy.from_model(model, tokenizer).turn_cache.enabled is False
