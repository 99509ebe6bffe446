"""Simulated users driving an outside agent on the official `openai` client through a live arbiter's gateway: what
the pool records matches what the users did (thanks, re-asks and corrections, leaving mid-work, silent leaving),
ratings arrive through /v1/feedback, follow-up questions on another topic of the same mailbox are answered in the
same episode and read as follow-ups rather than re-asks, and the agent only ever gets tool calls it declared."""

from __future__ import annotations

import time

import pytest
from openai import OpenAI

from agent_rl.environments.email.tools import call_tool, make_tools, tool_schemas
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.simulated_users.outside_agent import ToolLoopAgent
from agent_rl.simulated_users.population import DEFAULT_NOISE
from agent_rl.feedback.signals import SignalConfig, content_words, episode_signals, similarity
from agent_rl.simulated_users.users import Grounding, Question, UsersConfig, run_users
from agent_rl.reward.judge import DeterministicJudge
from examples.outside_agent import follow_up_candidates
from tests.arbiter import arbiter_fixtures
from tests.arbiter.arbiter_fixtures import api_key

demo_world = arbiter_fixtures.demo_world  # pytest fixtures: a live arbiter on the demo world
start_arbiter = arbiter_fixtures.start_arbiter

APP_TOKEN = "mail-app-key-0f3c9e"


def _wait_written(pool, ids, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stored = {i: pool.get(i) for i in ids}
        if all(stored.values()):
            return stored
        time.sleep(0.2)
    raise AssertionError(f"episodes not written: {[i for i, e in stored.items() if e is None]}")


def test_users_drive_the_outside_agent_through_the_gateway(start_arbiter, demo_world):
    keys = (api_key(), api_key(token=APP_TOKEN, key_id="mail-app", tenant="mailpal", replay=False))
    train = [s for s in demo_world.scenarios if s.split.value == "train"][:40]
    judge = DeterministicJudge()
    questions = [Question(s.question, (lambda s: lambda a: judge.judge(s.question, s.answer, a).correct)(s), "demo")
                 for s in train]
    candidates = follow_up_candidates(train)  # the same mailbox, another category

    def follow_up(index, question):
        others = candidates[index % len(train)]
        return questions[others[index % len(others)]] if others else None
    store = open_inbox_store(demo_world.inbox_url)
    # Noisy on purpose so that every behaviour shows up in a few users: many re-asks and people leaving mid-work.
    config = UsersConfig(noise=DEFAULT_NOISE, grounding=Grounding(leave_scale=1.0), rated_share=0.5, seed=3)
    with start_arbiter(default_routing={"heuristic": 1.0}, api_keys=keys, gateway_rate_per_s=1000) as live:
        client = OpenAI(base_url=f"{live.url}/v1", api_key=APP_TOKEN, max_retries=0)
        agent = ToolLoopAgent(client, tool_schemas(), metadata={"context": "mail-app"}, max_tokens=128)

        def opening(index, question):
            s = train[index % len(train)]
            return [{"role": "system", "content": f"Answer about the mailbox {s.inbox_id}."},
                    {"role": "user", "content": s.question}]

        def backend(index, question):
            s = train[index % len(train)]
            tools = make_tools(store, s.inbox_id, s.query_date)
            return lambda name, arguments: call_tool(tools, name, arguments)

        try:
            week = run_users(agent, questions, opening, backend, config, n=40, concurrency=4, follow_ups=follow_up)
        finally:
            agent.close_http()
            client.close()
        outcomes = week.outcomes
        assert all(o.error is None for o in outcomes), [o.error for o in outcomes if o.error]
        stored = _wait_written(live.pool, [o.episode_id for o in outcomes])
    store.close()

    summary = week.summary()
    assert summary["conversations"] == 40 and summary["per_version"].keys() == {"heuristic"}
    seen, follow_ups = set(), []
    for o in outcomes:
        episode = stored[o.episode_id]
        assert episode.tenant == "mailpal" and episode.environment == "gateway" and episode.context == "mail-app"
        assert episode.task_category == "demo"
        signals = episode_signals(episode)
        last = o.reactions[-1]
        seen.add(last)
        if o.left_while_working:
            assert signals.abandoned and not o.satisfied and not o.answered
        else:  # answered, and closed on the final tool: the gateway stored its arguments as the answer
            assert not signals.abandoned and episode.final_answer
        if last == "thank":
            assert signals.thanks >= 1
        if last == "complain":
            assert signals.complaints >= 1
        if {"reask", "correct"} & set(o.reactions):
            assert signals.user_turns >= 2 and signals.reasks + signals.corrections >= 1
        if o.rated:
            assert episode.feedback == o.rated and signals.rating == (1.0 if o.rated == "up" else -1.0)
        else:
            assert episode.feedback is None
        if o.satisfied:
            assert o.answered
        if "follow_up" in o.reactions:  # asked in the same episode, after the first answer
            assert signals.user_turns >= 2 and o.reactions.index("follow_up") >= 1
            asked = [m["content"].lower() for m in episode.messages if m["role"] == "user"]
            overlap = similarity(content_words(asked[0]), content_words(asked[o.reactions.index("follow_up")]))
            follow_ups.append((signals, {"reask", "correct"} & set(o.reactions), overlap))
    assert {"thank", "silent"} <= seen, seen
    assert len(follow_ups) >= 3
    # A follow-up reads as one when its question shares few words with the first (signals.py: between
    # follow_up_similarity and reask_similarity a turn is neither, as "When is Monica moving to the Phoenix office?"
    # then "Which office is Ethan's team moving to?").
    distinct = [s for s, _, overlap in follow_ups if overlap < SignalConfig().follow_up_similarity]
    assert len(distinct) >= 3 and all(s.follow_ups == 1 for s in distinct)
    assert all(s.reasks == 0 and s.corrections == 0 for s, restated, _ in follow_ups if not restated)
    assert sum(o.rated is not None for o in outcomes) > 5


def test_users_config_states_its_rates_and_refuses_bad_ones():
    described = UsersConfig().describe()
    assert described["satisfied_if_right"] == 0.92 and described["rated_share"] == 0.05
    assert described["leave_per_tool_round"]["unhappy"] > described["leave_per_tool_round"]["satisfied"]
    with pytest.raises(ValueError, match="rated_share"):
        UsersConfig(rated_share=1.5)
    with pytest.raises(ValueError, match="satisfied_if_wrong"):
        Grounding(satisfied_if_wrong=-0.1)
    with pytest.raises(ValueError, match="final tool"):
        ToolLoopAgent(OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x"), tool_schemas(), final_tool="nope")
