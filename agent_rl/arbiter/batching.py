"""Collect concurrent requests for the same policy into one runner call, run off the event loop.

A local transformers policy generates a whole batch at once, so requests that arrive together
should share a call. Each spec gets a lane; a lane runs at most `max_concurrent` batches at a
time, and requests that arrive meanwhile wait and form the next batch (so batches grow with
load even when the window is 0). Versions served as adapters on one shared base name the same lane
(`submit(..., lane=...)`): their requests form mixed-version batches, decoded together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from agent_rl.environments.runner import Play
from agent_rl.records import Episode

# Plays a batch (each task's spec, the tasks); returns the episodes and the seconds spent playing them (not
# logging them).
RunBatch = Callable[[list[str], list[Play]], tuple[list[Episode], float]]


@dataclass
class _Lane:
    pending: list[tuple[str, Play, asyncio.Future]] = field(default_factory=list)
    scheduled: bool = False
    running: int = 0


class EpisodeBatcher:
    def __init__(self, run: RunBatch, executor: Executor, window_s: float, max_batch: int, max_concurrent: int) -> None:
        self._run = run
        self._executor = executor
        self._window_s = window_s
        self._max_batch = max_batch
        self._max_concurrent = max_concurrent
        self._lanes: dict[str, _Lane] = {}

    async def submit(self, spec: str, task: Play, lane: str | None = None) -> tuple[Episode, float]:
        """The episode for `task`, and the seconds its batch spent being played. Tasks of one `lane` (default:
        the spec) are batched together."""
        loop = asyncio.get_running_loop()
        key = lane or spec
        queue = self._lanes.setdefault(key, _Lane())
        future: asyncio.Future = loop.create_future()
        queue.pending.append((spec, task, future))
        self._schedule(key, queue, loop)
        return await future

    def depth(self) -> dict[str, int]:
        """Requests waiting for a batch and batches running, over all lanes."""
        lanes = list(self._lanes.values())
        return {"waiting": sum(len(lane.pending) for lane in lanes), "running_batches": sum(l.running for l in lanes)}

    def _schedule(self, spec: str, lane: _Lane, loop: asyncio.AbstractEventLoop) -> None:
        if lane.scheduled or not lane.pending or lane.running >= self._max_concurrent:
            return
        lane.scheduled = True
        if self._window_s > 0:
            loop.call_later(self._window_s, self._start_batch, spec, lane, loop)
        else:
            loop.call_soon(self._start_batch, spec, lane, loop)

    def _start_batch(self, spec: str, lane: _Lane, loop: asyncio.AbstractEventLoop) -> None:
        lane.scheduled = False
        batch, lane.pending = lane.pending[: self._max_batch], lane.pending[self._max_batch :]
        batch = [(s, task, fut) for s, task, fut in batch if not fut.cancelled()]  # client went away
        if not batch:
            self._schedule(spec, lane, loop)
            return
        lane.running += 1
        work = loop.run_in_executor(self._executor, self._run, [s for s, _, _ in batch], [task for _, task, _ in batch])
        work.add_done_callback(lambda done: self._finish(spec, lane, loop, batch, done))
        self._schedule(spec, lane, loop)

    def _finish(self, spec: str, lane: _Lane, loop: asyncio.AbstractEventLoop, batch: list, done: asyncio.Future) -> None:
        lane.running -= 1
        error = done.exception()
        if error is None:
            episodes, seconds = done.result()
            if len(episodes) != len(batch):
                error = RuntimeError(f"runner returned {len(episodes)} episodes for {len(batch)} tasks")
        for i, (_, _, future) in enumerate(batch):
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            elif episodes[i].unserved is not None:  # the policy could not answer: the caller's 503
                future.set_exception(episodes[i].unserved)
            else:
                future.set_result((episodes[i], seconds))
        self._schedule(spec, lane, loop)
