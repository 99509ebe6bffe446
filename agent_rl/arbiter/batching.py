"""Collect concurrent requests for the same policy into one runner call, run off the event loop.

A local transformers policy generates a whole batch at once, so requests that arrive together
should share a call. Each spec gets a lane; a lane runs at most `max_concurrent` batches at a
time, and requests that arrive meanwhile wait and form the next batch (so batches grow with
load even when the window is 0).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from agent_rl.agent.runner import EpisodeTask
from agent_rl.records import Episode

# Plays a batch for a spec; returns the episodes and the seconds spent playing them (not logging them).
RunBatch = Callable[[str, list[EpisodeTask]], tuple[list[Episode], float]]


@dataclass
class _Lane:
    pending: list[tuple[EpisodeTask, asyncio.Future]] = field(default_factory=list)
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

    async def submit(self, spec: str, task: EpisodeTask) -> tuple[Episode, float]:
        """The episode for `task`, and the seconds its batch spent being played."""
        loop = asyncio.get_running_loop()
        lane = self._lanes.setdefault(spec, _Lane())
        future: asyncio.Future = loop.create_future()
        lane.pending.append((task, future))
        self._schedule(spec, lane, loop)
        return await future

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
        batch = [(task, fut) for task, fut in batch if not fut.cancelled()]  # client went away
        if not batch:
            self._schedule(spec, lane, loop)
            return
        lane.running += 1
        work = loop.run_in_executor(self._executor, self._run, spec, [task for task, _ in batch])
        work.add_done_callback(lambda done: self._finish(spec, lane, loop, batch, done))
        self._schedule(spec, lane, loop)

    def _finish(self, spec: str, lane: _Lane, loop: asyncio.AbstractEventLoop, batch: list, done: asyncio.Future) -> None:
        lane.running -= 1
        error = done.exception()
        if error is None:
            episodes, seconds = done.result()
            if len(episodes) != len(batch):
                error = RuntimeError(f"runner returned {len(episodes)} episodes for {len(batch)} tasks")
        for i, (_, future) in enumerate(batch):
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result((episodes[i], seconds))
        self._schedule(spec, lane, loop)
