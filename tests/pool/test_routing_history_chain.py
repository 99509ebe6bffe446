"""Concurrent routing changes on SQLite and PostgreSQL: every change is recorded once, and the history is a
chain (each record's old weights are the previous record's new weights), so an audit can replay it."""

from __future__ import annotations

import threading

from agent_rl.pool import PoolRepository

THREADS = 8
CHANGES_EACH = 5


def test_concurrent_routing_changes_keep_the_history_a_chain(store_url):
    PoolRepository(store_url).close()  # the tables exist before the threads race
    start = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def change(thread: int) -> None:
        pool = PoolRepository(store_url)  # its own engine, like another arbiter worker process
        try:
            start.wait()
            for i in range(CHANGES_EACH):
                share = (thread * CHANGES_EACH + i + 1) / (THREADS * CHANGES_EACH + 1)
                pool.set_routing({"main": 1 - share, f"cand-{thread}": share}, reason=f"t{thread} step {i}", actor=f"t{thread}")
        except BaseException as exc:  # reported below, with the thread that raised it
            errors.append(exc)
        finally:
            pool.close()

    threads = [threading.Thread(target=change, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors

    pool = PoolRepository(store_url)
    try:
        history = pool.routing_history()
        current = pool.get_routing().weights
    finally:
        pool.close()
    assert len(history) == THREADS * CHANGES_EACH
    assert sorted(h.reason for h in history) == sorted(f"t{t} step {i}" for t in range(THREADS) for i in range(CHANGES_EACH))
    assert history[0].old_weights == {}
    for previous, record in zip(history, history[1:]):
        assert record.old_weights == previous.new_weights, (previous.reason, record.reason)
    assert history[-1].new_weights == current
