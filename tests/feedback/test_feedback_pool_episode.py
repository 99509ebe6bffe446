"""Signals read from an episode as the pool really stores it: a gateway `LiveEpisode` recorded the way the gateway
records it, written with `PoolRepository.insert_episodes`, rated with `record_feedback`, read back with `get` and
the weekly export (and as the export's JSON rows), in a temporary SQLite pool."""

from __future__ import annotations

import json

from agent_rl.arbiter.gateway.sessions import LiveEpisode
from agent_rl.simulated_users.population import PopulationConfig, simulate
from agent_rl.feedback.signals import episode_signals
from agent_rl.pool import PoolRepository

TOOLS = [{"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "respond", "parameters": {"type": "object"}}}]


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


def _live_episode() -> LiveEpisode:
    """What the gateway holds after three calls of a client whose final tool is `respond` (gateway._append)."""
    episode = LiveEpisode(episode_id="ep-live-1", tenant="acme", context="gateway", task="Where is my order 123?",
                          version="v1", spec="heuristic", session=None, final_tool="respond", tools=TOOLS)
    episode.messages = [
        {"role": "system", "content": "You are a shop's support assistant."},
        {"role": "user", "content": "Where is my order 123?"},
        _call("c1", "lookup_order", '{"order_id": "132"}'),
        {"role": "tool", "tool_call_id": "c1", "content": '{"error": "no such order"}'},
        {"role": "assistant", "content": "I couldn't find order 132."},
        {"role": "user", "content": "No, I meant order 123. Where is my order 123?"},
        _call("c2", "lookup_order", '{"order_id": "123"}'),
        {"role": "tool", "tool_call_id": "c2", "content": '{"status": "shipped"}'},
        _call("c3", "respond", '{"answer": "Order 123 has shipped."}'),
    ]
    episode.calls = 4
    return episode


def test_signals_of_a_stored_rated_gateway_episode(sqlite_url):
    pool = PoolRepository(sqlite_url)
    try:
        record = _live_episode().record()
        assert pool.insert_episodes([record]) == 1
        pool.record_feedback("ep-live-1", "down", tenant="acme")
        stored = pool.get("ep-live-1")
        exported = pool.export().episodes
    finally:
        pool.close()
    assert stored is not None and stored.final_answer == '{"answer": "Order 123 has shipped."}'
    s = episode_signals(stored)
    assert s.episode_id == "ep-live-1" and s.rating == -1.0
    assert (s.user_turns, s.assistant_turns, s.tool_calls, s.tool_errors) == (2, 4, 3, 1)
    assert s.corrections == 1 and s.reasks == 1 and s.agent_gave_up == 1
    assert not s.abandoned  # the final tool's call is the answer: the gateway stored its arguments as final_answer
    # The weekly export, and its JSON rows (pool_episodes/<week>/episodes.jsonl), read the same.
    assert episode_signals(exported[0]) == s
    assert episode_signals(json.loads(json.dumps(exported[0].model_dump(mode="json")))) == s


def test_simulated_episodes_store_and_read_back_unchanged(sqlite_url):
    week = simulate(PopulationConfig(n_episodes=60, rated_share=0.5, seed=3))
    pool = PoolRepository(sqlite_url)
    try:
        assert pool.insert_episodes([e.episode for e in week]) == 60
        stored = {e.episode_id: e for e in pool.export(limit=100).episodes}
    finally:
        pool.close()
    for simulated in week:
        assert episode_signals(stored[simulated.episode.episode_id]) == episode_signals(simulated.episode)
