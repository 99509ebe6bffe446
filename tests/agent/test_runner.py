"""The episode runner on a real SQLite inbox: outcomes, budgets, batching, accounting, and policies that misbehave."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

import pytest

from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
from agent_rl.agent.policy import Policy, PolicyTurn, ToolCall
from agent_rl.environments.runner import RunnerConfig
from agent_rl.environments.email.episodes import EpisodeTask, run_episode, run_episodes
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.records import Episode, Outcome, Split
from agent_rl.environments.email.records import Category, Email, Scenario

INBOX = "alice@example.com"
OTHER = "bob@example.com"
DAY = datetime(2001, 6, 1, tzinfo=timezone.utc)


@pytest.fixture
def store(sqlite_url):
    store = open_inbox_store(sqlite_url)
    store.add_emails([
        Email(message_id="<m1@x>", inbox=INBOX, date=datetime(2001, 5, 3, tzinfo=timezone.utc), subject="Budget review",
              sender="carol@example.com", to=(INBOX,), body="The budget review meeting is on May 10, 2001 in room 4B."),
        Email(message_id="<m2@x>", inbox=INBOX, date=datetime(2001, 5, 4, tzinfo=timezone.utc), subject="Vendor invoice",
              sender="dave@example.com", to=(INBOX,), body="The Acme invoice came to $4,500 and is paid."),
        Email(message_id="<o1@x>", inbox=OTHER, date=datetime(2001, 5, 4, tzinfo=timezone.utc), subject="Budget",
              sender="erin@example.com", to=(OTHER,), body="Bob's budget meeting is on May 12."),
    ])
    yield store
    store.close()


def scenario(question="When is the budget review meeting?", answer="May 10, 2001", sources=("<m1@x>",),
             category=Category.DATE, sid="s1") -> Scenario:
    return Scenario(id=sid, inbox_id=INBOX, question=question, answer=answer, source_ids=list(sources),
                    category=category, split=Split.TEST, query_date=DAY)


class ScriptedPolicy(Policy):
    """Plays the same list of turns in every conversation (turn i of the script at assistant turn i)."""

    version = "scripted"

    def __init__(self, script: list[Any], tokens: tuple[int, int] = (100, 10), delay_s: float = 0.0) -> None:
        self.script, self.tokens, self.delay_s = script, tokens, delay_s
        self.batch_sizes: list[int] = []

    def act(self, conversations, tools, max_new_tokens=256):
        self.batch_sizes.append(len(conversations))
        time.sleep(self.delay_s)
        turns = []
        for conversation in conversations:
            index = sum(m["role"] == "assistant" for m in conversation)
            turn = self.script[min(index, len(self.script) - 1)]
            if isinstance(turn, PolicyTurn):
                turn = PolicyTurn(turn.content, list(turn.tool_calls), turn.parse_error, *self.tokens)
            turns.append(turn)
            conversation.clear()  # a careless policy must not corrupt the recorded episode
        return turns


def call(name: str, **arguments: Any) -> PolicyTurn:
    return PolicyTurn(tool_calls=[ToolCall(name, arguments, id=f"id-{name}")])


SEARCH = call("search_emails", keywords=["budget"])
READ = call("read_email", message_id="<m1@x>")


def answer(text: str, sources=("<m1@x>",)) -> PolicyTurn:
    return call("return_final_answer", answer=text, sources=list(sources))


def test_teacher_episode_is_correct_and_fully_recorded(store):
    policy = HeuristicPolicy(HeuristicConfig(scenarios=[scenario()]), store=store)
    episode = run_episode(policy, EpisodeTask.from_scenario(scenario()), store)

    assert episode.outcome == Outcome.CORRECT
    assert episode.final_answer == "May 10, 2001" and episode.sources == ["<m1@x>"]
    assert episode.reward is not None and episode.reward > 1.3
    assert sum(episode.reward_components.values()) == pytest.approx(episode.reward)
    roles = [m["role"] for m in episode.messages]
    assert roles[:3] == ["system", "system", "user"] and roles[3:] == ["assistant", "tool"] * episode.turns
    assert INBOX in episode.messages[1]["content"] and "2001-06-01" in episode.messages[1]["content"]
    first_call = episode.messages[3]["tool_calls"][0]
    assert first_call["type"] == "function" and first_call["function"]["name"] == "search_emails"
    assert isinstance(first_call["function"]["arguments"], dict)
    tool_message = episode.messages[4]
    assert tool_message["name"] == "search_emails" and tool_message["tool_call_id"] == first_call["id"]
    assert episode.messages[-1] == {"role": "tool", "name": "return_final_answer", "content": "Answer recorded.",
                                    "tool_call_id": episode.messages[-2]["tool_calls"][0]["id"]}
    assert episode.task_category == Category.DATE and episode.task_id == "s1"
    assert episode.policy_version == "heuristic-v1" and episode.prompt_tokens > 0 and episode.completion_tokens > 0
    Episode.model_validate_json(episode.model_dump_json())  # storable as is


@pytest.mark.parametrize(
    ("final", "outcome", "reward_range"),
    [
        (answer("It is on May 10, 2001."), Outcome.CORRECT, (1.3, 1.5)),
        (answer("May 11, 2001"), Outcome.WRONG, (-1.0, -0.5)),
        (answer("I don't know", sources=()), Outcome.IDK, (0.0, 0.5)),
    ],
)
def test_answers_are_judged_against_the_golden_answer(store, final, outcome, reward_range):
    episode = run_episode(ScriptedPolicy([SEARCH, READ, final]), EpisodeTask.from_scenario(scenario()), store)
    assert episode.outcome == outcome
    assert reward_range[0] <= episode.reward <= reward_range[1]
    assert episode.reward_components["found_gold" if outcome != Outcome.CORRECT else "sources_correct"] > 0


def test_i_dont_know_on_an_unanswerable_question_is_correct(store):
    unanswerable = scenario(question="When is the office party?", answer="I don't know", sources=(),
                            category=Category.UNANSWERABLE)
    declined = run_episode(ScriptedPolicy([SEARCH, answer("I don't know", ())]), EpisodeTask.from_scenario(unanswerable), store)
    guessed = run_episode(ScriptedPolicy([SEARCH, answer("May 10")]), EpisodeTask.from_scenario(unanswerable), store)
    assert declined.outcome == Outcome.CORRECT and declined.reward >= 1.0
    assert guessed.outcome == Outcome.WRONG and guessed.reward < 0


@pytest.mark.parametrize(
    ("turn", "kind", "reward"),
    [
        (PolicyTurn(content="The meeting is on May 10."), "no_tool_call", -1.8),
        (PolicyTurn(content='<tool_call>{"name": "search', parse_error="bad JSON"), "unparsable_tool_call", -2.0),
        (call("delete_everything"), "unknown_tool", -1.9),
        (PolicyTurn(tool_calls=[ToolCall("search_emails", "{not json")]), "unparsable_tool_call", -2.0),  # type: ignore[arg-type]
    ],
)
def test_format_errors_end_the_episode(store, turn, kind, reward):
    episode = run_episode(ScriptedPolicy([turn]), EpisodeTask.from_scenario(scenario()), store)
    assert episode.outcome == Outcome.FORMAT_ERROR
    assert episode.reward == pytest.approx(reward)
    assert f"format_error.{kind}" in episode.reward_components
    assert episode.turns == 1 and episode.messages[-1]["role"] == "assistant" and episode.final_answer is None


def test_json_string_arguments_are_accepted_and_bad_arguments_are_the_models_to_fix(store):
    script = [
        PolicyTurn(tool_calls=[ToolCall("search_emails", '{"keywords": "budget"}')]),  # type: ignore[arg-type]
        PolicyTurn(tool_calls=[ToolCall("read_email", {"id": "<m1@x>"})]),
        READ,
        answer("May 10, 2001"),
    ]
    episode = run_episode(ScriptedPolicy(script), EpisodeTask.from_scenario(scenario()), store)
    assert episode.outcome == Outcome.CORRECT and episode.turns == 4
    errors = [json.loads(m["content"])["error"] for m in episode.messages if m["role"] == "tool" and "error" in m["content"]]
    assert any("list of strings" in e for e in errors) and any("unknown argument" in e for e in errors)
    assert "tool_call_id" not in episode.messages[4]  # the policy gave no id


def test_another_inboxs_email_is_not_found(store):
    episode = run_episode(
        ScriptedPolicy([call("read_email", message_id="<o1@x>"), answer("May 12")]), EpisodeTask.from_scenario(scenario()), store
    )
    assert "not found" in episode.messages[4]["content"] and "May 12" not in episode.messages[4]["content"]


def test_a_policy_that_loops_runs_out_of_turns(store):
    config = RunnerConfig(max_turns=5, max_repeated_calls=10)
    episode = run_episode(ScriptedPolicy([SEARCH]), EpisodeTask.from_scenario(scenario()), store, config)
    assert episode.outcome == Outcome.RAN_OUT and episode.turns == 5
    assert episode.reward == pytest.approx(0.1)  # found the gold email in search results: partial credit only


def test_a_policy_repeating_the_same_call_is_stopped_early(store):
    episode = run_episode(ScriptedPolicy([SEARCH]), EpisodeTask.from_scenario(scenario()), store,
                          RunnerConfig(max_turns=8, max_repeated_calls=3))
    assert episode.outcome == Outcome.RAN_OUT and episode.turns == 3  # not 8: the repeats teach nothing
    varied = ScriptedPolicy([SEARCH, PolicyTurn(tool_calls=[ToolCall("search_emails", {"keywords": ["other"]})]), SEARCH,
                             PolicyTurn(tool_calls=[ToolCall("search_emails", {"keywords": ["third"]})])])
    episode = run_episode(varied, EpisodeTask.from_scenario(scenario()), store, RunnerConfig(max_turns=8, max_repeated_calls=3))
    assert episode.turns >= 4  # different searches are not a loop


def test_token_budget_and_timeout_end_episodes(store):
    task = EpisodeTask.from_scenario(scenario())
    greedy = run_episode(ScriptedPolicy([SEARCH], tokens=(5000, 200)), task, store, RunnerConfig(max_context_tokens=4000))
    assert greedy.outcome == Outcome.RAN_OUT and greedy.turns == 1
    slow = run_episode(ScriptedPolicy([SEARCH], delay_s=0.05), task, store, RunnerConfig(timeout_s=0.08))
    assert slow.outcome == Outcome.RAN_OUT and 1 <= slow.turns <= 3  # checked between turns


class RaisingPolicy(Policy):
    version = "broken"

    def act(self, conversations, tools, max_new_tokens=256):
        raise RuntimeError("CUDA out of memory")


class GarbagePolicy(Policy):
    def __init__(self, result: Any) -> None:
        self.result = result

    def act(self, conversations, tools, max_new_tokens=256):
        return self.result


@pytest.mark.parametrize(
    "policy",
    [RaisingPolicy(), GarbagePolicy(None), GarbagePolicy([]), GarbagePolicy(["text", 3]), GarbagePolicy([PolicyTurn()] * 5)],
    ids=["raises", "none", "too-few", "not-turns", "too-many"],
)
def test_misbehaving_policies_end_episodes_as_policy_errors(store, policy):
    tasks = [EpisodeTask.from_scenario(scenario()), EpisodeTask.from_scenario(scenario(sid="s2"))]
    episodes = run_episodes(policy, tasks, store)
    assert [e.outcome for e in episodes] == [Outcome.FORMAT_ERROR] * 2
    assert all("format_error.policy_error" in e.reward_components for e in episodes)


def test_a_policy_that_is_unavailable_leaves_its_episodes_unserved_never_stored_or_scored(store, sqlite_url):
    """The serving stack could not answer at all (an engine resting after its restarts): the episode is flagged,
    mid-conversation too, so the arbiter answers 503 instead of storing it and an evaluation gives no figure."""
    from agent_rl.environments.policy import PolicyUnavailable
    from agent_rl.evaluate.harness import evaluate_tasks
    from agent_rl.environments.email.environment import EmailEnvironment
    from agent_rl.pool import PoolRepository

    class DownAfterSearch(ScriptedPolicy):
        def act(self, conversations, tools, max_new_tokens=256):
            if any(m["role"] == "tool" for m in conversations[0]):
                raise PolicyUnavailable("engine resting", retry_after_s=30.0)
            return super().act(conversations, tools, max_new_tokens)

    tasks = [EpisodeTask.from_scenario(scenario()), EpisodeTask.from_scenario(scenario(sid="s2"))]
    episodes = run_episodes(DownAfterSearch([SEARCH, READ, answer("May 10, 2001")]), tasks, store)
    assert all(isinstance(e.unserved, PolicyUnavailable) and e.unserved.retry_after_s == 30.0 for e in episodes)
    assert "unserved" not in episodes[0].model_dump()  # never part of the stored record
    assert run_episodes(RaisingPolicy(), tasks, store)[0].unserved is None  # a policy's own bug is not an outage
    pool = PoolRepository(sqlite_url)
    with pytest.raises(ValueError, match="unserved"):
        pool.insert_episodes(episodes)
    assert pool.count() == 0
    with pytest.raises(PolicyUnavailable, match="2 of 2 held-out episodes of scripted could not be served"):
        evaluate_tasks(DownAfterSearch([SEARCH, READ]), EmailEnvironment(store),
                       [task.play().task for task in tasks])


def test_each_turn_is_one_batched_act_call_over_the_running_conversations(store):
    quick = scenario(sid="quick")
    slow = scenario(question="How much was the Acme invoice?", answer="$4,500", sources=("<m2@x>",),
                    category=Category.AMOUNT, sid="slow")
    policy = HeuristicPolicy(HeuristicConfig(scenarios=[quick, slow]), store=store)
    calls: list[int] = []
    original = policy.act

    def counting(conversations, tools, max_new_tokens=256):
        calls.append(len(conversations))
        return original(conversations, tools, max_new_tokens)

    policy.act = counting  # type: ignore[method-assign]
    tasks = [EpisodeTask.from_scenario(s) for s in (quick, slow, quick)]
    episodes = run_episodes(policy, tasks, store, RunnerConfig(batch_size=2))
    assert [e.outcome for e in episodes] == [Outcome.CORRECT] * 3
    assert [e.task_id for e in episodes] == ["quick", "slow", "quick"]
    assert calls[0] == 2 and max(calls) <= 2 and calls.count(1) >= 1  # two batches: 2 then 1
    assert sum(calls) == sum(e.turns for e in episodes)


def test_live_traffic_without_a_scenario_has_no_reward(store):
    task = EpisodeTask(inbox=INBOX, question="When is the budget review meeting?", tenant="acme", policy_version="v7")
    episode = run_episode(ScriptedPolicy([SEARCH, READ, answer("May 10, 2001")]), task, store)
    assert episode.reward is None and episode.reward_components == {}
    assert episode.outcome == Outcome.WRONG  # unjudged: never counted as correct
    assert episode.tenant == "acme" and episode.policy_version == "v7" and episode.task_id is None
    declined = run_episode(ScriptedPolicy([answer("I don't know", ())]), task, store)
    assert declined.outcome == Outcome.IDK


def test_cost_and_latency_are_accounted(store):
    config = RunnerConfig(prompt_price_per_m=2.0, completion_price_per_m=10.0)
    episode = run_episode(ScriptedPolicy([SEARCH, READ, answer("May 10, 2001")], tokens=(1000, 50)),
                          EpisodeTask.from_scenario(scenario()), store, config)
    assert (episode.prompt_tokens, episode.completion_tokens) == (3000, 150)
    assert episode.cost_usd == pytest.approx((3000 * 2.0 + 150 * 10.0) / 1e6)
    assert episode.latency_ms > 0


class ConcurrentScript(ScriptedPolicy):
    """A policy that batches concurrent calls itself (an engine server): the turns of conversation "slow" wait until
    every other conversation has been answered its final turn, or 20 s."""

    concurrent_turns = True

    def __init__(self, script: list[Any], others: int) -> None:
        super().__init__(script)
        import threading

        self.lock, self.others_done, self.others = threading.Lock(), threading.Event(), others
        self.finished = 0
        self.slow_waited_for_others: list[bool] = []

    def act(self, conversations, tools, max_new_tokens=256):
        question = next(m["content"] for m in conversations[0] if m["role"] == "user")
        if "invoice" in question:  # the slow episode
            self.slow_waited_for_others.append(self.others_done.wait(timeout=20))
        turns = super().act(conversations, tools, max_new_tokens)
        with self.lock:
            if "invoice" not in question and any(c.name == "return_final_answer" for c in turns[0].tool_calls):
                self.finished += 1
                if self.finished == self.others:
                    self.others_done.set()
        return turns


def test_a_concurrent_policy_keeps_episodes_in_flight_so_none_waits_for_the_slowest(store):
    fast = [EpisodeTask.from_scenario(scenario(sid=f"fast{i}")) for i in range(5)]
    slow = EpisodeTask.from_scenario(scenario(question="How much was the Acme invoice?", answer="$4,500",
                                              category=Category.AMOUNT, sid="slow"))
    tasks = [fast[0], slow, *fast[1:]]
    policy = ConcurrentScript([SEARCH, READ, answer("May 10, 2001")], others=5)
    episodes = run_episodes(policy, tasks, store, RunnerConfig(batch_size=2))
    # Two in flight: while "slow" waits, the other place plays all five fast episodes one after another, each
    # turn asked for as soon as its tools answered; in waves the five could not finish before "slow" answered.
    assert policy.slow_waited_for_others[0] is True
    assert [e.task_id for e in episodes] == ["fast0", "slow", "fast1", "fast2", "fast3", "fast4"]
    assert [e.outcome for e in episodes] == [Outcome.CORRECT, Outcome.WRONG, *[Outcome.CORRECT] * 4]
    assert [e.turns for e in episodes] == [3] * 6
    # The same plays in waves give the same episodes, turn for turn.
    waves = run_episodes(ScriptedPolicy([SEARCH, READ, answer("May 10, 2001")]), tasks, store,
                         RunnerConfig(batch_size=2))
    assert [(e.task_id, e.outcome, e.messages) for e in waves] == \
        [(e.task_id, e.outcome, e.messages) for e in episodes]


def test_in_flight_can_be_turned_off_and_a_failing_turn_ends_only_its_episode(store):
    tasks = [EpisodeTask.from_scenario(scenario(sid=f"s{i}")) for i in range(3)]
    policy = ScriptedPolicy([SEARCH, READ, answer("May 10, 2001")])
    policy.concurrent_turns = True  # type: ignore[attr-defined]
    waves = run_episodes(policy, tasks, store, RunnerConfig(batch_size=3, in_flight=False))
    assert policy.batch_sizes == [3, 3, 3]  # waves: every turn one call over the running conversations
    flight = ScriptedPolicy([SEARCH, READ, answer("May 10, 2001")])
    flight.concurrent_turns = True  # type: ignore[attr-defined]
    assert [e.outcome for e in run_episodes(flight, tasks, store, RunnerConfig(batch_size=3))] == \
        [e.outcome for e in waves] == [Outcome.CORRECT] * 3
    assert flight.batch_sizes == [1] * 9  # in flight: one call per episode and turn

    class FailsOnInvoices(ScriptedPolicy):
        concurrent_turns = True

        def act(self, conversations, tools, max_new_tokens=256):
            if "invoice" in conversations[0][-1]["content"]:
                raise RuntimeError("engine went away")
            return super().act(conversations, tools, max_new_tokens)

    mixed = [tasks[0], EpisodeTask.from_scenario(scenario(question="How much was the invoice?", sid="bad")), tasks[1]]
    episodes = run_episodes(FailsOnInvoices([SEARCH, READ, answer("May 10, 2001")]), mixed, store,
                            RunnerConfig(batch_size=2))
    assert [e.outcome for e in episodes] == [Outcome.CORRECT, Outcome.FORMAT_ERROR, Outcome.CORRECT]
    assert "format_error.policy_error" in episodes[1].reward_components
