"""The episode runner: plays a policy against any environment's tools, batched, within turn, token and time budgets.

Each turn the runner gathers the conversations still running and asks the policy for all of
their next turns in one `act` call, executes the tool calls on each episode's own tool session, and
stops a conversation when its session records a final answer, it breaks the format, or it runs out of
budget. A policy that batches concurrent calls itself (`Policy.concurrent_turns`: an engine server) is instead
played with `batch_size` episodes in flight: each asks for its next turn as soon as its tools have answered, and a
finished episode's place goes to the next task at once, so no episode waits for the slowest turn of a wave. The environment judges the result (agent_rl/environments); the email assistant, for example:
- correct / wrong / idk: the answer as judged against the task's reference answer
  ("I don't know" on an unanswerable question is correct);
- format_error: an unparsable tool call, an unknown tool, a turn of plain text with no tool
  call (answers must come through the final-answer tool so they carry citations; an environment that
  `answers_in_words` takes that turn as the answer instead), or a policy that raised or returned garbage;
- unserved (`Episode.unserved`): the serving stack could not answer at all (`PolicyUnavailable`: an engine down, an
  upstream unreachable); recorded as a policy error but flagged, so no caller stores or scores it;
- ran_out: no answer within max_turns, the context-token budget or the wall-clock timeout, or a model
  that loops (the same tool call max_repeated_calls times).
Bad tool *arguments* are not format errors: the tool answers with an error the model can fix.
Nothing a policy does makes the runner raise.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from agent_rl.environments.core import Environment, FinalAnswer, Task, Trajectory, copy_json
from agent_rl.environments.messages import policy_calls
from agent_rl.environments.policy import Conversation, Policy, PolicyTurn, PolicyUnavailable, RowRoutedPolicy
from agent_rl.environments.rubric import FormatErrorKind
from agent_rl.environments.sessions import call_session_tool, judge_episode
from agent_rl.records import Episode, Outcome
from agent_rl.turn_budget import DEFAULT_MAX_TURNS, DEFAULT_TURN_TOKENS

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
    max_new_tokens: PositiveInt = Field(DEFAULT_TURN_TOKENS, description="generation limit per assistant turn, passed to "
                                        "the policy (as in evaluation and GRPO: agent_rl/turn_budget.py)")
    timeout_s: float | None = Field(300.0, gt=0, description="wall clock per batch of episodes (per episode when "
                                    "they are in flight), checked between turns (serving's bound on a stuck batch); "
                                    "None: none (held-out evaluation)")
    batch_size: PositiveInt = Field(32, description="episodes played together; each turn is one policy.act call "
                                    "(in flight: episodes whose turns are asked for at once)")
    in_flight: bool = Field(True, description="play a policy that declares concurrent_turns with batch_size episodes "
                            "in flight (False: in waves, as every other policy)")
    prompt_price_per_m: float = Field(0.0, ge=0, description="USD per million prompt tokens")
    completion_price_per_m: float = Field(0.0, ge=0, description="USD per million completion tokens")


@dataclass
class Play:
    """One task to play in an environment, and whose episode it is."""

    task: Task
    policy_version: str | None = None  # defaults to policy.version
    tenant: str = "default"


@dataclass
class _Live:
    """A running episode's state."""

    play: Play
    session: Any
    messages: list[dict[str, Any]]
    started: float
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    outcome: Outcome | None = None
    format_error: FormatErrorKind | None = None
    ended: float = 0.0
    call_counts: dict[str, int] = field(default_factory=dict)
    words: str | None = None  # the reply in words that ended the episode (an environment that answers in words)
    unserved: PolicyUnavailable | None = None  # why the policy could not answer

    @property
    def done(self) -> bool:
        return self.outcome is not None


def play_episodes(policy: Policy, environment: Environment, plays: list[Play],
                  config: RunnerConfig | None = None) -> list[Episode]:
    """Play every task in `environment` with `policy`, in batches of `config.batch_size`; one Episode per
    task, in order."""
    config = config or RunnerConfig()
    if config.in_flight and getattr(policy, "concurrent_turns", False) is True and len(plays) > 1:
        return _play_in_flight(policy, environment, plays, config)
    episodes: list[Episode] = []
    for start in range(0, len(plays), config.batch_size):
        episodes.extend(_run_batch(policy, environment, plays[start : start + config.batch_size], config))
    return episodes


def _run_batch(policy: Policy, environment: Environment, plays: list[Play], config: RunnerConfig) -> list[Episode]:
    schemas = environment.tool_schemas()
    names = frozenset(environment.tool_names())
    started = time.perf_counter()
    live = [_Live(play=p, session=environment.open(p.task), messages=environment.opening_messages(p.task),
                  started=started) for p in plays]

    while running := [episode for episode in live if not episode.done]:
        turns = _act(policy, [episode.messages for episode in running], schemas, config.max_new_tokens,
                     [episode.play.policy_version for episode in running])
        for episode, turn in zip(running, turns):
            _apply_turn(environment, names, episode, turn)
            if not episode.done:
                _check_budgets(episode, turn, config, started)
            if episode.done:
                episode.ended = time.perf_counter()

    return [_to_episode(environment, episode, policy, config) for episode in live]


def _play_in_flight(policy: Policy, environment: Environment, plays: list[Play],
                    config: RunnerConfig) -> list[Episode]:
    """Up to `batch_size` episodes in flight, each turn one `act` call from a worker thread. Tools, budgets and
    judging stay on this thread (sessions need not be thread-safe); a policy thread only reads its episode's
    messages while this thread leaves that episode alone. Measured with vLLM for CPU: docs/benchmarks.md."""
    schemas = environment.tool_schemas()
    names = frozenset(environment.tool_names())
    live: list[_Live | None] = [None] * len(plays)
    waiting = iter(range(len(plays)))
    pending: dict[Future, int] = {}
    pool = ThreadPoolExecutor(max_workers=min(config.batch_size, len(plays)), thread_name_prefix="runner")

    def ask(index: int) -> None:
        episode = live[index]
        pending[pool.submit(_act, policy, [episode.messages], schemas, config.max_new_tokens,
                            [episode.play.policy_version])] = index

    def start_next() -> None:
        index = next(waiting, None)
        if index is not None:
            play = plays[index]
            live[index] = _Live(play=play, session=environment.open(play.task),
                                messages=environment.opening_messages(play.task), started=time.perf_counter())
            ask(index)

    try:
        for _ in range(min(config.batch_size, len(plays))):
            start_next()
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                index = pending.pop(future)
                episode, turn = live[index], future.result()[0]  # _act never raises: a failure is a None turn (or the PolicyUnavailable)
                _apply_turn(environment, names, episode, turn)
                if not episode.done:
                    _check_budgets(episode, turn, config, episode.started)
                if episode.done:
                    episode.ended = time.perf_counter()
                    start_next()
                else:
                    ask(index)
    finally:
        # Interrupted (a stop signal): turns not yet asked for are dropped instead of waited on.
        pool.shutdown(wait=not pending, cancel_futures=True)
    return [_to_episode(environment, episode, policy, config) for episode in live]


def _act(policy: Policy, conversations: list[Conversation], schemas: list[dict], max_new_tokens: int,
         versions: list[str | None] | None = None) -> list[Any]:
    """The policy's turns, or one `None` (policy error) per conversation it failed to answer (the
    `PolicyUnavailable` itself where the serving stack could not answer). A policy serving
    several versions at once (RowRoutedPolicy) is told each conversation's routed version."""
    try:
        # Policies get copies: one that edits its input cannot corrupt the recorded episode. A policy
        # that declares it only reads them (the heuristic) is spared the copy, a cost on every turn.
        if getattr(policy, "reads_conversations_only", False) is True:
            given = list(conversations)
        else:
            given = [copy_json(c) for c in conversations]
        if isinstance(policy, RowRoutedPolicy):
            turns = policy.act_rows(versions or [None] * len(given), given, schemas, max_new_tokens)
        else:
            turns = policy.act(given, schemas, max_new_tokens)
    except PolicyUnavailable as exc:
        log.warning("policy %s unavailable: %s", getattr(policy, "version", "?"), exc)
        return [exc] * len(conversations)
    except Exception as exc:
        log.warning("policy %s raised %s: %s", getattr(policy, "version", "?"), type(exc).__name__, exc)
        return [None] * len(conversations)
    if not isinstance(turns, list) or len(turns) != len(conversations):
        log.warning("policy returned %s turns for %d conversations", _describe(turns), len(conversations))
        return [None] * len(conversations)
    return turns


def _describe(value: Any) -> str:
    return str(len(value)) if isinstance(value, list) else type(value).__name__


def _apply_turn(environment: Environment, names: frozenset[str], episode: _Live, turn: Any) -> None:
    if not isinstance(turn, PolicyTurn):
        episode.outcome, episode.format_error = Outcome.FORMAT_ERROR, FormatErrorKind.POLICY_ERROR
        if isinstance(turn, PolicyUnavailable):
            episode.unserved = turn
        return
    episode.turns += 1
    episode.prompt_tokens += _count(turn.prompt_tokens)
    episode.completion_tokens += _count(turn.completion_tokens)
    calls = policy_calls(turn)
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
        if environment.capabilities.answers_in_words:
            episode.words, episode.outcome = content, Outcome.IDK  # provisional: judged in _to_episode
        else:
            episode.outcome, episode.format_error = Outcome.FORMAT_ERROR, FormatErrorKind.NO_TOOL_CALL
        return
    if any(call.name not in names for call in calls):
        episode.outcome, episode.format_error = Outcome.FORMAT_ERROR, FormatErrorKind.UNKNOWN_TOOL
        return
    for call in calls:
        key = json.dumps([call.name, call.arguments], sort_keys=True, default=str)
        episode.call_counts[key] = episode.call_counts.get(key, 0) + 1
        result = call_session_tool(environment, episode.session, call.name, call.arguments)
        tool_message: dict[str, Any] = {"role": "tool", "name": call.name, "content": result}
        if call.id:
            tool_message["tool_call_id"] = call.id
        episode.messages.append(tool_message)
        if environment.final_answer(episode.session) is not None:
            episode.outcome = Outcome.IDK  # provisional: judged in _to_episode
            return


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _check_budgets(episode: _Live, turn: PolicyTurn, config: RunnerConfig, started: float) -> None:
    context = _count(turn.prompt_tokens) + _count(turn.completion_tokens)
    if (
        episode.turns >= config.max_turns
        or context > config.max_context_tokens
        or (config.timeout_s is not None and time.perf_counter() - started > config.timeout_s)
        or max(episode.call_counts.values(), default=0) >= config.max_repeated_calls
    ):
        episode.outcome = Outcome.RAN_OUT


def _to_episode(environment: Environment, episode: _Live, policy: Policy, config: RunnerConfig) -> Episode:
    task = episode.play.task
    answer = environment.final_answer(episode.session)
    if answer is None and episode.words is not None:
        answer = FinalAnswer(episode.words)
    trajectory = Trajectory(messages=episode.messages, turns=episode.turns, max_turns=config.max_turns,
                            format_error=episode.format_error.value if episode.format_error else None,
                            answer=answer)
    judgement = judge_episode(environment, task, episode.session, trajectory)
    cost = (
        episode.prompt_tokens * config.prompt_price_per_m + episode.completion_tokens * config.completion_price_per_m
    ) / 1e6
    ended = episode.ended or time.perf_counter()
    latency_ms = round((ended - episode.started) * 1000, 3)
    simulation = getattr(policy, "simulation", None)  # a rule-based agent playing an API model (api_models.py)
    if simulation is not None:
        cost, latency_ms = simulation.cost_per_episode_usd, simulation.latency_ms
    return Episode(
        tenant=episode.play.tenant,
        environment=environment.name,
        context=task.context,
        task_category=task.category if task.reference is not None else None,
        task_id=task.id if task.reference is not None else None,
        question=task.prompt,
        policy_version=episode.play.policy_version or str(getattr(policy, "version", "unknown")),
        messages=episode.messages,
        final_answer=answer.text if answer is not None else None,
        citations=list(answer.citations) if answer is not None else [],
        outcome=judgement.outcome,
        reward=judgement.reward,
        reward_components=judgement.components,
        turns=episode.turns,
        prompt_tokens=episode.prompt_tokens,
        completion_tokens=episode.completion_tokens,
        latency_ms=latency_ms,
        cost_usd=cost,
        unserved=episode.unserved,
    )
