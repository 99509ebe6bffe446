"""`make demo ENV=gateway`: a week of an agent that is not ours, end to end, through the arbiter's gateway.

The outside agent is its own program (`examples/outside_agent.py`): a mail assistant written on the official
`openai` client that declares its tools, runs the calls it gets back against its own mailbox backend and sends
the results back, talking to the gateway over HTTP with an API key of its own. Its users are simulated
(`agent_rl/simulated_users/users.py`): each asks a question whose right answer only the simulation knows, is satisfied
or not with stated noise (the hidden truth, written to a file the loop never reads), re-asks, corrects, thanks,
complains, leaves, and a few percent rate through the gateway's feedback endpoint. Production behind the gateway
is the demo's production agent (the rule-based reader in the fast profile, the simulated o3 otherwise), routed by
the arbiter like any version.

Then the loop runs its week on that traffic with `AGENT_RL_ENV=gateway`: the labeler learns from the ratings and
labels the rest only if its check passes, curation, SFT (GRPO is skipped: the tools run in the client), validation
by replaying held-out good episodes (rated, or labeled) against production's incumbent, and, when a challenger is
registered, the A/B sensors on more of the same users' traffic, deciding on their live feedback. The summary
shows where the training rows came from (ratings or labels) and how the labeler agrees with the hidden truth.

The A/B traffic is sized to the decision, not cut in fixed rounds: users go to the test in small chunks and the
rollout sensor looks after each one, until the sequential test promotes or rolls back, or the bound is reached
(`--ab-max-users`, `--ab-max-minutes`). A chunk is as small as keeps a look's fixed cost (the outside program's
start, the wait for the gateway's episodes, the sensor) at about a tenth of the chunk's time (`ab_looks`,
`next_chunk`); the mSPRT is always valid, so looking after every chunk costs the test nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demos import run as demo_run

OUTSIDE_PROGRAM = Path(__file__).resolve().parents[1] / "examples" / "outside_agent.py"
# The fast profile's production is the email demo's (the rule-based reader), the full one's the simulated o3.
PRODUCTION = {"fast": "heuristic", "demo": demo_run.SIMULATED_PRODUCTION["email"][0]}
# Per profile: users in the week (enough rated episodes for the labeler's check at a 5% rating share, and clean
# episodes for curation's volume gate: fast 300, demo 5000), and the A/B test's bound: users in all (what the fixed
# rounds allowed before: fast 4 x 600, demo 8 x 1000) and wall-clock minutes of A/B traffic.
SIZES = {"fast": {"users": 3000, "ab_max_users": 2400, "ab_max_minutes": 10.0},
         "demo": {"users": 6000, "ab_max_users": 8000, "ab_max_minutes": 180.0}}
# The fixed rounds the A/B test used to run in (--ab-users x --ab-rounds, deprecated: they now only set the bound).
OLD_ROUNDS = {"fast": {"ab_users": 600, "ab_rounds": 4}, "demo": {"ab_users": 1000, "ab_rounds": 8}}
# A/B chunks: users between two looks of the rollout sensor, sized so that a look's fixed cost is about OVERHEAD_SHARE
# of the chunk's traffic, between MIN_CHUNK (3 waves of 8 concurrent users) and MAX_CHUNK users (at the 10% step and
# 5% rating, ~2-3 rated challenger episodes: one chunk never overshoots a decision by much). A look costs 1.5-2.2 s on
# 2 cores (2026-11-29, Intel Xeon with AMX, 2 cores, under a neighbour's load): the outside program's start ~1.5 s,
# the sensor 0.1-0.5 s on a few hundred test episodes (growing ~0.5 ms an episode: ~4.4 s at 8,000), the waits for
# routing and episodes ~0.05 s; small beside a chunk, so each chunk starts the program anew.
OVERHEAD_SHARE = 0.10
MIN_CHUNK = 25
MAX_CHUNK = 500
# The gateway's per-key rate limit (20/s by default) would hold the simulated users back: the demo's arbiter
# allows this many calls per second to the outside agent's key.
GATEWAY_RATE = 1000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="the tiny random model: the loop's mechanics in minutes")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--env", default="gateway")
    parser.add_argument("--weeks", type=int, default=1, help="only 1: one week of the outside agent")
    parser.add_argument("--incumbent", default=None, help="not supported with the gateway (production is the "
                        "outside agent's model)")
    parser.add_argument("--users", type=int, default=None, help="simulated users in the week (fast 3000, full 6000)")
    parser.add_argument("--rated-share", type=float, default=0.05, help="share of users who rate (thumbs up/down)")
    parser.add_argument("--noise", default="default", help="users' noise preset: default, noisy, very_noisy")
    parser.add_argument("--backend-error-rate", type=float, default=0.05,
                        help="share of the outside agent's tool calls its backend fails")
    parser.add_argument("--lowercase-share", type=float, default=0.0,
                        help="share of re-asks users type all in lower case (default 0: lower-cased place names "
                             "survive anonymization and no_pii_leak stops the week; 0.3 shows it)")
    parser.add_argument("--production", default=None, help="the policy spec production routes the gateway to "
                        "(default: heuristic fast, api-sim:o3 full)")
    parser.add_argument("--ab-max-users", type=int, default=None,
                        help="the A/B test's bound: most simulated users sent to it in all, undecided (fast 2400, "
                             "full 8000)")
    parser.add_argument("--ab-max-minutes", type=float, default=None,
                        help="the A/B test's bound: most wall-clock minutes of A/B traffic, undecided (fast 10, "
                             "full 180); no chunk is started that would end after it")
    parser.add_argument("--ab-chunk", type=int, default=None,
                        help="users between two looks of the rollout sensor (default: sized so that a look's fixed "
                             f"cost stays ~{OVERHEAD_SHARE:.0%} of a chunk, {MIN_CHUNK} to {MAX_CHUNK} users)")
    parser.add_argument("--ab-users", type=int, default=None,
                        help="deprecated (the test ran in rounds of this many users): with --ab-rounds, sets "
                             "--ab-max-users to their product")
    parser.add_argument("--ab-rounds", type=int, default=None, help="deprecated: see --ab-users")
    parser.add_argument("--labeler-min-auc", type=float, default=None,
                        help="this run's bar for the labeler's out-of-fold AUC (default: the profile's)")
    parser.add_argument("--labeler-max-ece", type=float, default=None,
                        help="this run's bar for the labeler's calibration error (default: the profile's)")
    parser.add_argument("--concurrency", type=int, default=8, help="users talking to the agent at once")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from agent_rl.curation.live import judged_by_users
    from agent_rl.simulated_users.population import NOISE_PRESETS

    if not judged_by_users(args.env):
        parser.error(f"--env {args.env!r}: this driver runs the gateway's demo only")
    if args.weeks != 1:
        parser.error("--weeks: the gateway's demo runs one week of the outside agent (WEEKS=1)")
    if args.incumbent not in (None, ""):
        parser.error("--incumbent: the gateway's demo starts on the outside agent's production model; 'ours' (v0) "
                     "is for the built-in environments")
    if args.noise not in NOISE_PRESETS:
        parser.error(f"--noise {args.noise!r}: expected one of {', '.join(NOISE_PRESETS)}")
    if not 0 < args.rated_share <= 1 or not 0 <= args.backend_error_rate <= 1 or not 0 <= args.lowercase_share <= 1:
        parser.error("--rated-share must be in (0, 1], --backend-error-rate and --lowercase-share in [0, 1]")
    profile = "fast" if args.fast else "demo"
    args.deprecated = ""
    for name in ("ab_users", "ab_rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.ab_users is not None or args.ab_rounds is not None:
        if args.ab_max_users is not None:
            parser.error("--ab-users/--ab-rounds are deprecated and set --ab-max-users: give one or the other")
        old = OLD_ROUNDS[profile]
        users, rounds = args.ab_users or old["ab_users"], args.ab_rounds or old["ab_rounds"]
        args.ab_max_users = users * rounds
        args.deprecated = (f"--ab-users/--ab-rounds are deprecated: the A/B test no longer runs in rounds, it looks "
                           f"after every chunk of users; read as --ab-max-users {args.ab_max_users} ({rounds} x "
                           f"{users})")
        print(f"note: {args.deprecated}", file=sys.stderr, flush=True)
    sizes = SIZES[profile]
    for name in ("users", "ab_max_users", "ab_max_minutes"):
        if getattr(args, name) is None:
            setattr(args, name, sizes[name])
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.ab_chunk is not None and args.ab_chunk < 1:
        parser.error("--ab-chunk must be at least 1")
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    args.production = args.production or PRODUCTION["fast" if args.fast else "demo"]
    return args


@dataclass
class OutsideAgent:
    """The outside program's folder, its gateway key and the arbiter URL it talks to; each run of users after the
    first goes on with new users (`next_index`)."""

    folder: Path
    token: str
    url: str = ""
    next_index: int = 0
    runs: list[dict] = field(default_factory=list)

    def prepare(self) -> dict:
        return _run_program(["prepare", "--dir", str(self.folder)])

    def users(self, args: argparse.Namespace, n: int, label: str, progress: bool = True) -> dict:
        """`n` simulated users talk to the agent through the gateway; returns the program's summary. Without
        `progress` the program's "k/n users done" lines are not echoed (an A/B chunk prints its own line)."""
        truth = self.folder / f"truth-{label}.jsonl"
        summary = _run_program(
            ["run", "--dir", str(self.folder), "--base-url", f"{self.url}/v1", "--users", str(n), "--truth",
             str(truth), "--seed", str(args.seed), "--first-index", str(self.next_index), "--rated-share",
             str(args.rated_share), "--noise", args.noise, "--backend-error-rate", str(args.backend_error_rate),
             "--concurrency", str(args.concurrency), "--max-tokens", "128", "--lowercase-share",
             str(args.lowercase_share)],
            env={"OPENAI_API_KEY": self.token}, progress=progress)
        self.next_index += n
        summary["label"] = label
        self.runs.append(summary)
        return summary


def _run_program(arguments: list[str], env: dict[str, str] | None = None, progress: bool = True) -> dict:
    """Run the outside program; its progress lines go to the console (unless `progress` is off), its last line is
    its JSON summary."""
    process = subprocess.Popen([sys.executable, str(OUTSIDE_PROGRAM), *arguments], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, **(env or {})})
    last = ""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("{"):
            last = line
        elif progress or not line.rstrip().endswith("users done"):
            print(line.rstrip(), flush=True)
    if process.wait() != 0 or not last:
        raise RuntimeError(f"the outside agent's program failed ({' '.join(arguments[:1])}, exit {process.returncode})")
    return json.loads(last)


def read_truth(path: Path) -> dict[str, dict]:
    """The simulation's hidden truth per episode id (users whose conversation got no episode are left out)."""
    out = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("episode_id"):
            out[row["episode_id"]] = row
    return out


def wait_for_episodes(pool, episode_ids: list[str], timeout_s: float = 120.0) -> int:
    """Until the gateway has written every episode the users saw end (it writes a final-tool ending in the
    background); returns how many are missing at the timeout. It looks again every 0.2 s: each A/B chunk waits
    here before the sensor's look."""
    missing = list(episode_ids)
    deadline = time.monotonic() + timeout_s
    while missing and time.monotonic() < deadline:
        missing = [e for e in missing if pool.get(e) is None]
        if missing:
            time.sleep(0.2)
    return len(missing)


def _materialized(result, asset: str) -> dict[str, Any]:
    """The metadata of `asset`'s materialization in a job result ({} when it did not materialize)."""
    for event in result.get_asset_materialization_events():
        if event.asset_key.to_user_string() == asset:
            metadata = event.event_specific_data.materialization.metadata
            return {k: getattr(v, "value", v) for k, v in metadata.items()}
    return {}


def labeler_against_truth(run: demo_run.DemoRun, truth: dict[str, dict]) -> dict[str, Any] | None:
    """The labeler, fitted exactly as `validated_episodes` fits it (the week's export, feedback as outcome, the
    rated episodes validation holds out left out: `labeler_fit_rows`), scored against the simulation's hidden
    truth on the episodes nobody rated; and its confident labels' share that contradicts the truth. None without
    an export."""
    from agent_rl.curation.datasets import load_jsonl
    from agent_rl.curation.live import judge_by_feedback, labeler_fit_rows, row_judged_by_users
    from agent_rl.feedback.labeler import against_truth, label_episodes
    from assets.pool import export_path

    path = export_path(run.partition)
    config = run.defs.resources["curation"].labeler()
    if not path.exists() or config is None:
        return None
    rows = [judge_by_feedback(r) for r in load_jsonl(path)]
    live = [r for r in rows if row_judged_by_users(r)]
    fit_on = labeler_fit_rows(live)
    result = config.label(fit_on) if callable(getattr(config, "label", None)) else label_episodes(fit_on, config)
    out: dict[str, Any] = {"report": result.report,
                           **against_truth(result.scored, {k: v["satisfied"] for k, v in truth.items()})}
    rated = [r for r in live if r.get("feedback") is not None and r["episode_id"] in truth]
    if rated:  # how often a rating itself contradicts the truth (mis-clicks)
        out["ratings_wrong"] = sum((str(r["outcome"]) == "correct") != truth[r["episode_id"]]["satisfied"]
                                   for r in rated) / len(rated)
    return out


def training_rows(run: demo_run.DemoRun) -> dict[str, int]:
    """The episodes the week's SFT rows come from, by source: rated good by a user, or labeled good by the
    labeler (the balanced episodes SFT takes: not held out, quality at or above the profile's)."""
    from agent_rl.curation.datasets import load_jsonl, quality
    from agent_rl.curation.live import FEEDBACK, LABELER, split_live
    from assets.curation import stage_dir

    path = stage_dir("balanced_episodes", run.partition) / "episodes.jsonl"
    if not path.exists():
        return {}
    train, held = split_live(load_jsonl(path))
    min_quality = run.defs.resources["curation"].min_quality
    good = [e for e in train if quality(e) >= min_quality]
    return {"from_ratings": sum(FEEDBACK in (e.get("reward_components") or {}) for e in good),
            "from_labels": sum(LABELER in (e.get("reward_components") or {}) for e in good),
            "held_out_for_validation": len(held),
            "held_out_labeled": sum(LABELER in (e.get("reward_components") or {}) for e in held)}


@dataclass(frozen=True)
class Bound:
    """How far the A/B traffic may go undecided (users in all and/or wall-clock minutes; None: no such bound), and
    how it is cut into chunks between looks: `chunk` users each, or (None) sized by `next_chunk`."""

    max_users: int | None = None
    max_minutes: float | None = None
    chunk: int | None = None
    min_chunk: int = MIN_CHUNK
    max_chunk: int = MAX_CHUNK
    overhead_share: float = OVERHEAD_SHARE

    def __post_init__(self) -> None:
        if self.max_users is None and self.max_minutes is None:
            raise ValueError("the A/B traffic needs a bound: max_users, max_minutes or both")
        for name in ("max_users", "max_minutes", "chunk"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 1 <= self.min_chunk <= self.max_chunk or not 0 < self.overhead_share < 1:
            raise ValueError("need 1 <= min_chunk <= max_chunk and 0 < overhead_share < 1")

    def describe(self) -> str:
        parts = ([f"{self.max_users} users"] if self.max_users is not None else []) + (
            [f"{self.max_minutes:g} minutes"] if self.max_minutes is not None else [])
        return " or ".join(parts)


def next_chunk(bound: Bound, sent: int, elapsed_s: float, per_user_s: float | None, overhead_s: float,
               remeasure: bool = False) -> tuple[int, str]:
    """Users to send before the next look, or (0, why the bound stops the traffic here).

    `per_user_s`: the last chunk's traffic time per user (None before the first chunk); `overhead_s`: the last
    look's fixed cost (the program's start, the waits for routing and episodes, the sensor). A chunk is the fewest
    users whose traffic takes 1/overhead_share times the overhead, within [min_chunk, max_chunk] (min_chunk before
    the first measure, and when `remeasure`: after a step the challenger serves a larger share at another speed);
    never more users than the bound leaves, nor more than fit in the minutes it leaves (with the look after them)."""
    if bound.max_users is not None and sent >= bound.max_users:
        return 0, f"the bound of {bound.max_users} A/B users was reached"
    left_s = None
    if bound.max_minutes is not None:
        left_s = bound.max_minutes * 60 - elapsed_s
        if left_s <= 0:
            return 0, (f"the bound of {bound.max_minutes:g} minutes was reached ({elapsed_s / 60:.1f} min of A/B "
                       "traffic)")
    if bound.chunk is not None:
        n = bound.chunk
    elif per_user_s is None or per_user_s <= 0 or remeasure:
        n = bound.min_chunk
    else:
        n = min(max(math.ceil(overhead_s / (bound.overhead_share * per_user_s)), bound.min_chunk), bound.max_chunk)
    if bound.max_users is not None:
        n = min(n, bound.max_users - sent)
    if left_s is not None and per_user_s is not None and per_user_s > 0:
        fits = math.floor((left_s - overhead_s) / per_user_s)
        if fits < 1:
            return 0, (f"the bound of {bound.max_minutes:g} minutes was reached: {elapsed_s / 60:.1f} min gone, and "
                       f"even one more user ({per_user_s:.1f} s) and a look ({overhead_s:.1f} s) would end after it")
        n = min(n, fits)
    return n, ""


@dataclass
class Look:
    """One chunk of A/B users and the sensor's look after it: the users the program served per version (n, rated,
    rated_up, satisfied), the routing they were served under, the sensor's decision line (with the evidence it
    read: per arm rated and labeled episodes, both lifts, the statistic) and what the look cost."""

    number: int
    users: int
    total_users: int
    elapsed_s: float
    users_s: float
    overhead_s: float
    per_version: dict[str, dict]
    routing: dict[str, float]
    decision: str
    costs: dict[str, float] = field(default_factory=dict)  # the look's cost by part, where `send` measured them

    @property
    def action(self) -> str:
        return self.decision.split(" ", 1)[0]

    @property
    def cause(self) -> str:
        """The decision's action and cause ("hold (collecting)"), to group alike looks."""
        return self.decision.split(":", 1)[0]


@dataclass
class ABRun:
    """The A/B test's traffic: its looks, whether the test decided (promote or rollback) and the users and minutes
    that took, or why the traffic stopped undecided."""

    bound: Bound
    looks: list[Look] = field(default_factory=list)
    decided: bool = False
    stop: str = ""
    decision: str = ""
    seconds: float = 0.0

    @property
    def users(self) -> int:
        return self.looks[-1].total_users if self.looks else 0


DECIDED = ("promote", "rollback")


def ab_looks(send: Callable[[int, int], dict], look: Callable[[], str], bound: Bound,
             clock: Callable[[], float] = time.monotonic, say: Callable[[str], Any] | None = None) -> ABRun:
    """Chunks of users and a look after each, until the look promotes or rolls back, no test runs any more, or the
    bound stops the traffic (never more users than `bound.max_users`, no chunk started that would end after
    `bound.max_minutes`). `send(n, number)` runs chunk `number`'s n users and returns the program's summary
    (`seconds`: its users' traffic time; `per_version`; `routing`: the weights they were served under); `look()`
    returns the sensor's decision line. The sizing is `next_chunk`'s."""
    say = say or (lambda line: print(line, flush=True))
    ab = ABRun(bound)
    started = clock()
    per_user_s: float | None = None
    overhead_s = 0.0
    while True:
        n, why = next_chunk(bound, ab.users, clock() - started, per_user_s, overhead_s,
                            remeasure=bool(ab.looks) and ab.looks[-1].action == "advance")
        if n == 0:
            ab.stop = why
            break
        before = clock()
        summary = send(n, len(ab.looks) + 1)
        sent = clock()
        decision = look()
        after = clock()
        users_s = min(float(summary.get("seconds", sent - before)), sent - before)
        row = Look(len(ab.looks) + 1, n, ab.users + n, after - started, users_s, (sent - before - users_s) +
                   (after - sent), summary.get("per_version") or {}, summary.get("routing") or {},
                   decision, {**(summary.get("costs") or {}), "sensor": after - sent})
        ab.looks.append(row)
        say(f"A/B look {row.number}: +{n} users ({row.total_users} in all, {row.elapsed_s / 60:.1f} min; "
            f"look {row.overhead_s:.1f} s) {_chunk_line(row.per_version)} -> {decision}")
        overhead_s, per_user_s = row.overhead_s, users_s / n
        if row.action in DECIDED:
            ab.decided, ab.stop = True, f"the test decided ({row.action}) at look {row.number}"
            break
        if decision.startswith("no A/B test running"):
            ab.stop = "no A/B test runs any more (finished elsewhere)"
            break
    ab.seconds = clock() - started
    last = ab.looks[-1].decision if ab.looks else "no look"
    ab.decision = last if ab.decided else (
        f"A/B test undecided after {ab.users} users in {ab.seconds / 60:.1f} min ({len(ab.looks)} looks): "
        f"{ab.stop}; last look: {last}")
    return ab


def _chunk_line(per_version: dict[str, dict]) -> str:
    return "{" + ", ".join(f"{v}: {t.get('rated', 0)} rated ({t.get('rated_up', 0)} up) of {t.get('n', 0)}"
                           for v, t in per_version.items()) + "}"


def ab_test(run: demo_run.DemoRun, outside: OutsideAgent, args: argparse.Namespace) -> tuple[str, ABRun | None]:
    """The sensors start the A/B test and route the gateway's traffic; chunks of the same users' traffic, a look of
    the rollout sensor after each, until it decides on their live feedback (the ratings, and beside them the labels
    of the week's labeler when it passed its check: agent_rl/ab/evidence.py) or the bound stops it; each look's
    line says which, per arm rated and labeled episodes, both lifts and the statistic."""
    import dagster as dg

    from pipelines.sensors import challenger_sensor, rollout_sensor

    resources = run.defs.resources
    print(challenger_sensor(dg.build_sensor_context(instance=run.instance, resources=resources)))
    other = demo_run.another_agents_test(run.pool, resources["mlflow"].model_name)
    if other:
        return f"A/B test waits: {other} is still running on this arbiter's routing table", None

    def send(n: int, number: int) -> dict:
        began = time.monotonic()
        demo_run.wait_for_routing(run.url, run.pool)
        routing = run.pool.get_routing().weights
        program = time.monotonic()
        summary = outside.users(args, n, f"ab{number}", progress=False)
        ended = time.monotonic()
        wait_for_episodes(run.pool, list(read_truth(Path(summary["truth"]))), timeout_s=60)
        costs = {"routing": program - began, "program start": max(ended - program - summary["seconds"], 0.0),
                 "episodes": time.monotonic() - ended}
        return {**summary, "routing": routing, "costs": costs}

    def look() -> str:
        outcome = rollout_sensor(dg.build_sensor_context(instance=run.instance, resources=resources))
        return getattr(outcome, "skip_message", str(outcome))

    bound = Bound(args.ab_max_users, args.ab_max_minutes, args.ab_chunk)
    print(f"A/B traffic: chunks of "
          + (f"{args.ab_chunk} users" if args.ab_chunk else f"{MIN_CHUNK}-{MAX_CHUNK} users (a look's cost "
             f"~{OVERHEAD_SHARE:.0%} of a chunk)")
          + f", a look of the rollout sensor after each, until it decides or the bound ({bound.describe()})",
          flush=True)
    ab = ab_looks(send, look, bound)
    return ab.decision, ab


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = "fast" if args.fast else "demo"
    plan = demo_run.DemoPlan(args, None, args.production, demo_run.production_version(args.production), False, profile)
    log_file = demo_run.prepare_home(plan)
    started = time.perf_counter()

    import dagster as dg

    from agent_rl import settings
    from agent_rl.agent.models import resolve_model
    from agent_rl.arbiter.keys import ApiKey
    from agent_rl.pool.repository import PoolRepository
    from assets.partitions import weekly
    from pipelines.definitions import defs

    training = defs.resources["training"]
    run = demo_run.DemoRun(plan, defs, dg.DagsterInstance.get(), log_file,
                       {"sft_adapter": training.sft().max_steps, "grpo_adapter": training.grpo().max_steps},
                       weekly.get_partition_keys()[-1], PoolRepository(settings.pool_url()))
    with demo_run.step(f"prepare the policy model ({training.base_model})"):
        print(f"model at {resolve_model(training.base_model)}")

    token, key = ApiKey.create("mail-app", "mailpal", ["*"])
    outside = OutsideAgent(Path(os.environ["AGENT_RL_HOME"]) / "outside-agent", token)
    with demo_run.step("the outside agent's app: its mailbox backend and its users' questions "
                       "(examples/outside_agent.py)"):
        prepared = outside.prepare()
        print(f"mailbox at {prepared['mailbox']}; {prepared['questions']} questions its users may ask "
              f"(right answers known to the simulation only); {len(prepared['public_terms'])} public names of its "
              "data (sites, departments, cities) for curation's public_terms")

    run.token = secrets.token_urlsafe(16)
    week: dict[str, Any] = {"production": plan.production}
    serve = ("--env", "email", "--gateway-rate-per-s", str(GATEWAY_RATE))
    with demo_run.arbiter_process(args.port, None, run.token, extra_keys=(key,), extra_args=serve) as url:
        run.url = outside.url = url
        demo_run.put_routing(url, run.token, {plan.production: 1.0}, {plan.production: args.production},
                         reason="the outside agent's production model")
        print(f"production behind the gateway: {plan.production} ({args.production}); the outside agent calls "
              f"{url}/v1/chat/completions with its own API key (tenant mailpal)", flush=True)
        with demo_run.step(f"week: {args.users} simulated users talk to the outside agent through the gateway"):
            week["traffic"] = outside.users(args, args.users, "week")
            truth = read_truth(Path(week["traffic"]["truth"]))
            missing = wait_for_episodes(run.pool, list(truth))
            print(f"{len(truth)} episodes recorded in the pool"
                  + (f"; {missing} not written after 120 s" if missing else ""), flush=True)
        with demo_run.step(f"retraining job on partition {run.partition} (labeler → curation → SFT → replay validation "
                       "→ registry; GRPO skipped)"):
            # The outside team lists its data's public names (sites, departments, cities) in curation's settings,
            # as the README asks of any agent whose data is not a plug-in's world.
            curation = {"public_terms": sorted({*defs.resources["curation"].public_terms, *prepared["public_terms"]})}
            for bar in ("labeler_min_auc", "labeler_max_ece"):
                if getattr(args, bar) is not None:  # said in the summary: the bars are the run's, not the profile's
                    curation[bar] = getattr(args, bar)
            result, failed_checks = demo_run.retrain(run, {"curation": curation})
            registered = demo_run.registered_by(result)
            print(f"retraining run {result.run_id}: {'success' if result.success else 'FAILED'}; "
                  f"challenger registered: {registered}")
        week["report"] = demo_run.read_report(run.partition, result.run_id)
        week["validated"] = _materialized(result, "validated_episodes")
        week["sft"] = _materialized(result, "sft_dataset")
        week["rows"] = training_rows(run) if week["sft"] else {}
        with demo_run.step("the labeler against the simulation's hidden truth (measurement only, outside the loop)"):
            week["labeler"] = labeler_against_truth(run, truth)
        if registered:
            with demo_run.step("A/B test: the sensors route the gateway; more users' live feedback decides"):
                week["decision"], week["ab"] = ab_test(run, outside, args)
        else:
            week["decision"], week["ab"] = demo_run.not_registered(week["report"], failed_checks), None
        week["served_after"] = run.pool.get_routing().weights
        week["min_samples"] = defs.resources["rollout"].min_samples_per_arm
        week["min_rated"] = defs.resources["rollout"].labels_min_rated_per_arm
    print_summary(args, week, started)
    if run.crashed:
        print(f"FAILED steps: {', '.join(run.crashed)} (see {log_file} and the run in the Dagster UI)")
        return 1
    return 0


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def print_summary(args: argparse.Namespace, week: dict, started: float) -> None:
    traffic, labeler, report = week["traffic"], week.get("labeler"), week.get("report")
    users = traffic["users_config"]
    print("\n================ summary (gateway: an outside agent's week) ================")
    print(f"outside agent: examples/outside_agent.py, official openai client over HTTP; production behind the gateway "
          f"{week['production']} ({args.production})")
    print(f"users: {traffic['conversations']} in {traffic['seconds']:.0f} s ({traffic['model_calls']} model calls "
          f"through the gateway); answered {traffic['answered']}, right {traffic['right']} (by the simulation's judge), "
          f"left while the agent worked {traffic['left_while_working']}, errors {traffic['errors']}")
    print(f"hidden truth: {_pct(traffic['satisfied_share'])} satisfied; reactions {traffic['reactions']}")
    print(f"noise (stated): satisfied if the answer was right {users['satisfied_if_right']:.0%}, if wrong "
          f"{users['satisfied_if_wrong']:.0%}; reactions preset '{users['noise']}' (satisfied "
          f"{_shares(users['reactions_satisfied'])}; unhappy {_shares(users['reactions_unhappy'])}); leaving per tool "
          f"round {_shares(users['leave_per_tool_round'])}; ratings by {users['rated_share']:.0%} of users, "
          f"{users['rating_flip']:.0%} mis-clicks; backend errors {traffic['backend_error_rate']:.0%} of tool calls")
    print(f"ratings: {traffic['rated']} ({traffic['rated_up']} up)")
    validated, rows = week.get("validated") or {}, week.get("rows") or {}
    if validated:
        print(f"curated episodes: {validated.get('clean')} clean of {validated.get('count_in')}; judged by a rating "
              f"{validated.get('rated_episodes')}, by the labeler {validated.get('labeled_episodes')} "
              f"({validated.get('labeler')})")
    if rows:
        print(f"SFT rows: {week['sft'].get('rows')} (good episodes they come from: {rows['from_ratings']} rated by "
              f"users, {rows['from_labels']} labeled; {rows['held_out_for_validation']} good episodes held out for "
              f"validation, {rows.get('held_out_labeled', 0)} of them labeled)")
    else:
        print("SFT rows: none (the run stopped before the SFT dataset)")
    if labeler:
        check = labeler["report"]
        changed = args.labeler_min_auc is not None or args.labeler_max_ece is not None
        bars = f"bars AUC >= {check.min_auc}, ECE <= {check.max_ece} beyond sampling noise" + (
            ", set for this run on the command line, not the profile's" if changed else ", the profile's")
        oof = (f"out of fold on {check.n_rated} rated: AUC {check.auc:.3f}, ECE {check.ece:.3f} (sampling noise alone "
               f"~{check.ece_floor:.3f}, beyond it {check.ece_excess:.3f})" if check.auc is not None else
               f"not fitted ({check.reason})")
        print(f"labeler check ({bars}): {oof} -> {'PASSED, labels used' if check.passed else 'FAILED: ratings alone'}"
              + (f" ({check.reason})" if check.reason else ""))
        if labeler["auc"] is not None:
            print(f"labeler vs the hidden truth on {labeler['scored']} unrated episodes: AUC {labeler['auc']:.3f}, "
                  f"ECE {labeler['ece']:.3f}; confident labels {labeler['confident']} "
                  f"({'used' if check.passed else 'not used'}), of which wrong "
                  f"{_pct(labeler['confident_wrong'] / labeler['confident'] if labeler['confident'] else None)}; "
                  f"mean probability {_pct(labeler['mean_probability'])} against {_pct(labeler['truth_share'])} "
                  "truly satisfied")
        if labeler.get("ratings_wrong") is not None:
            print(f"ratings vs the hidden truth: {_pct(labeler['ratings_wrong'])} contradict it (mis-clicks)")
    if report:
        print(f"validation: {report.get('measure') or 'replay of held-out good episodes'}")
        for name in ("sft", "incumbent"):
            metrics = report["metrics"].get(name)
            if metrics:
                print(f"  {name:10} accuracy {metrics['accuracy']:.3f} (n {metrics.get('n', '?')})")
        for name, gate in report["gates"].items():
            print(f"  gate {name}: {'passed' if gate['passed'] else 'FAILED'} - {gate['message']}")
    print(f"decision: {week['decision']}")
    ab: ABRun | None = week.get("ab")
    if getattr(args, "deprecated", ""):
        print(f"note: {args.deprecated}")
    if ab is not None:
        print_ab(ab, week["min_samples"], week.get("min_rated"), week["decision"])
    print(f"routing after the week: {week.get('served_after')}")
    print("skipped: GRPO (the outside agent's tools run in its client: nothing to roll out in); loop health (one "
          "run)" + ("" if week.get("ab") is not None else "; the A/B test (no challenger registered)"))
    print("\nstage times:")
    for name, seconds in demo_run.STEPS:
        print(f"{seconds:8.1f} s  {name}")
    print(f"{time.perf_counter() - started:8.1f} s  total")


def print_ab(ab: ABRun, min_samples: int, min_rated: int | None, decision: str) -> None:
    """The A/B traffic in the summary: how many users and minutes the decision needed (or what stopped it undecided,
    and the bound), what a look cost, then per step (routing) its looks, each with the chunk's users per version
    and the sensor's line (per arm rated and labeled episodes, both lifts, the statistic, the decision). Runs of
    looks alike (same step, action and cause) show their first and last look."""
    print(("A/B traffic: the decision needed " if ab.decided else "A/B traffic: undecided, stopped after ")
          + f"{ab.users} users in {ab.seconds / 60:.1f} min ({len(ab.looks)} looks)"
          + (f"; {ab.stop}" if ab.decided else f": {ab.stop} (bound: {ab.bound.describe()})"))
    if ab.looks:
        sizes = [row.users for row in ab.looks]
        costs = [row.overhead_s for row in ab.looks]
        parts = ", ".join(f"{part} {statistics.median(r.costs.get(part, 0.0) for r in ab.looks):.2f} s"
                          for part in ab.looks[0].costs)
        print(f"  chunks of {min(sizes)}-{max(sizes)} users ("
              + (f"fixed, --ab-chunk {ab.bound.chunk}" if ab.bound.chunk else
                 f"sized so that a look costs ~{ab.bound.overhead_share:.0%} of a chunk") + "); a look's cost: median "
              f"{statistics.median(costs):.1f} s ({parts}), "
              f"{sum(costs) / ab.seconds if ab.seconds else 0:.0%} of the A/B time")
    steps: list[list[Look]] = []
    for row in ab.looks:
        if steps and steps[-1][0].routing == row.routing:
            steps[-1].append(row)
        else:
            steps.append([row])
    for step_looks in steps:
        routing = ", ".join(f"{v} {w:.0%}" for v, w in step_looks[0].routing.items()) or "?"
        print(f"  step ({routing}): looks {step_looks[0].number}-{step_looks[-1].number}, "
              f"{sum(r.users for r in step_looks)} users")
        runs: list[list[Look]] = []
        for row in step_looks:
            if runs and runs[-1][0].cause == row.cause:
                runs[-1].append(row)
            else:
                runs.append([row])
        for same in runs:
            shown = same if len(same) <= 2 else [same[0], same[-1]]
            for i, row in enumerate(shown):
                if i == 1 and len(same) > 2:
                    print(f"    ... {len(same) - 2} more look{'s' if len(same) > 3 else ''} alike ({row.cause})")
                print(f"    A/B look {row.number}: +{row.users} users ({row.total_users} in all, "
                      f"{row.elapsed_s / 60:.1f} min): " + "; ".join(
                          f"{v}: {t['n']} users, {t.get('rated', 0)} rated, {t.get('rated_up', 0)} up, "
                          f"{_pct(t['satisfied'] / t['n'] if t.get('n') else None)} satisfied (hidden)"
                          for v, t in row.per_version.items()) + f" -> {row.decision}")
    if ab.looks:
        totals: dict[str, dict[str, int]] = {}
        for row in ab.looks:
            for version, t in row.per_version.items():
                total = totals.setdefault(version, {"n": 0, "rated": 0, "rated_up": 0, "satisfied": 0})
                for k in total:
                    total[k] += t.get(k, 0)
        print("A/B live feedback over all looks: " + "; ".join(
            f"{v}: {t['rated']} rated of {t['n']} users, {_pct(t['rated_up'] / t['rated'] if t['rated'] else None)} "
            f"up (hidden truth: {_pct(t['satisfied'] / t['n'] if t['n'] else None)} satisfied)"
            for v, t in totals.items()) + f"; the test needs {min_samples} rated episodes per arm, or with labels "
            f"{min_samples} episodes of which {min_rated if min_rated is not None else '?'} rated")
        if "guardrail" in decision.split(":")[0]:
            print("(decided by a guardrail measured on the rated episodes, not by the feedback test itself)")


def _shares(values: dict) -> str:
    return ", ".join(f"{k} {v:.0%}" if v >= 0.01 or v == 0 else f"{k} {v:.1%}" for k, v in values.items())


if __name__ == "__main__":
    sys.exit(main())
