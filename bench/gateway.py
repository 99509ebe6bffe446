"""Benchmark of the arbiter's OpenAI-compatible gateway: its overhead over calling the same upstream directly.

Three processes on loopback: a fast OpenAI-compatible upstream (asyncio, answers every call at once with
a tool call), the arbiter serving the gateway (one worker, routing 100% to `openai:{...}` at that
upstream, pool on SQLite or PostgreSQL), and this driver: `--agents` agent loops at a time (64 by
default), each running `--rounds` gateway sessions in turn, a session being `--calls` chat completions whose
conversation grows by the reply and a tool result, then the end of its episode. Half the sessions name
themselves in the URL (/s/{id}/v1), half are grouped by the conversation they extend. The same loops then
run against the upstream directly.

Reported (one JSON line at the end):
  - overhead_ms p50/p99: the gateway's own time per call, from its Server-Timing header (`total` minus
    `episode`, which is the upstream call): parsing, auth, rate limit, session lookup, recording, response.
    The target, p99 <= 5 ms, is on this figure.
  - upstream_leg_ms p50/p99: the gateway's call to the upstream as the gateway saw it (the upstream's own
    time plus waiting for the gateway's event loop);
  - added_latency_ms p50/p99: client-side latency through the gateway minus direct, for the record: on a
    machine with few (shared) cores it also holds the queueing of three busy processes on those cores.
  - throughput (calls/s) through the gateway and directly, and their ratio;
  - episodes_sent vs episodes_written (target: none lost).

With `--upstream-ms 200` the upstream takes 200 ms per call like a fast hosted model: the agent loops then
send fewer calls than the gateway can take, and added latency is the gateway's work rather than queueing
for CPU (with an instant upstream, 64 closed-loop agents saturate one gateway process, and on a few
shared cores the added latency is mostly that queue: see gateway_cpu_ms_per_call for the work itself).

With `--workers N` the arbiter runs N worker processes on one socket (live episodes shared through the pool);
`--compare-workers N` runs the gateway with one worker and then with N in the same run and reports both
(throughput, its ratio to one worker's, own time p50/p99, episodes sent vs written). Each agent spreads its
calls over `--connections` connections (2 by default), so a session's calls reach different workers; every
session must stay one episode on one version (`sticky`, `sessions_split`; routing is 50/50 between two
versions of the same upstream) and every written episode hold all its calls (`episodes_whole`).
Targets with a comparison: N workers >= 1.3x one worker's throughput, own p99 <= 5 ms for both.

With `--pg-outage 3` the pool is a private PostgreSQL server (tests/pg_server.py) stopped for 3 s a second
into the gateway run: calls go on, explicit ends answer 503 while it is down and are sent again, and
every episode must still be written.

    OMP_NUM_THREADS=1 .venv/bin/python bench/gateway.py [--agents 64] [--calls 6] [--rounds 6] [--pool-url URL]
    OMP_NUM_THREADS=1 .venv/bin/python bench/gateway.py --pg-outage 3
    OMP_NUM_THREADS=1 .venv/bin/python bench/gateway.py --compare-workers 4
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_P99_OVERHEAD_MS = 5.0
TARGET_WORKERS_RATIO = 1.3
_MODEL = re.compile(rb'"model":\s*"([^"]*)"')
_TIMING = re.compile(rb"server-timing: total;dur=([0-9.]+), episode;dur=([0-9.]+)", re.IGNORECASE)
_EPISODE = re.compile(rb"x-agent-rl-episode: ([A-Za-z0-9-]+)", re.IGNORECASE)
_LENGTH = re.compile(rb"content-length: (\d+)", re.IGNORECASE)
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


# -- the fast upstream (its own process) --------------------------------------------------------------


async def _upstream(port: int, delay_s: float = 0.0) -> None:
    counter = itertools.count()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = _LENGTH.search(head)
                body = await reader.readexactly(int(length.group(1))) if length else b""
                n = next(counter)
                if delay_s:
                    await asyncio.sleep(delay_s)  # a model's thinking time: waiting, no CPU
                request = json.loads(body) if body else {}
                turns = sum(1 for m in request.get("messages", ()) if m.get("role") == "assistant")
                payload = json.dumps({
                    "id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()), "model": "fast",
                    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                        "role": "assistant", "content": None, "tool_calls": [{
                            "id": f"call_{n}", "type": "function",
                            "function": {"name": "calculator", "arguments": json.dumps({"expression": f"{turns} + {n}"})}}]}}],
                    "usage": {"prompt_tokens": 20 + 10 * turns, "completion_tokens": 12, "total_tokens": 32 + 10 * turns},
                }).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(payload)).encode() + b"\r\n\r\n" + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def _serve_gateway(port: int, pool_url: str, workers: int = 1) -> None:
    from agent_rl.arbiter.config import ArbiterConfig
    from agent_rl.arbiter.server import serve

    config = ArbiterConfig(pool_url=pool_url, gateway_rate_per_s=1e6, gateway_rate_burst=1_000_000,
                           routing_ttl_s=1.0, episode_workers=4)
    profile = os.environ.get("AGENT_RL_BENCH_PROFILE")  # a path: write cProfile stats of the gateway there
    if not profile:
        serve(config, port=port, log_level="warning", workers=workers)
        return
    import cProfile
    import signal

    import uvicorn

    from agent_rl.arbiter.server import uvicorn_config

    server = uvicorn.Server(uvicorn_config(config, "127.0.0.1", port, "warning"))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    cProfile.runctx("server.run()", globals(), locals(), profile)


# -- the driver ----------------------------------------------------------------------------------


async def _call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, token: str,
                body: bytes) -> tuple[int, bytes, bytes, float]:  # fmt: skip
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    started = time.perf_counter()
    writer.write(head + body)
    header = await reader.readuntil(b"\r\n\r\n")
    length = _LENGTH.search(header)
    payload = await reader.readexactly(int(length.group(1))) if length else b""
    elapsed = (time.perf_counter() - started) * 1000
    return int(header.split(b" ", 2)[1]), header, payload, elapsed


async def _worker_of(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int | None:
    """Which arbiter worker process holds this connection (/healthz without credentials names it)."""
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    header = await reader.readuntil(b"\r\n\r\n")
    length = _LENGTH.search(header)
    payload = await reader.readexactly(int(length.group(1))) if length else b""
    try:
        return int(json.loads(payload)["worker"])
    except (ValueError, KeyError):
        return None


async def drive(port: int, token: str, agents: int, rounds: int, calls: int, via_gateway: bool,
                connections: int = 1) -> dict:  # fmt: skip
    """`agents` agent loops, each running `rounds` sessions of `calls` calls in turn over `connections`
    connections of its own (a session's calls take them in turn, so they reach different workers)."""
    latency: list[float] = []
    overhead: list[float] = []
    upstream_leg: list[float] = []
    errors: dict[int, int] = {}
    ended: list[str] = []
    refused_ends: list[str] = []
    sessions: list[dict] = []  # per gateway session: episode ids, models and workers its calls got
    queue = list(range(agents * rounds))

    async def worker(slot: int) -> None:
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(max(1, connections))]
        pids = [await _worker_of(*c) if via_gateway else None for c in conns]
        try:
            while queue:
                index = queue.pop()
                named = via_gateway and index % 2 == 0
                path = f"/s/bench-{index}/v1/chat/completions" if named else "/v1/chat/completions"
                messages: list[dict] = [{"role": "system", "content": "You are a calculator agent."},
                                        {"role": "user", "content": f"Task {index}: add up the numbers."}]
                episode = None
                seen = {"episodes": set(), "models": set(), "workers": set(), "calls": 0}
                for turn in range(calls):
                    which = (slot + turn) % len(conns)
                    reader, writer = conns[which]
                    body = json.dumps({"model": "agent-rl", "messages": messages, "tools": TOOLS,
                                       "temperature": 0, "max_tokens": 64}).encode()
                    status, header, payload, ms = await _call(reader, writer, path, token, body)
                    if status != 200:
                        errors[status] = errors.get(status, 0) + 1
                        break
                    latency.append(ms)
                    timing = _TIMING.search(header)
                    if timing:
                        overhead.append(float(timing.group(1)) - float(timing.group(2)))
                        upstream_leg.append(float(timing.group(2)))
                    found = _EPISODE.search(header)
                    episode = found.group(1).decode() if found else episode
                    model = _MODEL.search(payload)
                    seen["episodes"].add(episode)
                    seen["models"].add(model.group(1).decode() if model else None)
                    seen["workers"].add(pids[which])
                    seen["calls"] += 1
                    message = json.loads(payload)["choices"][0]["message"]
                    messages.append(message)
                    messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "7"})
                if via_gateway:
                    sessions.append(seen)
                if via_gateway and episode:
                    reader, writer = conns[(slot + calls) % len(conns)]  # ended through yet another connection
                    for _ in range(60):  # a 503 (pool down) keeps the episode queued; ending again is safe
                        status, _, _, _ = await _call(reader, writer, f"/v1/episodes/{episode}/end", token, b"")
                        if status != 503:
                            break
                        refused_ends.append(episode)
                        await asyncio.sleep(0.5)
                    if status == 200:
                        ended.append(episode)
                    else:
                        errors[status] = errors.get(status, 0) + 1
        finally:
            for _, writer in conns:
                writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(agents)))
    seconds = time.perf_counter() - started
    return {"latency": latency, "overhead": overhead, "upstream_leg": upstream_leg, "errors": errors, "ended": ended,
            "seconds": seconds, "refused_ends": refused_ends, "sessions": sessions}


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children so far (Linux /proc): the gateway's cost per
    call (all its workers), whatever the neighbours on a shared machine are doing."""
    total = 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        for children in Path(f"/proc/{pid}/task").glob("*/children"):
            for child in children.read_text().split():
                total += _cpu_seconds(int(child))
    except (OSError, IndexError):
        pass  # a process that just exited
    return total


def _wait_port(port: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listening on port {port} after {timeout_s} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=64, help="agent loops at a time")
    parser.add_argument("--rounds", type=int, default=6, help="sessions per loop slot")
    parser.add_argument("--calls", type=int, default=6, help="chat completions per session")
    parser.add_argument("--pool-url", default=None, help="pool for the gateway's episodes (default: SQLite in a temp dir)")
    parser.add_argument("--upstream-ms", type=float, default=0.0,
                        help="the upstream waits this long per call (0: answers at once, the gateway saturates)")
    parser.add_argument("--pg-outage", type=float, default=0.0, metavar="SECONDS",
                        help="pool on a private PostgreSQL server that is stopped this long mid-run (e.g. 3)")
    parser.add_argument("--workers", type=int, default=1, help="arbiter worker processes serving the gateway")
    parser.add_argument("--compare-workers", type=int, default=0, metavar="N",
                        help="run the gateway with one worker, then with N, and compare (overrides --workers)")
    parser.add_argument("--connections", type=int, default=2, help="connections per agent loop, taken in turn")
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-gateway", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        asyncio.run(_upstream(args.upstream, args.upstream_ms / 1000))
        return
    if args.serve_gateway:
        _serve_gateway(args.serve_gateway, args.pool_url, args.workers)
        return

    from agent_rl.arbiter.keys import ApiKey

    token, key = ApiKey.create("bench-gateway", "bench", ["*"])
    workdir = Path(tempfile.mkdtemp(prefix="agent-rl-bench-gateway-"))
    pg = None
    if args.pg_outage:
        from tests.pg_server import TestPostgres

        pg = TestPostgres().init()
        pg.start()
    try:
        run(args, token, key, workdir, pg)
    finally:
        if pg is not None:
            pg.destroy()


def _outage(pg, after_s: float, outage_s: float, log: dict) -> None:
    time.sleep(after_s)
    pg.stop("fast")
    log["stopped_at"] = time.monotonic()
    time.sleep(outage_s)
    pg.start()
    log["restarted_at"] = time.monotonic()


def _phase(args: argparse.Namespace, token: str, env: dict, spec: str, pool_url: str, workers: int, pg) -> dict:
    """The gateway with `workers` worker processes: warm-up, the measured run, every episode written."""
    import threading

    from agent_rl.arbiter.server import free_port, stop_arbiter
    from agent_rl.pool import PoolRepository

    port = free_port()
    pool = PoolRepository(pool_url)
    # Two versions of one upstream: a session that moved between versions would show in the replies' `model`.
    pool.set_routing({"fast": 0.5, "fast-b": 0.5}, {"fast": spec, "fast-b": spec}, reason="bench/gateway.py",
                     actor="bench")
    written_before = pool.count()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-gateway", str(port), "--pool-url", pool_url,
                             "--workers", str(workers)], env=env, cwd=ROOT)
    outage: dict = {}
    try:
        _wait_port(port, proc)
        asyncio.run(drive(port, token, 16, 1, 2, True, 2))  # warm-up: connections, imports, first writes
        warm_written = pool.count()
        if pg is not None:  # stop the pool a second into the gateway run
            threading.Thread(target=_outage, args=(pg, 1.0, args.pg_outage, outage), daemon=True).start()
        cpu_before = _cpu_seconds(proc.pid)
        through = asyncio.run(drive(port, token, args.agents, args.rounds, args.calls, True, args.connections))
        cpu = _cpu_seconds(proc.pid) - cpu_before
        deadline = time.monotonic() + 60
        while pg is not None and "restarted_at" not in outage and time.monotonic() < deadline:
            time.sleep(0.2)
        while True:  # episodes ended without an explicit answer are written by the background flusher
            try:
                written = pool.count() - warm_written
            except Exception:  # the pool is still coming back
                written = -1
            if written >= args.agents * args.rounds or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        stored = [pool.get(episode) for episode in through["ended"]]
    finally:
        stop_arbiter(proc, 90)
        pool.close()
    sessions = through["sessions"]
    sent = args.agents * args.rounds
    return {
        "through": through, "written": written, "written_before": written_before, "outage": outage, "cpu": cpu,
        "summary": {
            "workers": workers,
            "calls": len(through["latency"]),
            "throughput_gateway_rps": round(len(through["latency"]) / through["seconds"], 1),
            "overhead_ms_p50": round(percentile(through["overhead"], 50), 3),
            "overhead_ms_p99": round(percentile(through["overhead"], 99), 3),
            "gateway_cpu_ms_per_call": round(1000 * cpu / max(1, len(through["latency"])), 3),
            "episodes_sent": sent,
            "episodes_written": written,
            "episodes_lost": sent - written,
            # Each session one episode holding all its calls, on one version, wherever its calls landed:
            "episodes_whole": sum(1 for e in stored if e is not None and e.turns == args.calls),
            "sessions_split": sum(1 for s in sessions if len(s["episodes"]) > 1),
            "sticky": all(len(s["models"]) == 1 for s in sessions),
            "sessions_across_workers": sum(1 for s in sessions if len(s["workers"]) > 1),
            "errors": {str(k): v for k, v in through["errors"].items()},
        },
    }


def run(args: argparse.Namespace, token: str, key, workdir: Path, pg) -> None:
    from agent_rl.arbiter.server import free_port, stop_arbiter

    up_port = free_port()
    spec = "openai:" + json.dumps({"base_url": f"http://127.0.0.1:{up_port}/v1", "model": "fast"})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENT_RL_HOME": str(workdir / "home"),
           "AGENT_RL_API_KEYS": json.dumps([key.model_dump(mode="json")])}
    upstream = subprocess.Popen([sys.executable, __file__, "--upstream", str(up_port), "--upstream-ms",
                                 str(args.upstream_ms)], env=env, cwd=ROOT)
    counts = [1, args.compare_workers] if args.compare_workers else [args.workers]
    phases: dict[int, dict] = {}
    try:
        _wait_port(up_port, upstream)
        direct = asyncio.run(drive(up_port, token, args.agents, args.rounds, args.calls, False, args.connections))
        for workers in counts:
            pool_url = pg.url if pg is not None else args.pool_url or f"sqlite:///{workdir / f'pool-{workers}w.db'}"
            phases[workers] = _phase(args, token, env, spec, pool_url, workers, pg)
        direct_2 = asyncio.run(drive(up_port, token, args.agents, args.rounds, args.calls, False, args.connections))
    finally:
        stop_arbiter(upstream, 60)  # the upstream stub stops the same way
    print(json.dumps(_report(args, pg, counts, phases, direct, direct_2)), flush=True)


def _report(args: argparse.Namespace, pg, counts: list[int], phases: dict[int, dict], direct: dict,
            direct_2: dict) -> dict:  # fmt: skip
    """The JSON line: the last phase's figures at the top (as before), every phase's summary, the comparison."""
    main = phases[counts[-1]]
    through, written, outage, summary = main["through"], main["written"], main["outage"], main["summary"]
    direct_latency = direct["latency"] + direct_2["latency"]
    direct_rps = len(direct_latency) / (direct["seconds"] + direct_2["seconds"])
    gateway_rps = len(through["latency"]) / through["seconds"]
    sent = args.agents * args.rounds
    report = {
        "bench": "gateway",
        "agents_concurrent": args.agents,
        "calls_per_session": args.calls,
        "connections_per_agent": args.connections,
        "workers": counts[-1],
        "upstream_ms": args.upstream_ms,
        "pool": "postgresql" if pg is not None or (args.pool_url or "").startswith("postgresql") else "sqlite",
        "calls": len(through["latency"]),
        "overhead_ms_p50": summary["overhead_ms_p50"],
        "overhead_ms_p99": summary["overhead_ms_p99"],
        "upstream_leg_ms_p50": round(percentile(through["upstream_leg"], 50), 3),
        "upstream_leg_ms_p99": round(percentile(through["upstream_leg"], 99), 3),
        "latency_ms_direct_p50": round(percentile(direct_latency, 50), 3),
        "latency_ms_direct_p99": round(percentile(direct_latency, 99), 3),
        "latency_ms_gateway_p50": round(percentile(through["latency"], 50), 3),
        "latency_ms_gateway_p99": round(percentile(through["latency"], 99), 3),
        "added_latency_ms_p50": round(percentile(through["latency"], 50) - percentile(direct_latency, 50), 3),
        "added_latency_ms_p99": round(percentile(through["latency"], 99) - percentile(direct_latency, 99), 3),
        "gateway_cpu_ms_per_call": summary["gateway_cpu_ms_per_call"],
        "throughput_direct_rps": round(direct_rps, 1),
        "throughput_gateway_rps": round(gateway_rps, 1),
        "throughput_ratio": round(gateway_rps / direct_rps, 3),
        "errors": {str(k): v for k, v in {**direct["errors"], **through["errors"]}.items()},
        "episodes_sent": sent,
        "episodes_ended": len(through["ended"]),
        "episodes_written": written,
        "episodes_lost": sent - written,
        "episodes_before_run": main["written_before"],
        "episodes_whole": summary["episodes_whole"],
        "sessions_split": summary["sessions_split"],
        "sessions_across_workers": summary["sessions_across_workers"],
        "sticky": all(p["summary"]["sticky"] for p in phases.values()),
        "pg_outage_s": args.pg_outage,
        "ends_refused_503": len(through["refused_ends"]),
        "outage_happened_during_run": bool(outage.get("stopped_at")) if pg is not None else None,
        "by_workers": {str(n): p["summary"] for n, p in phases.items()},
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    met = report["sticky"] and not report["errors"] and all(
        p["summary"]["overhead_ms_p99"] <= TARGET_P99_OVERHEAD_MS and p["summary"]["episodes_lost"] == 0
        and p["summary"]["sessions_split"] == 0 and not p["summary"]["errors"] for p in phases.values())
    if len(counts) > 1:
        ratio = phases[counts[-1]]["summary"]["throughput_gateway_rps"] / phases[1]["summary"]["throughput_gateway_rps"]
        report["throughput_ratio_workers"] = round(ratio, 3)
        report["target_throughput_ratio_workers"] = TARGET_WORKERS_RATIO
        met = met and ratio >= TARGET_WORKERS_RATIO
    report["meets_target"] = bool(met)
    return report


if __name__ == "__main__":
    main()
