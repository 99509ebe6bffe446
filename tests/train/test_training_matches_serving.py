"""What SFT learns from is what serving shows, for every kind of traffic the loop trains on: the email assistant,
the built-in support agent, a plug-in (the timetable example) and gateway episodes whose client declared its own
tools. A pool episode that went through curation (the pool's JSONL export, anonymization, the SFT dataset, saved and
read back as the training stage reads it) renders, token for token, to the prompts the serving policy was given for
the same conversation (both sides after the same pseudonymization), and each trained assistant turn is exactly the
tokens a model would have to generate at that point.

The tool schemas are where this broke before: the chat template prints them verbatim, so a dataset file that
reorders their keys (or a schema's properties) teaches the model a system prompt production never shows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from agent_rl.agent.chat_format import render_prompt
from agent_rl.agent.policy import Policy, PolicyTurn, ToolCall
from agent_rl.environments.runner import Play, play_episodes
from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
from agent_rl.privacy.anonymize import Anonymizer, AnonymizerConfig, build_directory
from agent_rl.curation.datasets import load_jsonl, save_jsonl, sft_rows
from agent_rl.curation.live import judge_by_feedback
from agent_rl.curation.plugin_privacy import directory_of
from agent_rl.environments.registry import load_environment
from agent_rl.pool.repository import PoolRepository
from agent_rl.records import Split
from agent_rl.train.sft import tokenize_rows


class Recording(Policy):
    """A policy recording every conversation and tool list it is asked to continue (what serving renders)."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.version, self.seen = inner, inner.version, []

    def act(self, conversations, tools, max_new_tokens=256):
        turns = self.inner.act(conversations, tools, max_new_tokens)
        for conversation, turn in zip(conversations, turns):
            self.seen.append((json.loads(json.dumps(conversation)), json.loads(json.dumps(tools)), turn.as_message()))
        return turns


@dataclass
class Curated:
    rows: list[dict[str, Any]]  # SFT rows as the training stage reads them
    serving: list[tuple[list[dict], list[dict], dict]]  # (prompt conversation, tools, assistant message), anonymized


def _through_pool(root, episodes) -> list[dict[str, Any]]:
    """The episodes as the retraining job reads them: inserted in the pool, exported page by page to JSONL."""
    pool = PoolRepository(f"sqlite:///{root / 'pool.db'}")
    try:
        pool.insert_episodes(episodes)
        exported = [e.model_dump(mode="json") for page in pool.iter_export() for e in page.episodes]
    finally:
        pool.close()
    save_jsonl(exported, root / "episodes.jsonl")
    return load_jsonl(root / "episodes.jsonl")


def _curate(root, exported, anonymizer: Anonymizer, seen, **sft_options) -> Curated:
    anonymized = anonymizer.anonymize_episodes(exported)
    save_jsonl(anonymized, root / "anonymized.jsonl")
    save_jsonl(sft_rows(load_jsonl(root / "anonymized.jsonl"), min_quality=0.0, **sft_options), root / "sft.jsonl")
    serving = []
    for conversation, tools, message in seen:
        messages = anonymizer.anonymize_episode({"messages": [*conversation, message]})["messages"]
        serving.append((messages[:-1], tools, messages[-1]))
    return Curated(load_jsonl(root / "sft.jsonl"), serving)


# -- the traffic ----------------------------------------------------------------------------------------------------


def _email(root) -> Curated:
    from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
    from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.environments.email.scenarios import generate_scenarios

    store = open_inbox_store(f"sqlite:///{root / 'inbox.db'}")
    try:
        corpus = build_demo_corpus(store, seed=1, n_inboxes=2, n_emails=240)
        scenarios = generate_scenarios(corpus, seed=1)[:24]
        policy = Recording(HeuristicPolicy(HeuristicConfig(scenarios=scenarios), store=store))
        episodes = run_episodes(policy, [EpisodeTask.from_scenario(s) for s in scenarios], store)
        emails = [email for inbox in store.inboxes() for email in store.iter_emails(inbox)]
    finally:
        store.close()
    anonymizer = Anonymizer(AnonymizerConfig(key="k"), build_directory(emails))
    return _curate(root, _through_pool(root, episodes), anonymizer, policy.seen)


def _plugin(root, spec: str, teacher: Policy | None) -> Curated:
    env = load_environment(spec)
    tasks = env.tasks(Split.TRAIN)[:16]
    policy = Recording(teacher or env.teacher())
    episodes = play_episodes(policy, env, [Play(task) for task in tasks])
    directory, _ = directory_of(env, [task.context for task in tasks])
    anonymizer = Anonymizer(AnonymizerConfig(key="k", public_terms=env.world().privacy().public_terms), directory)
    return _curate(root, _through_pool(root, episodes), anonymizer, policy.seen, tools=env.tool_schemas())


class TimetableScript(Policy):
    """The timetable example has no teacher: this one looks the train up, reads it, and replies."""

    version = "timetable-script"

    def act(self, conversations, tools, max_new_tokens=256):
        return [self._next(messages) for messages in conversations]

    def _next(self, messages) -> PolicyTurn:
        last = messages[-1]
        if last["role"] == "user":
            origin, destination = re.search(r"from (\w+) to (\w+)", last["content"]).groups()
            call = ToolCall("find_trains", {"origin": origin, "destination": destination})
        elif last.get("name") == "find_trains":
            found = json.loads(last["content"])
            call = (ToolCall("train_details", {"train_id": found[0]["id"]}) if found
                    else ToolCall("reply", {"answer": "I don't know", "trains": []}))
        else:
            train = json.loads(last["content"])
            call = ToolCall("reply", {"answer": f"The {train['departs']} train leaves from platform "
                                                f"{train['platform']} and takes {train['minutes']} minutes.",
                                      "trains": [train["id"]]})
        return PolicyTurn(content="", tool_calls=[call], prompt_tokens=10, completion_tokens=5)


# A client's tools, written the way clients write them: keys in no sorted order, properties in signature order.
CLIENT_TOOLS = [
    {"type": "function", "function": {
        "name": "lookup_order", "description": "Find an order by its number.",
        "parameters": {"type": "object", "required": ["order_number"], "properties": {
            "order_number": {"type": "string", "description": "The order number, e.g. W123."},
            "include_items": {"type": "boolean", "description": "Also list the items."}}}}},
    {"type": "function", "function": {
        "name": "send_reply", "description": "Answer the customer; this ends the conversation.",
        "parameters": {"type": "object", "properties": {
            "text": {"type": "string", "description": "The message."},
            "cite": {"type": "array", "items": {"type": "string"}, "description": "Order numbers used."}},
            "required": ["text", "cite"]}}},
]


class OrderDesk(Policy):
    """Behind the gateway: look the order up, then answer with the client's answer tool."""

    version = "order-desk"

    def act(self, conversations, tools, max_new_tokens=256):
        turns = []
        for messages in conversations:
            last = messages[-1]
            number = re.search(r"W\d+", next(m["content"] for m in messages if m["role"] == "user")).group(0)
            if last["role"] == "user":
                call = ToolCall("lookup_order", {"order_number": number, "include_items": True})
            else:
                call = ToolCall("send_reply", {"text": f"Order {number}: {last['content']}", "cite": [number]})
            turns.append(PolicyTurn(content="", tool_calls=[call], prompt_tokens=10, completion_tokens=5))
        return turns


def _gateway(root) -> Curated:
    from agent_rl.arbiter.config import ArbiterConfig
    from agent_rl.arbiter.policies import register_policy_loader
    from agent_rl.arbiter.server import running_arbiter
    from tests.arbiter.arbiter_fixtures import api_key, bearer

    policy = Recording(OrderDesk())
    register_policy_loader("order-desk", lambda rest: policy)
    pool_url, token = f"sqlite:///{root / 'pool.db'}", "matches-serving-key-5c1e"
    pool = PoolRepository(pool_url)
    pool.set_routing({"desk": 1.0}, {"desk": "order-desk"}, reason="test", actor="tests")
    pool.close()
    config = ArbiterConfig(pool_url=pool_url, routing_ttl_s=0.2, api_keys=(api_key(token, "desk", "acme"),),
                           gateway_rate_per_s=1000.0, gateway_rate_burst=1000)
    with running_arbiter(config, log_level="warning") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0)
        for i in range(8):
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "You are the order desk of Lakeside Outfitters."},
                {"role": "user", "content": f"Hi, this is Maria Gonzales. Where is my order W{100 + i}?"}]
            for _ in range(3):
                raw = client.chat.completions.with_raw_response.create(model="agent-rl", messages=messages,
                                                                        tools=CLIENT_TOOLS, max_tokens=64)
                episode, message = raw.headers["x-agent-rl-episode"], raw.parse().choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                call = message.tool_calls[0]
                if call.function.name == "send_reply":
                    break
                messages.append({"role": "tool", "tool_call_id": call.id, "content": f"shipped on day {i + 2}"})
            assert httpx.post(f"{url}/v1/episodes/{episode}/end", headers=bearer(token), timeout=30).status_code == 200
            assert httpx.post(f"{url}/v1/feedback", headers=bearer(token), timeout=30,
                              json={"episode_id": episode, "verdict": "up"}).status_code == 200
    pool = PoolRepository(pool_url)
    try:
        exported = [judge_by_feedback(e.model_dump(mode="json")) for page in pool.iter_export() for e in page.episodes]
    finally:
        pool.close()
    assert len(exported) == 8 and all(e["tools"] for e in exported)
    save_jsonl(exported, root / "episodes.jsonl")
    anonymizer = Anonymizer(AnonymizerConfig(key="k"), build_directory([]))
    return _curate(root, load_jsonl(root / "episodes.jsonl"), anonymizer, policy.seen, tools=[])


TRAFFIC = {
    "email": _email,
    "support": lambda root: _plugin(root, "support", None),
    "timetable": lambda root: _plugin(root, "examples.timetable:TimetableEnvironment", TimetableScript()),
    "gateway": _gateway,
}


@pytest.fixture(scope="module", params=sorted(TRAFFIC))
def curated(request, tmp_path_factory) -> Curated:
    return TRAFFIC[request.param](tmp_path_factory.mktemp(f"match-{request.param}"))


@pytest.fixture(scope="module", params=["tiny", pytest.param("base", marks=pytest.mark.slow)])
def tokenizer(request, tmp_path_factory):
    from transformers import AutoTokenizer

    from agent_rl.agent.models import build_tiny_model, resolve_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny")) if request.param == "tiny" else resolve_model("base")
    return AutoTokenizer.from_pretrained(path)


def _task(messages) -> tuple[str, ...]:
    """Which episode a conversation belongs to: its system messages (whose inbox, which day) and request."""
    return tuple(m["content"] for m in messages if m["role"] in ("system", "user"))[:3]


def test_every_trained_turn_is_what_serving_rendered_and_the_model_would_generate(curated, tokenizer):
    rows = curated.rows
    assert len(rows) >= 8
    tokenized = tokenize_rows(tokenizer, rows, max_length=100_000)
    assert not tokenized.dropped
    by_task: dict[tuple, list] = {}
    for conversation, tools, message in curated.serving:
        by_task.setdefault(_task(conversation), []).append((conversation, tools, message))
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    checked = 0
    for row, ids, labels in zip(rows, tokenized.input_ids, tokenized.labels):
        for conversation, tools, message in by_task[_task(row["messages"])]:
            prompt = tokenizer(render_prompt(tokenizer, conversation, tools), add_special_tokens=False)["input_ids"]
            if ids[: len(prompt)] != prompt:
                at = next((i for i, (a, b) in enumerate(zip(ids, prompt)) if a != b), min(len(ids), len(prompt)))
                pytest.fail("a training row's context differs from the serving prompt:\n"
                            f"trained: {tokenizer.decode(ids[max(0, at - 40): at + 60])!r}\n"
                            f"serving: {tokenizer.decode(prompt[max(0, at - 40): at + 60])!r}")
            assert labels[len(prompt) - 1] == -100  # the assistant header is context, not trained
            rendered = tokenizer(render_prompt(tokenizer, [*conversation, message], tools, add_generation_prompt=False),
                                 add_special_tokens=False)["input_ids"]
            assert rendered[: len(prompt)] == prompt
            generated = rendered[len(prompt):]
            generated = generated[: generated.index(end_of_turn) + 1]  # what follows <|im_end|> is the template's
            trained = labels[len(prompt): len(prompt) + len(generated)]
            assert trained == ids[len(prompt): len(prompt) + len(generated)]
            assert ids[len(prompt): len(prompt) + len(generated)] == generated, "the trained turn is not what " \
                "the model generates at that point"
            checked += 1
    assert checked >= 3 * len(rows) // 2
