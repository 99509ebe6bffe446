"""Replay an environment's tasks as traffic through a running arbiter, with bounded concurrency, and summarize what
came back. Requests go out as fast as answers come back (a closed loop: the pool filling up), or arriving on their
own at a rate, as independent users do (an open loop: the A/B test, where each version's load must be its share).

This is how the benchmark pool fills up without real users: each replayable task (the email assistant's questions)
becomes one `POST /v1/ask` (with its id as `task_id`, so the episode is judged), cycling through the
tasks when more requests than tasks are asked for. The API key must be allowed to replay and to use the tasks'
contexts; without that the arbiter serves the requests as unjudged live traffic or refuses them.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import httpx

from agent_rl.records import Split

API_KEY_ENV = "AGENT_RL_API_KEY"


@dataclass
class ReplaySummary:
    sent: int = 0
    ok: int = 0
    errors_by_status: dict[str, int] = field(default_factory=dict)  # "503", or "connect" for transport errors
    per_version: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    answered: list[tuple[str, str]] = field(default_factory=list, repr=False)  # (episode_id, policy_version)

    @property
    def requests_per_s(self) -> float:
        return self.sent / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "ok": self.ok,
            "errors_by_status": self.errors_by_status,
            "per_version": self.per_version,
            "outcomes": self.outcomes,
            "elapsed_s": round(self.elapsed_s, 3),
            "requests_per_s": round(self.requests_per_s, 1),
        }


class Replayable(Protocol):
    """What a replay sends: an environment's `Task` (its `context` and `prompt`), or a record that carries them under
    the email assistant's older names (`records.Scenario`: `inbox_id` and `question`)."""

    @property
    def id(self) -> str: ...

    @property
    def split(self) -> Split: ...


ReplayableT = TypeVar("ReplayableT", bound=Replayable)


def select_tasks(tasks: Sequence[ReplayableT], split: Split | str | None, n: int | None) -> list[ReplayableT]:
    """The tasks of `split` (all when None), repeated in order until there are `n` of them."""
    chosen = [t for t in tasks if split is None or t.split == Split(split)]
    if not chosen:
        raise ValueError(f"no tasks{f' in split {split!r}' if split else ''} to replay")
    if n is None:
        return chosen
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [chosen[i % len(chosen)] for i in range(n)]


async def replay(
    url: str,
    tasks: Sequence[Replayable],
    concurrency: int = 16,
    timeout_s: float = 120.0,
    on_done: Callable[[bool], None] | None = None,
    key_prefix: str = "replay",
    api_key: str | None = None,
    rate: float | None = None,
    seed: int = 0,
) -> ReplaySummary:
    """Send one request per task (in order) with at most `concurrency` in flight; never raises on HTTP errors.

    Without `rate`, each of `concurrency` senders sends its next request when its answer came back. With `rate`
    (requests per second), requests arrive at random intervals averaging 1/rate (a Poisson process, `seed`ed),
    whether or not earlier ones were answered: users do not wait for one another. Where versions are served apart
    (one engine each, as the A/B test on CPU), a closed loop leaves the slower version holding more of the senders,
    so its load, and with it its latency, grows with its slowness; arriving on their own, each version's load is its
    share of the traffic. `concurrency` then only caps what is in flight (an arbiter that cannot keep up).
    `api_key` defaults to $AGENT_RL_API_KEY.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be a positive number of requests per second, got {rate}")
    api_key = api_key or os.environ.get(API_KEY_ENV)
    if not api_key:
        raise ValueError(f"no API key: pass api_key or set {API_KEY_ENV} (a key allowed to replay tasks)")
    summary = ReplaySummary()
    statuses: Counter[str] = Counter()
    versions: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    next_index = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=timeout_s, limits=limits, headers=headers) as client:

        async def send(i: int, task: Replayable) -> None:
            body = {
                "context": _field(task, "context", "inbox_id"),
                "question": _field(task, "prompt", "question"),
                "task_id": task.id,
                # A distinct key per request spreads requests over the split like independent users.
                "request_key": f"{key_prefix}-{i}",
            }
            ok = False
            try:
                response = await client.post("/v1/ask", json=body)
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
            else:
                if response.status_code == 200:
                    data = response.json()
                    versions[data["policy_version"]] += 1
                    outcomes[data["outcome"]] += 1
                    summary.answered.append((data["episode_id"], data["policy_version"]))
                    ok = True
                else:
                    statuses[str(response.status_code)] += 1
            summary.sent += 1
            summary.ok += ok
            if on_done is not None:
                on_done(ok)

        # A fixed set of workers pulling the next index: bounded concurrency without one task per request.
        async def worker() -> None:
            nonlocal next_index
            while next_index < len(tasks):
                i = next_index
                next_index += 1
                await send(i, tasks[i])

        # Arrivals on their own: each request starts at its arrival time, waiting only for a free slot.
        async def arrivals(per_s: float) -> None:
            gaps, slots, loop = random.Random(seed), asyncio.Semaphore(concurrency), asyncio.get_running_loop()

            async def arrive(i: int, at: float) -> None:
                await asyncio.sleep(max(0.0, at - loop.time()))
                async with slots:
                    await send(i, tasks[i])

            at, arriving = loop.time(), []
            for i in range(len(tasks)):
                arriving.append(arrive(i, at))
                at += gaps.expovariate(per_s)
            await asyncio.gather(*arriving)

        started = time.perf_counter()
        if rate is None:
            await asyncio.gather(*(worker() for _ in range(min(concurrency, max(1, len(tasks))))))
        else:
            await arrivals(rate)
        summary.elapsed_s = time.perf_counter() - started

    summary.errors_by_status = dict(statuses)
    summary.per_version = dict(versions)
    summary.outcomes = dict(outcomes)
    return summary


def _field(task: Replayable, name: str, record_name: str) -> Any:
    """A task's field, or the same field of a `records.Scenario` under its own name (when the task's is missing or
    empty)."""
    return getattr(task, name, None) or getattr(task, record_name)
