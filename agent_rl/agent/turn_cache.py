"""Attention caches of earlier turns, so a conversation's next turn computes only its new tokens.

An agent episode re-sends its whole history every turn: system prompt, question, every tool call
and tool result so far. Without a cache each turn recomputes all of it (on CPU the prompt pass is
most of an evaluation). Each entry here holds one row's keys and values for a token sequence (a
prompt plus what was generated after it); a later prompt reuses the longest common prefix with any
entry, so a turn whose earlier text renders the same way pays only for the tool result and the new
turn header. Entries are dropped once a longer one supersedes them, and least-recently-used ones
once `max_tokens` (or `max_bytes`) is exceeded.

Entries carry a key (the policy and adapter that computed them): a lookup only reuses entries of its own key,
so several versions can share one cache, and one memory budget, without reading each other's states.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(eq=False)
class CachedRow:
    tokens: np.ndarray  # int64 token ids the keys/values were computed for: a prompt, then generated tokens
    layers: list[tuple[Any, Any]]  # per layer (keys, values), each [1, kv_heads, len(tokens), head_dim]
    prompt_length: int  # a row resuming at least this far continues this conversation (not just its system prompt)
    key: Any = None  # who computed it (policy, adapter): entries are only reused by the same key
    nbytes: int = 0


@dataclass
class TurnCacheStats:
    hits: int = 0  # rows that resumed from an entry (lookups whose match was used)
    reused_tokens: int = 0
    evicted: int = 0


class TurnCache:
    def __init__(self, max_tokens: int, max_bytes: int | None = None) -> None:
        self.max_tokens = max_tokens
        self.max_bytes = max_bytes
        self._rows: list[CachedRow] = []  # least recently used first
        self.stats = TurnCacheStats()
        # Reentrant: dropping a key can run from a finalizer while this thread is inside another method.
        self._lock = threading.RLock()

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    @property
    def tokens(self) -> int:
        return sum(len(row.tokens) for row in list(self._rows))

    @property
    def nbytes(self) -> int:
        return sum(row.nbytes for row in list(self._rows))

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()

    def drop_key(self, key: Any) -> None:
        """Forget every entry computed under `key` (an adapter that was unloaded)."""
        with self._lock:
            self._rows = [row for row in self._rows if row.key != key]

    def lookup(self, prompt: list[int], key: Any = None) -> tuple[int, CachedRow | None]:
        """The entry of `key` sharing the longest prefix with `prompt`, and that length (at most len(prompt) - 1:
        the last prompt token is always fed, it yields the first logits)."""
        with self._lock:
            return self._lookup(prompt, key)

    def _lookup(self, prompt: list[int], key: Any) -> tuple[int, CachedRow | None]:
        if not self._rows or len(prompt) < 2:
            return 0, None
        ids = np.asarray(prompt, dtype=np.int64)
        best, best_row = 0, None
        for row in self._rows:
            if row.key != key:
                continue
            n = min(len(row.tokens), len(ids) - 1)
            if n <= best:
                continue
            differ = np.flatnonzero(row.tokens[:n] != ids[:n])
            common = int(differ[0]) if differ.size else n
            if common > best:
                best, best_row = common, row
        if best_row is not None:
            self._rows.remove(best_row)  # most recently used
            self._rows.append(best_row)
        return best, best_row

    def record_use(self, reused: list[int]) -> None:
        """Count the rows of a batch that resumed from an entry, and the tokens they did not recompute."""
        with self._lock:
            self.stats.hits += sum(1 for n in reused if n)
            self.stats.reused_tokens += sum(reused)

    def add(self, tokens: list[int], layers: list[tuple[Any, Any]], prompt_length: int,
            resumed: tuple[int, CachedRow | None] = (0, None), key: Any = None) -> None:
        """Keep `layers` for `tokens` (`prompt_length` of them were the prompt). `resumed` is what this row
        started from: (tokens reused, entry). An entry whose whole prompt was reused is this conversation's
        previous turn, now superseded; one shared only up to a common system prompt stays for its own
        conversation."""
        if not self.enabled or len(tokens) > self.max_tokens:
            return
        ids = np.asarray(tokens, dtype=np.int64)
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if self.max_bytes is not None and nbytes > self.max_bytes:
            return
        with self._lock:
            reused, start = resumed
            if start is not None and reused >= start.prompt_length and start in self._rows:
                self._rows.remove(start)
            self._rows = [row for row in self._rows if not (row.key == key and np.array_equal(row.tokens, ids))]
            self._rows.append(CachedRow(ids, layers, prompt_length, key, nbytes))
            total, total_bytes = self.tokens, self.nbytes
            while len(self._rows) > 1 and (total > self.max_tokens
                                           or (self.max_bytes is not None and total_bytes > self.max_bytes)):
                oldest = self._rows.pop(0)
                total -= len(oldest.tokens)
                total_bytes -= oldest.nbytes
                self.stats.evicted += 1
