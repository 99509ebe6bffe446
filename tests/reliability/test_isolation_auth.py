"""Isolation and auth: no tool call reaches another inbox's emails (on both store backends, and through the
runner with a hostile policy); routing changes need the admin token; the token never reaches a log."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_rl.agent.policy import Policy, PolicyTurn, ToolCall
from agent_rl.environments.runner import RunnerConfig
from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
from agent_rl.environments.email.tools import call_tool, is_no_results, make_tools
from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
from agent_rl.environments.email.inbox.store import open_inbox_store
from reliability_support import API_TOKEN, arbiter_process, build_world

ADMIN_TOKEN = "Zq7-isolation-admin-token-c41f0e"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def three_inboxes(store_url):
    """A demo corpus of three inboxes on SQLite and on PostgreSQL; per inbox, its emails."""
    store = open_inbox_store(store_url)
    build_demo_corpus(store, seed=3, n_inboxes=3, n_emails=240)
    emails = {inbox: list(store.iter_emails(inbox)) for inbox in store.inboxes()}
    assert len(emails) == 3 and all(emails.values())
    yield store, emails
    store.close()


def _own_ids(emails, inbox) -> set[str]:
    return {e.message_id for e in emails[inbox]}


def _foreign_subjects(emails, inbox) -> list[str]:
    """Subjects that occur in other inboxes and nowhere in this one (so finding one means a leak)."""
    own = {e.subject for e in emails[inbox]}
    return sorted({e.subject for other, items in emails.items() if other != inbox for e in items} - own)


def test_every_other_inboxs_message_id_is_not_found(three_inboxes):
    store, emails = three_inboxes
    for inbox in emails:
        tools = make_tools(store, inbox)
        foreign = [e for other, items in emails.items() if other != inbox for e in items]
        for email in foreign:
            for asked in (email.message_id, f"  {email.message_id} ", email.message_id.upper()):
                result = json.loads(tools.read_email(asked))
                assert set(result) == {"error"} and "not found" in result["error"], (inbox, asked, result)
        assert tools.trace.reads == []
        # Own emails are readable through the same tools: the refusals above are isolation, not breakage.
        own = emails[inbox][0]
        assert json.loads(tools.read_email(own.message_id))["subject"] == own.subject


def test_searches_only_ever_return_the_inboxs_own_emails(three_inboxes):
    store, emails = three_inboxes
    for inbox in emails:
        tools = make_tools(store, inbox)
        own = _own_ids(emails, inbox)
        foreign_subjects = _foreign_subjects(emails, inbox)
        foreign_senders = sorted({e.sender for o, items in emails.items() if o != inbox for e in items}
                                 - {e.sender for e in emails[inbox]})
        queries = [{"keywords": re.findall(r"\w+", subject)[:3]} for subject in foreign_subjects[:40]]
        queries += [{"keywords": ["the"], "sender": sender} for sender in foreign_senders[:10]]
        queries += [{"keywords": [word]} for word in ("meeting", "invoice", "contract", "budget", "the", "re")]
        for query in queries:
            if not query["keywords"]:
                continue
            text = call_tool(tools, "search_emails", query)
            result = [] if is_no_results(text) else json.loads(text)
            assert isinstance(result, list), result
            assert {hit["id"] for hit in result} <= own, (inbox, query)
            assert not any(hit["subject"] in foreign_subjects for hit in result)
        assert any(record.hit_ids for record in tools.trace.searches), "no search found anything at all"


class TrespassingPolicy(Policy):
    """Plays a scripted list of tool calls (e.g. reads of other inboxes' emails), then answers."""

    version = "trespasser"

    def __init__(self, calls: list[tuple[str, dict]]) -> None:
        self.calls = calls

    def act(self, conversations, tools, max_new_tokens=256):
        turns = []
        for conversation in conversations:
            done = sum(1 for m in conversation if m.get("role") == "assistant")
            if done < len(self.calls):
                name, arguments = self.calls[done]
                turns.append(PolicyTurn(content="", tool_calls=[ToolCall(name, arguments, id=f"call-{done}")]))
            else:
                call = ToolCall("return_final_answer", {"answer": "I don't know", "sources": []}, id="final")
                turns.append(PolicyTurn(content="", tool_calls=[call]))
        return turns


@pytest.fixture(scope="module")
def sqlite_inboxes(tmp_path_factory):
    world = build_world(tmp_path_factory.mktemp("isolation-world"), n_inboxes=3, n_emails=200)
    store = open_inbox_store(world.inbox_url)
    emails = {inbox: list(store.iter_emails(inbox)) for inbox in store.inboxes()}
    yield store, emails
    store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_hostile_policy_never_sees_another_inbox_through_the_runner(sqlite_inboxes, data):
    store, emails = sqlite_inboxes
    inboxes = sorted(emails)
    home = data.draw(st.sampled_from(inboxes))
    foreign = [e for other in inboxes if other != home for e in emails[other]]
    message_id = st.sampled_from([e.message_id for e in foreign]) | st.text(max_size=20)
    foreign_word = st.sampled_from([w for e in foreign[:50] for w in re.findall(r"[a-z]{4,}", e.subject.lower())] or ["x"])
    call = st.one_of(
        st.tuples(st.just("read_email"), st.fixed_dictionaries({"message_id": message_id})),
        st.tuples(st.just("search_emails"), st.fixed_dictionaries(
            {"keywords": st.lists(foreign_word, min_size=1, max_size=3)},
            optional={"sender": st.sampled_from([e.sender for e in foreign[:20]])})),
        st.tuples(st.sampled_from(["read_email", "search_emails", "return_final_answer", "open_mailbox"]),
                  st.dictionaries(st.text(max_size=10), st.text(max_size=10) | st.integers(), max_size=3)),
    )
    calls = data.draw(st.lists(call, min_size=1, max_size=6))
    [episode] = run_episodes(TrespassingPolicy(calls), [EpisodeTask(inbox=home, question="What is in the other mailboxes?")],
                             store, RunnerConfig(max_turns=8))
    own = _own_ids(emails, home)
    foreign_subjects = set(_foreign_subjects(emails, home))
    for message in episode.messages:
        if message.get("role") != "tool":
            continue
        result = json.loads(message["content"]) if message["content"].startswith(("{", "[")) else message["content"]
        if isinstance(result, list):
            assert {hit["id"] for hit in result} <= own
        elif isinstance(result, dict) and "error" not in result:
            assert result["id"] in own and result["subject"] not in foreign_subjects


# -- the admin token -------------------------------------------------------------------------------

ROUTING = {"weights": {"heuristic": 1.0}, "reason": "take over", "actor": "mallory"}


def _attempts(url: str) -> list[tuple[str, dict, dict]]:
    """Ways to send a routing change without the right bearer header (the token itself appears in some)."""
    return [
        ("no header", {}, {}),
        ("empty bearer", {"Authorization": "Bearer"}, {}),
        ("wrong token", {"Authorization": "Bearer wrong-guess"}, {}),
        ("token prefix", {"Authorization": f"Bearer {ADMIN_TOKEN[:-1]}"}, {}),
        ("token plus suffix", {"Authorization": f"Bearer {ADMIN_TOKEN}x"}, {}),
        ("token in other case", {"Authorization": f"Bearer {ADMIN_TOKEN.swapcase()}"}, {}),
        ("basic scheme", {"Authorization": f"Basic {ADMIN_TOKEN}"}, {}),
        ("token without scheme", {"Authorization": ADMIN_TOKEN}, {}),
        ("token in another header", {"X-Admin-Token": ADMIN_TOKEN}, {}),
        ("token in a cookie", {"Cookie": f"token={ADMIN_TOKEN}"}, {}),
        ("token in the body", {}, {"token": ADMIN_TOKEN}),
    ]


def test_routing_changes_without_the_token_are_refused_and_the_token_is_never_logged(tmp_path):
    world = build_world(tmp_path / "world")
    pool_url = f"sqlite:///{tmp_path / 'pool.db'}"
    env = {"AGENT_RL_ADMIN_TOKEN": ADMIN_TOKEN}
    with arbiter_process(world, pool_url, tmp_path / "arbiter.log", log_level="debug", access_log=True, env=env) as arbiter:
        with httpx.Client(base_url=arbiter.url, timeout=30) as client:
            for case, headers, extra in _attempts(arbiter.url):
                response = client.put("/v1/routing", json={**ROUTING, **extra}, headers=headers)
                assert response.status_code in (401, 403, 422), (case, response.status_code, response.text)
                assert ADMIN_TOKEN not in response.text, case
                assert client.get("/v1/routing", headers=ADMIN).json()["default"] is True, f"{case}: routing changed"
            # A token sent where it does not belong (the query string) is refused like any other attempt.
            leaked = client.put(f"/v1/routing?token={ADMIN_TOKEN}", json=ROUTING)
            assert leaked.status_code == 401

            scenario = world.scenarios[0]
            question = {"inbox": scenario.inbox_id, "question": scenario.question}
            # The admin token is for routing only: it is no API key, and an API key changes no routing.
            assert client.post("/v1/ask", json=question, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 401
            assert client.put("/v1/routing", json=ROUTING, headers={"Authorization": f"Bearer {API_TOKEN}"}).status_code == 403
            asked = client.post("/v1/ask", json=question, headers={"Authorization": f"Bearer {API_TOKEN}"})
            assert asked.status_code == 200
            ok = client.put("/v1/routing", json={**ROUTING, "actor": "lead"}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert ok.status_code == 200, ok.text
            assert client.get("/v1/routing", headers=ADMIN).json()["default"] is False
            # Reading the routing needs a credential; an API key sees the versions, not their specs.
            assert client.get("/v1/routing").status_code == 401
            seen = client.get("/v1/routing", headers={"Authorization": f"Bearer {API_TOKEN}"}).json()
            assert seen["weights"] and seen["specs"] == {}
            assert client.get("/metrics").status_code == 401 and set(client.get("/healthz").json()) == {"status", "worker"}
    log = arbiter.log_text()
    assert "PUT /v1/routing" in log and "routing changed by lead" in log  # the debug/access log was captured
    assert "?[query redacted]" in log and ADMIN_TOKEN not in log and API_TOKEN not in log
    assert ADMIN_TOKEN[:12] not in log and ADMIN_TOKEN.swapcase() not in log  # nor a near miss of it
