"""The episode runner: plays a policy against the inbox tools, batched, within turn, token and time budgets.

Each turn the runner gathers the conversations still running and asks the policy for all of
their next turns in one `act` call, executes the tool calls, and stops a conversation when it
answers through `return_final_answer`, breaks the format, or runs out of budget. Outcomes:
- correct / wrong / idk: the answer as judged against the scenario's golden answer
  ("I don't know" on an unanswerable question is correct);
- format_error: an unparsable tool call, an unknown tool, a turn of plain text with no tool
  call (answers must come through return_final_answer so they carry sources), or a policy
  that raised or returned garbage;
- ran_out: no answer within max_turns, the context-token budget or the wall-clock timeout, or a model
  that loops (the same tool call max_repeated_calls times).
Bad tool *arguments* are not format errors: the tool answers with an error the model can fix.
Nothing a policy does makes the runner raise.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from agent_rl.agent.policy import Policy, PolicyTurn, RowRoutedPolicy, ToolCall
from agent_rl.agent.prompts import initial_messages
from agent_rl.agent.tool_calls import decode_arguments
from agent_rl.agent.tools import TOOL_NAMES, InboxTools, ToolConfig, call_tool, make_tools, tool_schemas
from agent_rl.inbox.store import InboxStore
from agent_rl.records import Episode, Outcome, Scenario
from agent_rl.reward.judge import DeterministicJudge, Judge, is_idk
from agent_rl.reward.rubric import FormatErrorKind, RubricObservation, RubricWeights, score
from agent_rl.turn_budget import DEFAULT_MAX_TURNS

log = logging.getLogger(__name__)

IDK_GOLDEN = "I don't know"


class RunnerConfig(BaseModel):
    """Budgets, pricing and batching of episode runs."""

    model_config = ConfigDict(frozen=True)

    max_turns: PositiveInt = Field(DEFAULT_MAX_TURNS, description="assistant turns before an unanswered episode has run "
                                    "out (as in evaluation and GRPO: agent_rl/turn_budget.py)")
    max_repeated_calls: PositiveInt = Field(
        3, description="the same tool call (name and arguments) this many times ends the episode as run out: "
        "a looping model learns nothing new from its repeats, and playing them out costs the most tokens")
    max_context_tokens: PositiveInt = Field(
        6000, description="an episode whose latest prompt + completion tokens exceed this has run out"
    )
    max_new_tokens: PositiveInt = Field(256, description="generation limit per assistant turn, passed to the policy")
    timeout_s: float = Field(300.0, gt=0, description="wall clock per batch of episodes, checked between turns")
    batch_size: PositiveInt = Field(32, description="episodes played together; each turn is one policy.act call")
    prompt_price_per_m: float = Field(0.0, ge=0, description="USD per million prompt tokens")
    completion_price_per_m: float = Field(0.0, ge=0, description="USD per million completion tokens")
    tools: ToolConfig = Field(default_factory=ToolConfig)
    rubric: RubricWeights = Field(default_factory=RubricWeights)


@dataclass
class EpisodeTask:
    """One question to play: on which inbox, with the scenario when the golden answer is known."""

    inbox: str
    question: str
    scenario: Scenario | None = None
    policy_version: str | None = None  # defaults to policy.version
    tenant: str = "default"
    query_date: datetime | None = None  # defaults to the scenario's query date

    @classmethod
    def from_scenario(cls, scenario: Scenario, **kwargs: Any) -> EpisodeTask:
        return cls(inbox=scenario.inbox_id, question=scenario.question, scenario=scenario, **kwargs)


@dataclass
class _Live:
    """A running episode's state."""

    task: EpisodeTask
    tools: InboxTools
    messages: list[dict[str, Any]]
    started: float
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    outcome: Outcome | None = None
    format_error: FormatErrorKind | None = None
    ended: float = 0.0
    call_counts: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.outcome is not None


def run_episodes(
    policy: Policy,
    tasks: list[EpisodeTask],
    store: InboxStore,
    config: RunnerConfig | None = None,
    judge: Judge | None = None,
) -> list[Episode]:
    """Play every task with `policy`, in batches of `config.batch_size`; one Episode per task, in order."""
    config = config or RunnerConfig()
    judge = judge or DeterministicJudge()
    episodes: list[Episode] = []
    for start in range(0, len(tasks), config.batch_size):
        episodes.extend(_run_batch(policy, tasks[start : start + config.batch_size], store, config, judge))
    return episodes


def run_episode(
    policy: Policy,
    task: EpisodeTask,
    store: InboxStore,
    config: RunnerConfig | None = None,
    judge: Judge | None = None,
) -> Episode:
    """Play one task."""
    return run_episodes(policy, [task], store, config, judge)[0]


def _run_batch(
    policy: Policy, tasks: list[EpisodeTask], store: InboxStore, config: RunnerConfig, judge: Judge
) -> list[Episode]:
    schemas = tool_schemas()
    started = time.perf_counter()
    live = []
    for task in tasks:
        query_date = task.query_date or (task.scenario.query_date if task.scenario else None)
        live.append(
            _Live(
                task=task,
                tools=make_tools(store, task.inbox, query_date, config.tools),
                messages=initial_messages(task.inbox, task.question, query_date),
                started=started,
            )
        )

    while running := [episode for episode in live if not episode.done]:
        turns = _act(policy, [episode.messages for episode in running], schemas, config.max_new_tokens,
                     [episode.task.policy_version for episode in running])
        for episode, turn in zip(running, turns):
            _apply_turn(episode, turn)
            if not episode.done:
                _check_budgets(episode, turn, config, started)
            if episode.done:
                episode.ended = time.perf_counter()

    return [_to_episode(episode, policy, config, judge) for episode in live]


def _act(policy: Policy, conversations: list[list[dict[str, Any]]], schemas: list[dict], max_new_tokens: int,
         versions: list[str | None] | None = None) -> list[Any]:
    """The policy's turns, or one `None` (policy error) per conversation it failed to answer. A policy serving
    several versions at once (RowRoutedPolicy) is told each conversation's routed version."""
    try:
        # Policies get copies: one that edits its input cannot corrupt the recorded episode. A policy
        # that declares it only reads them (the heuristic) is spared the copy, a cost on every turn.
        if getattr(policy, "reads_conversations_only", False) is True:
            given = list(conversations)
        else:
            given = [_copy_json(c) for c in conversations]
        if isinstance(policy, RowRoutedPolicy):
            turns = policy.act_rows(versions or [None] * len(given), given, schemas, max_new_tokens)
        else:
            turns = policy.act(given, schemas, max_new_tokens)
    except Exception as exc:
        log.warning("policy %s raised %s: %s", getattr(policy, "version", "?"), type(exc).__name__, exc)
        return [None] * len(conversations)
    if not isinstance(turns, list) or len(turns) != len(conversations):
        log.warning("policy returned %s turns for %d conversations", _describe(turns), len(conversations))
        return [None] * len(conversations)
    return turns


def _copy_json(value: Any) -> Any:
    """A copy of a JSON-like value whose dicts and lists are new (strings and numbers are immutable, so shared).

    Several times cheaper than a json.dumps/loads round trip, which re-encodes every email body
    of the conversation on every turn.
    """
    if isinstance(value, dict):
        return {key: _copy_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy_json(item) for item in value]
    return value


def _describe(value: Any) -> str:
    return str(len(value)) if isinstance(value, list) else type(value).__name__


def _apply_turn(episode: _Live, turn: Any) -> None:
    if not isinstance(turn, PolicyTurn):
        episode.outcome, episode.format_error = Outcome.FORMAT_ERROR, FormatErrorKind.POLICY_ERROR
        return
    episode.turns += 1
    episode.prompt_tokens += _count(turn.prompt_tokens)
    episode.completion_tokens += _count(turn.completion_tokens)
    calls = _normalized_calls(turn)
    content = turn.content if isinstance(turn.content, str) else str(turn.content)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            if c.id
            else {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    episode.messages.append(message)

    if turn.parse_error or calls is None:
        episode.outcome, episode.format_error = Outcome.FORMAT_ERROR, FormatErrorKind.UNPARSABLE
        return
    if not calls:
        episode.outcome, episode.format_error = Outcome.FORMAT_ERROR, FormatErrorKind.NO_TOOL_CALL
        return
    if any(call.name not in TOOL_NAMES for call in calls):
        episode.outcome, episode.format_error = Outcome.FORMAT_ERROR, FormatErrorKind.UNKNOWN_TOOL
        return
    for call in calls:
        key = json.dumps([call.name, call.arguments], sort_keys=True, default=str)
        episode.call_counts[key] = episode.call_counts.get(key, 0) + 1
        result = call_tool(episode.tools, call.name, call.arguments)
        tool_message: dict[str, Any] = {"role": "tool", "name": call.name, "content": result}
        if call.id:
            tool_message["tool_call_id"] = call.id
        episode.messages.append(tool_message)
        if episode.tools.trace.answered:
            episode.outcome = Outcome.IDK  # provisional: judged in _to_episode
            return


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _normalized_calls(turn: PolicyTurn) -> list[ToolCall] | None:
    """The turn's tool calls with JSON-string arguments decoded; None if any call is malformed."""
    if not isinstance(turn.tool_calls, list):
        return None
    calls = []
    for call in turn.tool_calls:
        if not isinstance(call, ToolCall) or not isinstance(call.name, str):
            return None
        arguments = call.arguments
        if isinstance(arguments, str) and not arguments.strip():
            arguments = {}  # a call without arguments, as some OpenAI-style servers send it
        try:
            arguments = decode_arguments(arguments)
        except ValueError:
            return None
        calls.append(ToolCall(name=call.name, arguments=arguments, id=call.id if isinstance(call.id, str) else ""))
    return calls


def _check_budgets(episode: _Live, turn: PolicyTurn, config: RunnerConfig, started: float) -> None:
    context = _count(turn.prompt_tokens) + _count(turn.completion_tokens)
    if (
        episode.turns >= config.max_turns
        or context > config.max_context_tokens
        or time.perf_counter() - started > config.timeout_s
        or max(episode.call_counts.values(), default=0) >= config.max_repeated_calls
    ):
        episode.outcome = Outcome.RAN_OUT


def _judged_outcome(task: EpisodeTask, answer: str, judge: Judge) -> Outcome:
    scenario = task.scenario
    says_idk = is_idk(answer)
    if scenario is None:
        # No golden answer (live traffic): nothing to judge against; the reward stays None.
        return Outcome.IDK if says_idk else Outcome.WRONG
    if not scenario.answerable:
        return Outcome.CORRECT if says_idk else Outcome.WRONG
    if says_idk:
        return Outcome.IDK
    try:
        verdict = judge.judge(task.question, scenario.answer, answer)
    except Exception as exc:  # an LLM judge that fails falls back to the deterministic rules
        log.warning("judge failed (%s), using the deterministic judge", exc)
        verdict = DeterministicJudge().judge(task.question, scenario.answer, answer)
    return Outcome.CORRECT if verdict.correct else Outcome.WRONG


def _to_episode(episode: _Live, policy: Policy, config: RunnerConfig, judge: Judge) -> Episode:
    task, trace = episode.task, episode.tools.trace
    outcome = episode.outcome or Outcome.RAN_OUT
    if trace.answered and outcome != Outcome.FORMAT_ERROR:
        outcome = _judged_outcome(task, trace.final_answer or "", judge)

    reward: float | None = None
    components: dict[str, float] = {}
    if task.scenario is not None:
        gold = list(task.scenario.source_ids) if task.scenario.answerable else []
        observation = RubricObservation(
            outcome=outcome,
            sources=list(trace.sources),
            gold_source_ids=gold,
            found_gold=bool(trace.seen_ids & set(gold)),
            read_gold=bool(set(trace.reads) & set(gold)),
            turns=episode.turns,
            max_turns=config.max_turns,
            format_error=episode.format_error,
        )
        result = score(observation, config.rubric)
        reward, components = result.total, result.components

    cost = (
        episode.prompt_tokens * config.prompt_price_per_m + episode.completion_tokens * config.completion_price_per_m
    ) / 1e6
    ended = episode.ended or time.perf_counter()
    latency_ms = round((ended - episode.started) * 1000, 3)
    simulation = getattr(policy, "simulation", None)  # a rule-based agent playing an API model (api_models.py)
    if simulation is not None:
        cost, latency_ms = simulation.cost_per_episode_usd, simulation.latency_ms
    return Episode(
        tenant=task.tenant,
        inbox_id=task.inbox,
        task_category=task.scenario.category if task.scenario else None,
        scenario_id=task.scenario.id if task.scenario else None,
        question=task.question,
        policy_version=task.policy_version or str(getattr(policy, "version", "unknown")),
        messages=episode.messages,
        final_answer=trace.final_answer,
        sources=list(trace.sources),
        outcome=outcome,
        reward=reward,
        reward_components=components,
        turns=episode.turns,
        prompt_tokens=episode.prompt_tokens,
        completion_tokens=episode.completion_tokens,
        latency_ms=latency_ms,
        cost_usd=cost,
    )

