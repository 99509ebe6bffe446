"""A judge that remembers its verdicts: served traffic replays the same scenarios, so the same (question, golden
answer, answer) comes back again and again, and the deterministic rules need not run twice on it."""

from __future__ import annotations

import threading
from collections import OrderedDict

from agent_rl.environments.answers import Judge, Verdict


class MemoJudge:
    """`judge`'s verdicts, the last `size` of them remembered; safe to share between threads. Only for a judge
    whose verdict depends on its three texts alone (the deterministic one), or remembering would change answers."""

    def __init__(self, judge: Judge, size: int = 4096) -> None:
        self._judge = judge
        self._verdicts: OrderedDict[tuple[str, str, str], Verdict] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def judge(self, question: str, golden: str, answer: str) -> Verdict:
        key = (question, golden, answer)
        with self._lock:
            verdict = self._verdicts.get(key)
            if verdict is not None:
                self._verdicts.move_to_end(key)
                return verdict
        verdict = self._judge.judge(question, golden, answer)
        with self._lock:
            self._verdicts[key] = verdict
            if len(self._verdicts) > self._size:
                self._verdicts.popitem(last=False)
        return verdict
