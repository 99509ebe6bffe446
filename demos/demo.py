"""`make demo` / `make demo-fast`: the whole loop on embedded defaults, as a user would run it.

Prepare the model, build the environment, start the arbiter with the production agent a team runs before any
training (by default a prompted API model, o3, played by the rule-based agent with o3's published figures: a
simulation, labelled as such), then run the weeks: production traffic lands in the pool, the retraining job
curates, trains, validates the better of SFT and SFT + GRPO against that production agent, and registers it only
when it is better; the A/B sensors then decide on replayed traffic. Each week's traffic is served by whatever the
week before left in production. Everything lands in the Dagster instance (.dagster/) and MLflow store
(.data/mlflow.db) that `make ui` opens, with the same profile.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import secrets
import sys
import time
from datetime import datetime, timezone

import httpx

from demos import stopping
from demos.run import (
    FAST_PRODUCTION,
    SIMULATED_PRODUCTION,
    STEPS,
    DemoPlan,
    DemoRun,
    another_agents_test,
    arbiter_process,
    not_registered,
    prepare_home,
    production_version,
    put_routing,
    read_report,
    reader_auth,
    registered_by,
    retrain,
    step,
    wait_for_routing,
)


def replay(url: str, tasks, n: int, concurrency: int, key_prefix: str, quiet: bool = False,
           rate: float | None = None):
    from agent_rl.arbiter.replay import replay as replay_async
    from agent_rl.arbiter.replay import select_tasks

    chosen = select_tasks(tasks, None, n)
    summary = asyncio.run(replay_async(url, chosen, concurrency=concurrency, timeout_s=900, key_prefix=key_prefix,
                                       rate=rate))
    if not quiet:
        print(f"replayed {summary.sent}: ok {summary.ok}, per version {summary.per_version}, "
              f"outcomes {summary.outcomes}, errors {summary.errors_by_status}", flush=True)
    return summary


def traffic_figures(pool, since: datetime) -> dict[str, dict[str, float]]:
    """Per served version since `since`: episodes, accuracy, cost per 1,000 requests, median latency."""
    import statistics

    by_version: dict[str, list] = {}
    for page in pool.iter_export(start=since):
        for episode in page.episodes:
            by_version.setdefault(episode.policy_version, []).append(episode)
    return {
        version: {
            "n": len(items),
            "accuracy": sum(1 for e in items if e.outcome == "correct") / len(items),
            "cost_per_1k_usd": 1000 * statistics.fmean(e.cost_usd for e in items),
            "latency_s_p50": statistics.median(e.latency_ms for e in items) / 1000,
        }
        for version, items in sorted(by_version.items())
    }


def parse_plan(argv: list[str] | None = None) -> DemoPlan:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="the tiny random model: the loop's mechanics in minutes")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--weeks", type=int, default=int(os.environ.get("WEEKS") or 1),
                        help="weeks of the loop to run back to back (each served by what the week before promoted)")
    parser.add_argument("--seed-requests", type=int, default=None, help="production requests in the first week")
    parser.add_argument("--week-requests", type=int, default=None,
                        help="production requests in each later week (the pool keeps the earlier weeks'; default: "
                             "the profile's [demo] week_requests, 400 where it names none)")
    parser.add_argument("--ab-rounds", type=int, default=12, help="most rounds of A/B traffic before giving up")
    parser.add_argument("--production", default=None,
                        help="the agent production runs before training, as a policy spec (default: api-sim:o3, the "
                             "rule-based agent playing o3 with its published latency and cost; the fast demo: heuristic)")
    parser.add_argument("--model-share", type=float, default=None,
                        help="share of first-week traffic served by the prompted base model beside production "
                             "(default: 0.1 fast, 0 full: a 135M model on CPU answers ~1 request in 5 s)")
    parser.add_argument("--env", default=os.environ.get("AGENT_RL_ENV") or None,
                        help="the agent to improve: email (default), support, or a plug-in 'package.module:Class' "
                             "(default: the profile's environment where it names one)")
    parser.add_argument("--profile", default=None,
                        help="the resource profile (pipelines/profiles): default 'fast' with --fast, else 'demo'; "
                             "'learn' is the help desk with a tiny model fitted to it, where the tiny model earns a "
                             "promotion (make demo-fast)")
    parser.add_argument("--incumbent", default=os.environ.get("INCUMBENT") or None,
                        help="who runs production when the weeks start: 'ours' (v0, a model of ours that the same "
                             "job trained on the traffic the API model served before, registered as champion), or "
                             "the API model itself by its routing name (o3-sim for email, gpt-4o-sim for support, "
                             "teacher for a plug-in): the distillation story, where the candidate must be no worse "
                             "at a fraction of the cost (gate non_inferiority). Left out: the API model; `make demo` "
                             "and `make demo-fast` without ENV pass 'ours' (the loop's story)")
    parser.add_argument("--v0-steps", type=int, default=None,
                        help="SFT steps that trained v0 (default: the profile's [demo] v0_steps, else half the "
                             "profile's SFT steps: the team's quick first model)")
    parser.add_argument("--week-sft-steps", type=int, default=None,
                        help="SFT steps a week's run adds to the champion's adapter when production runs a model of "
                             "ours (default: the profile's [demo] week_sft_steps, else the profile's SFT steps)")
    parser.add_argument("--week-grpo", action=argparse.BooleanOptionalAction, default=None,
                        help="GRPO after SFT in a week's run when production runs a model of ours (default: the "
                             "profile's [demo] week_grpo; the demo profile turns it off on 2 CPU cores)")
    args = parser.parse_args(argv)
    if args.weeks < 1:
        parser.error(f"--weeks must be at least 1, got {args.weeks}")
    for flag in ("v0_steps", "week_sft_steps", "week_requests"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    profile = args.profile or ("fast" if args.fast else "demo")
    from pipelines.profiles import demo_settings

    try:
        profile_env = profile_environment(profile)
        sizes = demo_settings(profile)
    except ValueError as exc:
        parser.error(str(exc))
    args.v0_steps = args.v0_steps or sizes.v0_steps
    args.week_sft_steps = args.week_sft_steps or sizes.week_sft_steps
    args.week_requests = args.week_requests or sizes.week_requests
    args.week_grpo = sizes.week_grpo if args.week_grpo is None else args.week_grpo
    if profile_env and args.env and args.env.strip() != profile_env:
        parser.error(f"profile {profile!r} trains {profile_env!r}; --env (or AGENT_RL_ENV) asks for {args.env!r}: "
                     "leave one out")
    args.env = args.env or profile_env or "email"
    from agent_rl.environments.core import EnvironmentError
    from agent_rl.environments.registry import load_environment

    try:
        environment = load_environment(args.env)
    except EnvironmentError as exc:
        parser.error(str(exc))
    production_spec = args.production or default_production(environment, args.env, args.fast)
    if production_spec is None:
        parser.error(f"environment {args.env!r} offers no teacher policy to stand for the agent production runs "
                     "before training: pass --production SPEC (a policy spec the arbiter serves)")
    production = production_version(production_spec)
    ours = args.incumbent == "ours"
    if not ours and args.incumbent not in (None, production):
        parser.error(f"--incumbent {args.incumbent!r}: expected 'ours' or {production!r} (the API model this demo "
                     "simulates; --production chooses another)")
    return DemoPlan(args, environment, production_spec, production, ours, profile)


def profile_environment(profile: str) -> str | None:
    """The environment a profile names ([environment] name), if any: the help desk of `learn`."""
    from pipelines.profiles import profile_path, read_profile

    return read_profile(profile_path(profile)).get("environment", {}).get("name")


def wants_gateway(argv: list[str] | None) -> bool:
    """Whether the command line (or $AGENT_RL_ENV) asks for the gateway's demo: `--env gateway`."""
    from agent_rl.curation.live import judged_by_users

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--env", default=os.environ.get("AGENT_RL_ENV") or "email")
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return judged_by_users(known.env)


def default_production(environment, env_arg: str, fast: bool) -> str | None:
    """The agent production runs before training when the command line names none: the simulated API model of
    SIMULATED_PRODUCTION for the environment (the email's perfect rule-based reader in the fast demo), else the
    environment's teacher; None when it has neither."""
    if fast and environment.name in FAST_PRODUCTION:
        return FAST_PRODUCTION[environment.name]
    if environment.name in SIMULATED_PRODUCTION:
        return SIMULATED_PRODUCTION[environment.name][0]
    return f"teacher:{env_arg}" if environment.teacher() is not None else None


def main(argv: list[str] | None = None) -> int:
    """The demo; SIGTERM or SIGINT stops it where it is (demos/stopping.py): exit 128 + the signal."""
    stopping.install()
    try:
        return _main(argv)
    except stopping.Stopped as stopped:
        from agent_rl.agent.engine import stop_engines

        stop_engines()
        if stopping.STATE.dagster_run:
            from agent_rl import settings
            from pipelines.sensors import end_mlflow_runs_killed

            with contextlib.suppress(Exception):  # the store may be what failed; the sensor is the backstop
                end_mlflow_runs_killed(settings.mlflow_uri(), stopping.STATE.dagster_run)
        print(f"stopped by {stopped.args[0]} during: {stopping.STATE.doing}. Nothing started after the "
              "signal; routing and the registry are as the last finished step left them; a retraining run in "
              "progress is marked failed in Dagster.", flush=True)
        return 128 + stopped.signum


def _main(argv: list[str] | None = None) -> int:
    if wants_gateway(argv):  # an outside agent's week through the gateway: its own driver (demos/gateway.py)
        from demos.gateway import main as gateway_main

        return gateway_main(argv)
    plan = parse_plan(argv)
    log_file = prepare_home(plan)
    started = time.perf_counter()

    import dagster as dg

    from agent_rl import settings
    from agent_rl.agent.models import resolve_model
    from agent_rl.pool.repository import PoolRepository
    from agent_rl.records import Split
    from assets.partitions import weekly
    from pipelines.definitions import defs

    training = defs.resources["training"]
    run = DemoRun(plan, defs, dg.DagsterInstance.get(), log_file,
                  {"sft_adapter": training.sft().max_steps, "grpo_adapter": training.grpo().max_steps},
                  weekly.get_partition_keys()[-1], PoolRepository(settings.pool_url()))
    with step(f"prepare the policy model ({training.base_model})"):
        print(f"model at {resolve_model(training.base_model)}")

    with step("environment: its world and tasks (Dagster job environment_job)"):
        result = run.job("environment_job")
        assert result.success, f"environment_job failed (see {log_file})"
        # The arbiter judges replays of these tasks against their reference.
        train, test = plan.environment.tasks(Split.TRAIN), plan.environment.tasks(Split.TEST)
        print(f"{len(train) + len(test)} {plan.environment.name} tasks: {len(train)} train, {len(test)} test")

    run.token = secrets.token_urlsafe(16)
    run_started = datetime.now(timezone.utc)
    weeks: list[dict] = []
    with arbiter_process(plan.args.port, None, run.token) as url:  # the environment's tasks, where it keeps some
        run.url = url
        start_production(run)
        seed_requests = plan.args.seed_requests or (defs.resources["curation"].min_points + 400)
        v0 = None
        if plan.ours:
            v0 = ship_v0(run, train, seed_requests, plan.args.v0_steps or max(1, run.max_steps["sft_adapter"] // 2))
            if v0.get("crashed"):
                run.crashed.append(v0["crashed"])
        for week in range(1, plan.args.weeks + 1):
            requests = seed_requests if week == 1 and not (v0 and v0.get("version")) else plan.args.week_requests
            weeks.append(run_week(run, week, requests, train, test))

    with step("loop health over every retraining run so far (Dagster job loop_health_job)"):
        result = run.job("loop_health_job", raise_on_error=False)
        health = read_loop_health()
        if not result.success or health is None:
            run.crashed.append("loop_health")
    print_summary(run.pool, weeks, started, health, since=run_started, v0=v0)
    if run.crashed:
        print(f"FAILED steps: {', '.join(run.crashed)} (see {log_file} and the run in the Dagster UI)")
        return 1
    return 0


def start_production(run: DemoRun) -> None:
    """Route production to the agent a team runs before training (beside a share of the prompted base model)."""
    plan, args = run.plan, run.plan.args
    base_model = run.defs.resources["training"].base_model
    share = args.model_share if args.model_share is not None else (0.1 if args.fast else 0.0)
    weights = {plan.production: 1.0 - share, "base": share} if share > 0 else {plan.production: 1.0}
    specs = {plan.production: plan.production_spec, "base": base_model}
    if plan.production_spec.startswith("api-sim:"):
        print(f"production agent: {plan.production} = {describe_simulation(plan.production_spec)}")
    elif SIMULATED_PRODUCTION.get(plan.environment.name, ("", ""))[0] == plan.production_spec:
        print(f"production agent: {plan.production} = {SIMULATED_PRODUCTION[plan.environment.name][1]}")
    put_routing(run.url, run.token, weights, {v: specs[v] for v in weights})
    print(f"arbiter at {run.url} while the demo runs: POST /v1/ask, and the OpenAI-compatible gateway at "
          f"{run.url}/v1/chat/completions (point an openai client's base_url at {run.url}/v1 with the demo's API key, "
          "$AGENT_RL_API_KEY of this process)", flush=True)


def run_week(run: DemoRun, week: int, requests: int, train, test) -> dict:
    """One week: production traffic, the retraining job, and the A/B test when it registered a challenger."""
    row: dict = {"week": week}
    served_before = run.pool.get_routing().weights
    row["served_by"] = ", ".join(f"{v} {w:.0%}" for v, w in sorted(served_before.items(), key=lambda i: -i[1]))
    week_started = datetime.now(timezone.utc)
    with step(f"week {week}: {requests} production requests through the arbiter ({row['served_by']})"):
        replay(run.url, train, requests, concurrency=IN_FLIGHT, key_prefix=f"week{week}-{int(time.time())}")
        print(f"pool holds {run.pool.count()} episodes")
    row["traffic"] = traffic_figures(run.pool, week_started)
    sft = f"SFT {run.plan.args.week_sft_steps} steps on the champion's adapter" \
        if run.plan.ours and run.plan.args.week_sft_steps else "SFT"
    grpo = " → GRPO" if week_grpo(run) else ""
    with step(f"week {week}: retraining job on partition {run.partition} "
              f"(curation → {sft}{grpo} → validation → registry)"):
        result, failed_checks = retrain(run, *week_training(run))
        registered = registered_by(result)
        print(f"retraining run {result.run_id}: {'success' if result.success else 'FAILED'}; "
              f"challenger registered: {registered}")
    row["report"] = read_report(run.partition, result.run_id)
    if registered:
        with step(f"week {week}: A/B test: sensors route traffic, decide on replayed test traffic"):
            decision = ab_test(run, week, test)
    else:
        decision = not_registered(row["report"], failed_checks)
    row["decision"] = decision or "A/B test undecided"
    row["served_after"] = run.pool.get_routing().weights
    row["arbiter"] = arbiter_memory(run.url)
    return row


def week_training(run: DemoRun) -> tuple[dict[str, dict], dict[str, int] | None]:
    """The week's training changes and step counts: with a model of ours in production, the profile's
    `week_sft_steps` continue the champion's adapter (v0 took the first steps; the week adds its own on the week's
    pool), and GRPO follows where the profile's `week_grpo` says; otherwise the profile's training as it is."""
    steps = run.plan.args.week_sft_steps
    if not (run.plan.ours and steps):
        return {}, None
    training = run.defs.resources["training"]
    grpo = {} if week_grpo(run) else {"grpo_enabled": False}
    return ({"training": {"sft_overrides": {**training.sft_overrides, "max_steps": steps}, **grpo}},
            {**run.max_steps, "sft_adapter": steps})


def week_grpo(run: DemoRun) -> bool:
    """Whether a week's run trains GRPO after SFT: always with the API model in production (the profile's training
    as it is), else as the profile's [demo] `week_grpo` or `--week-grpo` says."""
    return not (run.plan.ours and run.plan.args.week_sft_steps) or bool(run.plan.args.week_grpo)


def ab_test(run: DemoRun, week: int, test) -> str | None:
    """The sensors start the A/B test and route traffic; rounds of replayed test traffic until they decide."""
    import dagster as dg

    from pipelines.sensors import challenger_sensor, rollout_sensor

    resources = run.defs.resources
    stopping.check()
    print(challenger_sensor(dg.build_sensor_context(instance=run.instance, resources=resources)))
    other = another_agents_test(run.pool, resources["mlflow"].model_name)
    if other:  # one routing table per arbiter: one A/B test at a time; the sensors start ours later
        decision = f"A/B test waits: {other} is still running on this arbiter's routing table"
        print(decision, flush=True)
        return decision
    from agent_rl.ab.controller import latest_state

    decision, rollout, sent = None, resources["rollout"], 0
    served: dict[str, int] = {}  # the challenger's episodes: in the test, and at the current step
    rate = None  # requests/s after the first round: as many as that round was served at, arriving on their own
    for round_number in range(run.plan.args.ab_rounds):
        wait_for_routing(run.url, run.pool)
        state = latest_state(run.pool)
        requests = round_requests(state.step_share if state else 0.1, served.get("step", 0), served.get("test", 0),
                                  rollout.min_samples_per_step, rollout.min_samples_per_arm)
        start = sent % len(test)  # each round goes on where the last stopped: the whole test split before repeats
        sent += requests
        summary = replay(run.url, [*test[start:], *test[:start]], requests, concurrency=IN_FLIGHT, quiet=True,
                         key_prefix=f"ab{week}-{round_number}-{int(time.time())}", rate=rate)
        arriving = f", arriving at {rate:.2f}/s" if rate else ""
        rate = rate or ab_rate(summary)
        stopping.check()
        outcome = rollout_sensor(dg.build_sensor_context(instance=run.instance, resources=resources))
        decision = getattr(outcome, "skip_message", str(outcome))
        challenger = summary.per_version.get(state.challenger, 0) if state else 0
        served = {"test": served.get("test", 0) + challenger,
                  "step": 0 if decision.startswith("advance") else served.get("step", 0) + challenger}
        # Requests a version could not serve (its engine down) are answered 503 and stored nowhere: the sensor holds.
        failed = f", not served {summary.errors_by_status}" if summary.errors_by_status else ""
        print(f"round {round_number + 1} ({requests} requests{arriving}): {summary.per_version}{failed} -> {decision}",
              flush=True)
        if decision.startswith(("promote", "rollback")):
            break
    return decision


# Requests in flight, in a week's traffic and in the A/B test: the engine batches them (the held-out evaluation ran
# 16% faster at 32 than at 16 on 2 cores; a week's traffic at 16 was served at 0.62 requests/s on a Zen 5 EPYC).
IN_FLIGHT = 32


def ab_rate(summary) -> float | None:
    """The arrival rate of the A/B test's later rounds: what its first round was served at (answers per second), its
    requests sent as fast as answers came back while the champion, with 90% of them, held one engine's share of the
    machine. From then on requests arrive on their own at that rate, as users do: a closed loop gives the slower
    version more of the requests in flight, and with the versions on engines of their own its latency then grows with
    its slowness (docs/experiments.md, 2026-11-30 late night); spread over both engines at 50%, that rate keeps each
    inside what it serves."""
    return summary.ok / summary.elapsed_s if summary.ok and summary.elapsed_s > 0 else None


def round_requests(share: float, step_served: int, test_served: int, per_step: int, per_arm: int,
                   more: int = 40, most: int = 400) -> int:
    """Requests for the next round of the A/B test, sized to what the test still needs rather than a fixed count:
    enough for the challenger, at its `share` of traffic, to reach the step's and the arm's minimum (the rollout's
    `per_step`, `per_arm`) given what it served so far (`step_served`, `test_served`); `more` once both are met and
    only the evidence is short; never above `most` (a round is also how often the sensor looks)."""
    short = max(per_step - step_served, per_arm - test_served, 0)
    thinner = min(share, 1.0 - share) if share < 1.0 else 1.0
    return min(most, max(more, math.ceil(short / max(thinner, 0.01))))


def ship_v0(run: DemoRun, train, requests: int, steps: int) -> dict:
    """v0, the model of ours production runs when the weeks start, made the way a team makes its first one: the API
    model served production (`requests` replayed requests, the pool's history), the same retraining job trained on
    that pool (SFT alone, `steps` steps, from the base) and measured it on the held-out tasks; there was no model of
    ours to beat, so no improvement gate (the team's call to self-host; every other check holds). Registered, given
    the `champion` alias and all of production's traffic. Returns what the summary shows of it."""
    from agent_rl import registry
    from agent_rl.ab.controller import version_id

    defs, url, token, pool, api_version = run.defs, run.url, run.token, run.pool, run.plan.production
    with step(f"before the weeks: {requests} production requests served by the API model ({api_version})"):
        replay(url, train, requests, concurrency=16, key_prefix=f"v0-{int(time.time())}")
        print(f"pool holds {pool.count()} episodes")
    v0: dict = {"api": api_version, "requests": requests, "steps": steps}
    with step(f"v0: the retraining job on that pool, SFT alone ({steps} steps from the base), no improvement gate"):
        result = run.job("retraining_job", {**run.max_steps, "sft_adapter": steps}, partition_key=run.partition,
                         raise_on_error=False, resources={
                             "training": {"sft_overrides": {**defs.resources["training"].sft_overrides,
                                                            "max_steps": steps},
                                          "grpo_enabled": False, "start_from": "base"},
                             "evaluation": {"gate": "open"}})
        report = read_report(run.partition, result.run_id)
        if not registered_by(result):
            failed = [f"{c.asset_key.to_user_string()}.{c.check_name}: {c.description}"
                      for c in result.get_asset_check_evaluations() if not c.passed]
            print(f"v0 was not registered ({'; '.join(failed) or 'a step failed'}): production stays on "
                  f"{api_version}", flush=True)
            return {**v0, "crashed": None if failed else "v0 retraining run"}
        where = {"name": defs.resources["mlflow"].model_name, "tracking_uri": defs.resources["mlflow"].uri()}
        number = registry.get_version("challenger", **where).version
        version = version_id(number)
        stopping.check()
        registry.set_alias("champion", number, **where)
        registry.delete_alias("challenger", **where)
        registry.tag_version(number, {"rollout": "shipped as v0", "rollout.cause": (
            f"the team's first self-hosted model: SFT alone on the traffic {api_version} served; no model of ours "
            "to beat")}, **where)
        put_routing(url, token, {version: 1.0}, {version: f"mlflow:{version}"},
                    reason=f"v0 shipped: {version} (run {result.run_id[:8]}) replaces {api_version}")
        wait_for_routing(url, pool)
        metrics = (report or {}).get("metrics", {}).get("sft") or {}
        v0.update(version=version, run_id=result.run_id, model=where["name"], accuracy=metrics.get("accuracy"),
                  wrong=metrics.get("hallucination_rate"), n=metrics.get("n"))
        print(f"production now runs {version} (v0), the registered champion of {where['name']}: held-out accuracy "
              f"{_share(v0['accuracy'])}, wrong {_share(v0['wrong'])} on {v0['n']} tasks (measured; Dagster run "
              f"{result.run_id})", flush=True)
    return v0


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def describe_simulation(spec: str) -> str:
    from agent_rl.agent.api_models import api_model_profile

    profile = api_model_profile(spec.split(":", 1)[1])
    return (f"{profile.display_name}: SIMULATED by the rule-based agent with {profile.wrong_rate:.0%} extra wrong "
            f"answers (accuracy measured); latency {profile.latency_s} s and ${profile.cost_per_1k_runs_usd} per "
            f"1,000 runs as published ({profile.source})")


def read_loop_health() -> dict | None:
    from agent_rl import settings

    path = settings.artifact_dir("loop_health") / "loop_health.json"
    return json.loads(path.read_text()) if path.exists() else None


def arbiter_memory(url: str) -> dict | None:
    """The arbiter's serving figures (/healthz): versions loaded on its shared base, resident memory now and at
    its peak, adapter and cache memory; None when it does not answer."""
    try:
        serving = httpx.get(f"{url}/healthz", headers=reader_auth(), timeout=10).json().get("serving") or {}
    except (httpx.HTTPError, ValueError):
        return None
    mb = 1024 * 1024
    return {"versions": serving.get("versions") or [], "policies": serving.get("policies_loaded") or [],
            "resident_mb": round(serving.get("resident_bytes", 0) / mb), "peak_mb": round(
                serving.get("peak_resident_bytes", 0) / mb), "adapter_mb": round(serving.get("adapter_bytes", 0) / mb, 1),
            "cache_mb": round(serving.get("cache_bytes", 0) / mb, 1)}


def print_summary(pool, weeks: list[dict], started: float, health: dict | None = None,
                  since: datetime | None = None, v0: dict | None = None) -> None:
    print("\n================ summary ================")
    if v0 and v0.get("version"):
        print(f"v0: {v0['version']} of {v0['model']}, SFT alone ({v0['steps']} steps from the base) on the "
              f"{v0['requests']} requests {v0['api']} served before; held-out accuracy {_share(v0['accuracy'])}, "
              f"wrong {_share(v0['wrong'])} (measured, {v0['n']} tasks); shipped as champion with 100% of production")
    elif v0:
        print(f"v0 was not shipped: production stayed on {v0['api']}")
    last = weeks[-1].get("report") if weeks else None  # this run's last week: no older week's table instead
    if weeks and not last:
        print(f"week {weeks[-1]['week']}: no held-out evaluation ({weeks[-1]['decision']})")
    if last:
        incumbent = last["incumbent"]
        label = " (SIMULATED: published latency and cost)" if incumbent.get("simulation") else ""
        print(f"held-out evaluation, week {weeks[-1]['week']}: incumbent = production's {incumbent['version']} "
              f"({incumbent['spec']}){label}")
        # No latency column here: a batched held-out evaluation's wall time per episode is not what a request costs
        # served (the traffic table below has that, measured through the arbiter).
        columns = ("accuracy", "hallucination_rate", "failure_rate", "valid_tool_call_rate", "avg_turns",
                   "cost_per_1k_usd")
        print(f"{'model':12}" + "".join(f"{c:>21}" for c in columns))
        for name in ("sft", "grpo", "incumbent"):
            metrics = last["metrics"].get(name)
            if metrics:
                print(f"{name:12}" + "".join(f"{metrics.get(c, 0.0):>21.3f}" for c in columns))
        print("(cost_per_1k_usd of a model of ours: its held-out tokens at $0.10 / $0.30 per million prompt / "
              "completion tokens, the evaluation's price for a small hosted model; of a -sim: the published figure)")
        probes = ", ".join(f"{k} {v:.0%}" for k, v in last["forgetting_probe"].items() if v is not None)
        print(f"forgetting probe: {probes}")
        print(f"candidate: {last['choice']['reason']}")
        for name, gate in last["gates"].items():
            print(f"gate {name}: {'passed' if gate['passed'] else 'FAILED'} - {gate['message']}")
    print("\nweek | served by | traffic: accuracy, cost per 1k requests, median latency per version | decision")
    for row in weeks:
        traffic = "; ".join(f"{v}: n {t['n']}, acc {t['accuracy']:.1%}, ${t['cost_per_1k_usd']:.2f}/1k, "
                            f"{t['latency_s_p50']:.2f} s" for v, t in row["traffic"].items())
        print(f"{row['week']:>4} | {row['served_by']} | {traffic} | {row['decision']}")
    print("(latency: median seconds from request to answer through the arbiter, this machine; cost: what the "
          "arbiter charged per 1,000 requests: $0 for a model served here, whose price is this machine's time)")
    if any(v.endswith("-sim") for row in weeks for v in row["traffic"]):
        print("(a version ending in -sim is the rule-based agent playing an API model: its accuracy is measured, its "
              "latency and cost are the model's published figures)")
    if len(weeks) > 1:
        print("\nweek | held-out accuracy / wrong answers: SFT alone, SFT + GRPO, production's incumbent | candidate")
        for row in weeks:
            print(f"{row['week']:>4} | {held_out_line(row.get('report'))}")
    for row in weeks:
        memory = row.get("arbiter")
        if memory:
            print(f"arbiter after week {row['week']}: resident {memory['resident_mb']} MB (peak {memory['peak_mb']} "
                  f"MB); on its shared base: {', '.join(memory['versions']) or 'no model'} (adapters "
                  f"{memory['adapter_mb']} MB, caches {memory['cache_mb']} MB); loaded: "
                  f"{', '.join(memory['policies']) or '-'}")
    # This run's routing changes: the pool's history also holds other agents' and earlier runs'.
    for change in [c for c in pool.routing_history() if since is None or c.changed_at >= since][-4:]:
        print(f"routing {change.changed_at:%H:%M:%S} by {change.actor or '-'}: {change.new_weights} ({change.reason})")
    if health:
        print(f"\nloop health over {len(health.get('runs', []))} retraining runs: " + "; ".join(
            f"{name.replace('_', ' ')} {_rate(rate)}" for name, rate in (health.get("metrics") or {}).items()))
    print("\nstage times:")
    for name, seconds in STEPS:
        print(f"{seconds:8.1f} s  {name}")
    print(f"{time.perf_counter() - started:8.1f} s  total")
    print("Open the UIs: `make ui` (Dagster http://127.0.0.1:3000, MLflow http://127.0.0.1:5000)")


def held_out_line(report: dict | None) -> str:
    """One week's held-out figures, so the weeks can be compared (the detailed table shows only the last week)."""
    if not report:
        return "no evaluation (the run stopped before validation)"
    figures = []
    for name in ("sft", "grpo", "incumbent"):
        metrics = report["metrics"].get(name)
        figures.append(f"{name} " + ("-" if metrics is None else
                                     f"{metrics['accuracy']:.1%} / {metrics['hallucination_rate']:.1%}"))
    return f"{', '.join(figures)} | {report['choice']['candidate']}"


def _rate(rate: dict) -> str:
    if rate.get("value") is None:
        return "n/a"
    target = f" (target {rate['target']:.0%}: {'met' if rate.get('meets_target') else 'NOT met'})" \
        if rate.get("target") is not None else ""
    return f"{rate['value']:.0%}{target}"


if __name__ == "__main__":
    sys.exit(main())
