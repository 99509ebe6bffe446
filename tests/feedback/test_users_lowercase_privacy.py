"""Issue 47: the outside agent's users who type in lower case (`lowercase_share`) through a live gateway, then the
privacy pass curation runs on gateway episodes (`anonymize_plugin_partition(None, ...)`, the demo's public terms):
the names those users typed in lower case are replaced like their capitalised forms, and the blocking leak check
finds nothing."""

from __future__ import annotations

import random
import re

from openai import OpenAI

from agent_rl.privacy.anonymize import AnonymizerConfig
from agent_rl.curation.plugin_privacy import anonymize_plugin_partition
from agent_rl.environments.email.inbox.demo_world import public_terms
from agent_rl.simulated_users.outside_agent import ToolLoopAgent
from agent_rl.simulated_users.population import DEFAULT_NOISE
from agent_rl.simulated_users.users import Question, UsersConfig, run_users
from examples.outside_agent import SYSTEM, TOOLS, Mailbox
from tests.arbiter import arbiter_fixtures
from tests.arbiter.arbiter_fixtures import api_key
from tests.feedback.test_outside_agent import APP_TOKEN, _wait_written

demo_world = arbiter_fixtures.demo_world  # pytest fixtures: a live arbiter on the demo world
start_arbiter = arbiter_fixtures.start_arbiter

NAMED = re.compile(r"\b(?:did|Did|is|Is) ([A-Z][a-z]+)(?:'s)? |\bthat ([A-Z][a-z]+) manages")


def test_users_typing_in_lower_case_leave_no_name_for_the_leak_check(start_arbiter, demo_world, tmp_path):
    # Questions that name a person ("Who did Harold put in charge of ...", "Where is Megan's team moving?").
    asked = [s for s in demo_world.scenarios if NAMED.search(s.question)][:30]
    assert len(asked) == 30
    (tmp_path / "mailbox.db").symlink_to(demo_world.inbox_url.removeprefix("sqlite:///"))
    mailbox = Mailbox(tmp_path, 0.0)  # the example app's backend: its own email ids, whole-word snippets
    questions = [Question(s.question, lambda answer: False, "demo") for s in asked]  # unhappy users re-ask
    config = UsersConfig(noise=DEFAULT_NOISE, rated_share=0.0, seed=5, lowercase_share=1.0)
    keys = (api_key(), api_key(token=APP_TOKEN, key_id="mail-app", tenant="mailpal", replay=False))
    with start_arbiter(default_routing={"heuristic": 1.0}, api_keys=keys, gateway_rate_per_s=1000) as live:
        client = OpenAI(base_url=f"{live.url}/v1", api_key=APP_TOKEN, max_retries=0)
        agent = ToolLoopAgent(client, TOOLS, final_tool="return_final_answer", metadata={"context": "mail-app"},
                              max_tokens=128)

        def opening(index, question):
            s = asked[index % len(asked)]
            return [{"role": "system", "content": SYSTEM},
                    {"role": "system", "content": f"The user's mailbox is {s.inbox_id}."},
                    {"role": "user", "content": s.question}]

        def backend(index, question):
            s = asked[index % len(asked)]
            return mailbox.backend(s.inbox_id, s.query_date, random.Random(index))

        try:
            week = run_users(agent, questions, opening, backend, config, n=30, concurrency=4)
        finally:
            agent.close_http()
            client.close()
            mailbox.close()
        stored = _wait_written(live.pool, [o.episode_id for o in week.outcomes if o.episode_id])
    rows = [episode.model_dump(mode="json") for episode in stored.values()]

    names = {}  # episode id -> the person its question names, as the user typed it in lower case
    for row in rows:
        named = NAMED.search(row["messages"][2]["content"])
        name = (named.group(1) or named.group(2)).lower()
        if any(m["role"] == "user" and name in m["content"] for m in row["messages"][3:]):
            names[row["episode_id"]] = name
    assert len(names) >= 5  # users who re-asked, in lower case, naming someone

    result = anonymize_plugin_partition(None, rows, [], config=AnonymizerConfig(key="test-key",
                                                                                 public_terms=public_terms()))
    assert len(result.episodes) == len(rows) and result.report["planted_canaries"] > 0
    assert [str(leak) for leak in result.leaks] == []
    restated = 0
    for before, after in zip(rows, result.episodes):
        question, anonymized = before["messages"][2]["content"], after["messages"][2]["content"]
        for m_before, m_after in zip(before["messages"][3:], after["messages"][3:]):
            if m_before["role"] != "user" or before["episode_id"] not in names:
                continue
            assert names[before["episode_id"]] not in re.findall(r"[a-z]+", m_after["content"])
            if question.lower().rstrip("?") in m_before["content"]:
                # A re-ask restates the question: its names map as they did when it was first asked, capitalised.
                assert anonymized.lower().rstrip("?") in m_after["content"], (anonymized, m_after["content"])
                restated += 1
    assert restated >= 5
