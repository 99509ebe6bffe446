"""While a test routes two versions on engines of their own, each engine computes on its share of the cores; alone,
a version has every core. The routing may come from anyone (the A/B controller writes the pool, not the arbiter):
the arbiter follows it, moves a version in the background while the old copy keeps answering, and lets go of the
versions the routing dropped. Policies here are stand-ins that record the cores they were loaded on (starting vLLM
engines takes a minute each); the engine side, `placed_on` into `shared_engine`, is checked on its own below."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import weakref

import pytest

from agent_rl.agent import engine as engine_module
from agent_rl.arbiter.placement import core_shares
from agent_rl.arbiter.policies import PolicyCache
from agent_rl.arbiter.routing import Router
from agent_rl.pool import PoolRepository


class Version:
    """A loaded version: the spec, the cores it computes on, whether it has an engine of its own."""

    def __init__(self, spec: str, cores, placeable: bool) -> None:
        self.spec, self.cores, self.placeable = spec, cores, placeable


class Loader:
    """Loads stand-ins on the cores `placed_on` gives; `hold` makes loads of a spec wait (an engine starting)."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, tuple[int, ...] | None]] = []
        self.hold: dict[str, threading.Event] = {}

    def __call__(self, spec: str) -> Version:
        cores = engine_module._PLACEMENT.get()
        self.loads.append((spec, cores))
        if spec in self.hold:
            self.hold[spec].wait(10)
        return Version(spec, cores, placeable=spec != "teacher")


def cache(loader: Loader) -> PolicyCache:
    return PolicyCache(loader, may_place=lambda spec: spec != "teacher", cores=(0, 1))


def test_the_cores_are_shared_in_proportion_to_traffic_one_at_least_each():
    assert core_shares({"v1": 0.9, "v2": 0.1}, (0, 1)) == {"v1": (0,), "v2": (1,)}
    assert core_shares({"v1": 0.9, "v2": 0.1}, tuple(range(16))) == {"v1": tuple(range(14)), "v2": (14, 15)}
    assert core_shares({"v1": 0.5, "v2": 0.5}, tuple(range(8))) == {"v1": (0, 1, 2, 3), "v2": (4, 5, 6, 7)}
    assert core_shares({"v1": 1.0}, (0, 1)) == {}  # alone: every core
    assert core_shares({"v1": 0.5, "v2": 0.0}, (0, 1)) == {}  # a version at 0% has no share
    assert core_shares({"a": 0.4, "b": 0.3, "c": 0.3}, (0, 1)) == {}  # more versions than cores: every core


def test_a_test_starting_places_both_versions_and_the_challenger_starts_once():
    loader = Loader()
    policies = cache(loader)
    policies.arrange({"mlflow:v1": 1.0})
    assert policies.placement() == {"mlflow:v1": None}  # alone: every core
    old = weakref.ref(policies.get("mlflow:v1"))

    policies.arrange({"mlflow:v1": 0.9, "mlflow:v2": 0.1})
    assert policies.wait_placed(10)
    assert policies.placement() == {"mlflow:v1": (0,), "mlflow:v2": (1,)}
    assert loader.loads == [("mlflow:v1", None), ("mlflow:v2", (1,)), ("mlflow:v1", (0,))]
    assert policies.get("mlflow:v1").cores == (0,)
    gc.collect()
    assert old() is None  # nothing holds the copy on every core: its engine stops


def test_the_old_copy_answers_until_the_moved_one_is_up():
    loader = Loader()
    policies = cache(loader)
    policies.arrange({"mlflow:v1": 1.0, "mlflow:v2": 0.0})
    loader.hold["mlflow:v1"] = threading.Event()
    policies.arrange({"mlflow:v1": 0.5, "mlflow:v2": 0.5})
    assert policies.get("mlflow:v1").cores is None  # still loading on core 0: requests go to the running copy
    loader.hold["mlflow:v1"].set()
    assert policies.wait_placed(10)
    assert policies.get("mlflow:v1").cores == (0,)


def test_the_winner_gets_every_core_back_and_the_loser_is_let_go():
    loader = Loader()
    policies = cache(loader)
    policies.arrange({"mlflow:v1": 0.5, "mlflow:v2": 0.5})
    loser = weakref.ref(policies.get("mlflow:v1"))
    routed = {"mlflow:v2": 1.0}
    policies.arrange(routed)
    policies.retain(routed)
    assert policies.wait_placed(10)
    assert policies.placement() == {"mlflow:v2": None}
    assert loader.loads[2:] == [("mlflow:v2", None)]  # the loser is not started again anywhere
    gc.collect()
    assert loser() is None


def test_a_version_without_an_engine_of_its_own_is_never_moved_nor_counted():
    loader = Loader()
    policies = cache(loader)
    policies.arrange({"teacher": 0.9, "mlflow:v1": 0.1})
    assert policies.wait_placed(10)
    assert policies.placement() == {"teacher": None, "mlflow:v1": None}  # v1 is the only engine: every core
    assert loader.loads == [("teacher", None), ("mlflow:v1", None)]


def test_without_placement_nothing_is_placed():
    loader = Loader()
    policies = PolicyCache(loader, cores=(0, 1))
    policies.arrange({"mlflow:v1": 0.5, "mlflow:v2": 0.5})
    assert loader.loads == []  # arrange does nothing; requests load as before, on every core
    assert policies.get("mlflow:v2").cores is None


def test_the_arbiter_sees_a_routing_another_writer_put_in_the_pool(sqlite_url):
    pool = PoolRepository(sqlite_url)
    seen = []
    router = Router(pool, {"mlflow:v1": 1.0}, ttl_s=0)
    router.watch(lambda split: seen.append(dict(split.weights)))
    router.current()
    pool.set_routing({"v1": 0.9, "v2": 0.1}, {"v1": "mlflow:v1", "v2": "mlflow:v2"}, "A/B test started",
                     "challenger_sensor", None)
    router.current()
    router.current()  # the same routing read again is no change
    assert seen == [{"v1": 0.9, "v2": 0.1}]


def test_a_placed_merged_version_asks_for_an_engine_on_its_cores(monkeypatch, tmp_path):
    asked = []

    class Engine:
        config = engine_module.EngineConfig(model=str(tmp_path), cores=(1,))

    monkeypatch.setattr(engine_module, "shared_engine", lambda model, **options: asked.append(options) or Engine())
    monkeypatch.setattr(engine_module, "merged_checkpoint", lambda base, adapters: tmp_path)
    monkeypatch.setattr(engine_module, "EnginePolicy", lambda engine, tokenizer, **kw: kw)
    monkeypatch.setenv(engine_module.VERSIONS_ENV, "merged")
    from transformers import AutoTokenizer

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda path: None)
    monkeypatch.setattr("agent_rl.agent.models.resolve_model", lambda name: tmp_path)
    with engine_module.placed_on((1,)):
        engine_module.engine_policy("base", [tmp_path / "adapter"], version="v2")
    engine_module.engine_policy("base", [tmp_path / "adapter"], version="v1")
    assert [options["cores"] for options in asked] == [(1,), None]
    assert engine_module.engine_key(tmp_path, (1,)) != engine_module.engine_key(tmp_path)


def test_the_same_split_listed_in_another_order_moves_nothing():
    loader = Loader()
    policies = cache(loader)
    policies.arrange({"mlflow:v2": 0.5, "mlflow:v1": 0.5})
    policies.arrange({"mlflow:v1": 0.5, "mlflow:v2": 0.5})
    assert policies.wait_placed(10)
    assert len(loader.loads) == 2  # each version started once


def test_a_retain_returns_after_the_version_another_retain_dropped_has_stopped():
    """Two writers drop the same version at once (the admin's PUT and the routing watcher): whichever returns,
    the dropped version's engine has stopped by then (a rolled-back engine never outlives the rollback call)."""
    releasing, stopped = threading.Event(), threading.Event()

    class Held(Version):
        def release(self) -> None:
            releasing.wait(10)

    def stop() -> None:
        threading.Event().wait(0.3)  # an engine takes a while to stop
        stopped.set()

    policies = PolicyCache(lambda spec: Held(spec, None, True), may_place=lambda spec: True, cores=(0, 1))
    weakref.finalize(policies.get("mlflow:v2"), stop)
    first = threading.Thread(target=policies.retain, args=(["mlflow:v1"],))
    first.start()
    threading.Event().wait(0.1)  # the first retain holds the dropped version, releasing it
    second = threading.Thread(target=policies.retain, args=(["mlflow:v1"],))
    second.start()
    releasing.set()
    second.join(10)
    assert stopped.is_set(), "a retain returned while the version dropped by another was still stopping"
    first.join(10)


def test_closing_lets_every_version_go_and_a_move_in_progress_drops_what_it_loads():
    """An arbiter that stops leaves no engine behind, not even one a move was still starting."""
    loader = Loader()
    policies = cache(loader)
    policies.arrange({"mlflow:v1": 1.0})
    loader.hold["mlflow:v1"] = threading.Event()
    policies.arrange({"mlflow:v1": 0.5, "mlflow:v2": 0.5})  # v1 moves to core 0 in the background, held
    old = weakref.ref(policies.get("mlflow:v1"))
    policies.close()
    assert policies.loaded() == [] and old() is None
    loader.hold["mlflow:v1"].set()  # the move's engine comes up after the close
    assert policies.wait_placed(10)
    gc.collect()
    assert policies.loaded() == [] and policies.placement() == {}
    policies.arrange({"mlflow:v1": 0.5, "mlflow:v2": 0.5})  # a routing change after the close starts nothing
    assert not any(isinstance(obj, Version) and obj.spec == "mlflow:v1" for obj in gc.get_objects())


def test_the_old_copy_yields_the_cpu_while_its_replacement_starts_and_takes_it_back_if_the_move_fails():
    """A version moved to its share starts a new engine there while the old one keeps serving on every core; the old
    engine yields the CPU meanwhile, or the start-up starves (it once ran past its 10-minute timeout on 2 cores)."""
    events: list[tuple[str, object]] = []

    class Yielding(Version):
        def yield_cpu(self, yielding: bool = True) -> None:
            events.append(("yield" if yielding else "unyield", self.cores))

    started = threading.Event()

    def loader(spec: str):
        cores = engine_module._PLACEMENT.get()
        if cores == (0,):
            events.append(("start", cores))
            started.set()
            if spec == "mlflow:broken":
                raise RuntimeError("the engine did not answer")
        return Yielding(spec, cores, placeable=True)

    policies = PolicyCache(loader, may_place=lambda spec: True, cores=(0, 1))
    policies.arrange({"mlflow:v1": 1.0})
    policies.arrange({"mlflow:v1": 0.9, "mlflow:v2": 0.1})
    assert policies.wait_placed(10)
    assert events == [("yield", None), ("start", (0,))]  # the old copy (every core) yielded before the start-up

    events.clear()
    policies.arrange({"mlflow:broken": 1.0})
    policies.arrange({"mlflow:broken": 0.9, "mlflow:v2": 0.1})
    assert policies.wait_placed(10)
    assert events == [("yield", None), ("start", (0,)), ("unyield", None)]
    assert policies.get("mlflow:broken").cores is None  # it keeps answering where it was, at its old priority


def _nice_of_every_thread(pgid: int) -> list[int]:
    """The niceness of every thread of every process in a process group, read from /proc."""
    from pathlib import Path

    nices = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != pgid:
                continue
            for task in (proc / "task").iterdir():
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                nices.append(int(fields[16]))  # field 19 of stat; the 3rd after the name is fields[0]
        except (OSError, ProcessLookupError):
            continue
    return nices


@pytest.mark.skipif(sys.platform != "linux", reason="process groups' niceness read from /proc")
def test_an_engine_yields_with_its_whole_process_tree_every_thread_of_it(tmp_path):
    """vLLM's front end, engine core and worker are three processes with many threads each: a niceness set on the
    front end's pid alone would move one thread. A stand-in tree (a child process, threads in both) shows all move."""
    script = ("import subprocess, sys, threading, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import threading, time; "
              "[threading.Thread(target=time.sleep, args=(60,), daemon=True).start() for _ in range(3)]; "
              "time.sleep(60)'])\n"
              "[threading.Thread(target=time.sleep, args=(60,), daemon=True).start() for _ in range(3)]\n"
              "print('up', flush=True); time.sleep(60)\n")
    server = engine_module.EngineServer(engine_module.EngineConfig(model=str(tmp_path)))
    server.process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True,
                                      stdout=subprocess.PIPE, text=True)
    try:
        assert server.process.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 10
        while len(_nice_of_every_thread(server.process.pid)) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_nice_of_every_thread(server.process.pid)) >= 8  # 2 processes, 4 threads each at least
        assert server.set_niceness(engine_module.YIELD_NICENESS)
        assert set(_nice_of_every_thread(server.process.pid)) == {engine_module.YIELD_NICENESS}
        privileged = os.geteuid() == 0
        assert server.set_niceness(0) is privileged  # lowering it again needs privilege; refused quietly otherwise
        assert set(_nice_of_every_thread(server.process.pid)) == {0 if privileged else engine_module.YIELD_NICENESS}
    finally:
        server.stop(grace_s=5)
    assert not server.set_niceness(5)  # a stopped engine: nothing to set


def test_a_versions_engine_yields_relative_to_the_niceness_it_inherited_and_returns_to_it():
    """An arbiter run niced (a batch host, `nice make demo`) starts its engines niced too: yielding adds to that, and
    a failed move gives the engine back the niceness it started with, never more priority than its owner has."""
    set_to: list[int] = []

    class Engine:
        def set_niceness(self, niceness: int) -> bool:
            set_to.append(niceness)
            return True

    policy = engine_module.EnginePolicy.__new__(engine_module.EnginePolicy)  # only the engine and placement matter
    policy.engine, policy.placeable = Engine(), True
    own = os.getpriority(os.PRIO_PROCESS, 0)
    policy.yield_cpu(True)
    policy.yield_cpu(False)
    assert set_to == [min(19, own + engine_module.YIELD_NICENESS), own]
    policy.placeable = False  # a shared engine serves other versions too: it never yields
    policy.yield_cpu(True)
    assert len(set_to) == 2
