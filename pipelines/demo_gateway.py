"""`make demo ENV=gateway`: a week of an agent that is not ours, end to end, through the arbiter's gateway.

The outside agent is its own program (`examples/outside_agent.py`): a mail assistant written on the official
`openai` client that declares its tools, runs the calls it gets back against its own mailbox backend and sends
the results back, talking to the gateway over HTTP with an API key of its own. Its users are simulated
(`agent_rl/feedback/users.py`): each asks a question whose right answer only the simulation knows, is satisfied
or not with stated noise (the hidden truth, written to a file the loop never reads), re-asks, corrects, thanks,
complains, leaves, and a few percent rate through the gateway's feedback endpoint. Production behind the gateway
is the demo's production agent (the rule-based reader in the fast profile, the simulated o3 otherwise), routed by
the arbiter like any version.

Then the loop runs its week on that traffic with `AGENT_RL_ENV=gateway`: the labeler learns from the ratings and
labels the rest only if its check passes, curation, SFT (GRPO is skipped: the tools run in the client),
validation by replaying held-out rated-good episodes against production's incumbent, and, when a challenger is
registered, the A/B sensors on more of the same users' traffic, deciding on their live feedback. The summary
shows where the training rows came from (ratings or labels) and how the labeler agrees with the hidden truth.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines import demo_run

OUTSIDE_PROGRAM = Path(__file__).resolve().parents[1] / "examples" / "outside_agent.py"
# The fast profile's production is the email demo's (the rule-based reader), the full one's the simulated o3.
PRODUCTION = {"fast": "heuristic", "demo": demo_run.SIMULATED_PRODUCTION["email"][0]}
# Per profile: users in the week (enough rated episodes for the labeler's check at a 5% rating share, and clean
# episodes for curation's volume gate: fast 300, demo 5000), users per A/B round, rounds at most.
SIZES = {"fast": {"users": 3000, "ab_users": 600, "ab_rounds": 4},
         "demo": {"users": 6000, "ab_users": 1000, "ab_rounds": 8}}
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
    parser.add_argument("--ab-users", type=int, default=None, help="simulated users per A/B round")
    parser.add_argument("--ab-rounds", type=int, default=None, help="most A/B rounds before giving up")
    parser.add_argument("--labeler-min-auc", type=float, default=None,
                        help="this run's bar for the labeler's out-of-fold AUC (default: the profile's)")
    parser.add_argument("--labeler-max-ece", type=float, default=None,
                        help="this run's bar for the labeler's calibration error (default: the profile's)")
    parser.add_argument("--concurrency", type=int, default=8, help="users talking to the agent at once")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from agent_rl.curation.live import is_live
    from agent_rl.feedback.population import NOISE_PRESETS

    if not is_live(args.env):
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
    sizes = SIZES["fast" if args.fast else "demo"]
    for name in ("users", "ab_users", "ab_rounds"):
        if getattr(args, name) is None:
            setattr(args, name, sizes[name])
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
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

    def users(self, args: argparse.Namespace, n: int, label: str) -> dict:
        """`n` simulated users talk to the agent through the gateway; returns the program's summary."""
        truth = self.folder / f"truth-{label}.jsonl"
        summary = _run_program(
            ["run", "--dir", str(self.folder), "--base-url", f"{self.url}/v1", "--users", str(n), "--truth",
             str(truth), "--seed", str(args.seed), "--first-index", str(self.next_index), "--rated-share",
             str(args.rated_share), "--noise", args.noise, "--backend-error-rate", str(args.backend_error_rate),
             "--concurrency", str(args.concurrency), "--max-tokens", "128", "--lowercase-share",
             str(args.lowercase_share)],
            env={"OPENAI_API_KEY": self.token})
        self.next_index += n
        summary["label"] = label
        self.runs.append(summary)
        return summary


def _run_program(arguments: list[str], env: dict[str, str] | None = None) -> dict:
    """Run the outside program; its progress lines go to the console, its last line is its JSON summary."""
    process = subprocess.Popen([sys.executable, str(OUTSIDE_PROGRAM), *arguments], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, **(env or {})})
    last = ""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("{"):
            last = line
        else:
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
    background); returns how many are missing at the timeout."""
    missing = list(episode_ids)
    deadline = time.monotonic() + timeout_s
    while missing and time.monotonic() < deadline:
        missing = [e for e in missing if pool.get(e) is None]
        if missing:
            time.sleep(1.0)
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
    held-out rated-good episodes left out), scored against the simulation's hidden truth on the episodes nobody
    rated; and its confident labels' share that contradicts the truth. None without an export."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    from agent_rl.curation.datasets import load_jsonl
    from agent_rl.curation.live import held_out, is_live, is_rated_good, judge_by_feedback
    from agent_rl.feedback.labeler import expected_calibration_error, label_episodes
    from assets.pool import export_path

    path = export_path(run.partition)
    config = run.defs.resources["curation"].labeler()
    if not path.exists() or config is None:
        return None
    rows = [judge_by_feedback(r) for r in load_jsonl(path)]
    live = [r for r in rows if is_live(r.get("environment"))]
    fit_on = [r for r in live if not (is_rated_good(r) and held_out(str(r.get("episode_id"))))]
    result = config.label(fit_on) if callable(getattr(config, "label", None)) else label_episodes(fit_on, config)
    scored = [s for s in result.scored if s.episode_id in truth]
    out: dict[str, Any] = {"report": result.report, "scored": len(scored), "auc": None, "ece": None,
                           "confident": 0, "confident_wrong": 0}
    rated = [r for r in live if r.get("feedback") is not None and r["episode_id"] in truth]
    if rated:  # how often a rating itself contradicts the truth (mis-clicks)
        out["ratings_wrong"] = sum((str(r["outcome"]) == "correct") != truth[r["episode_id"]]["satisfied"]
                                   for r in rated) / len(rated)
    if scored:
        y = np.array([truth[s.episode_id]["satisfied"] for s in scored], dtype=int)
        p = np.array([s.probability for s in scored])
        out["auc"] = float(roc_auc_score(y, p)) if len(set(y)) == 2 else None
        out["ece"] = expected_calibration_error(y, p)
        confident = [s for s in scored if s.good is not None]
        out["confident"] = len(confident)
        out["confident_wrong"] = sum(s.good != truth[s.episode_id]["satisfied"] for s in confident)
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
            "held_out_for_validation": len(held)}


def ab_test(run: demo_run.DemoRun, outside: OutsideAgent, args: argparse.Namespace) -> tuple[str, list[dict]]:
    """The sensors start the A/B test and route the gateway's traffic; rounds of the same users' traffic until they
    decide on its live feedback: the ratings, and beside them the labels of the week's labeler when it passed its
    check (agent_rl/ab/evidence.py); each round's decision line says which, per arm rated and labeled episodes."""
    import dagster as dg

    from pipelines.sensors import challenger_sensor, rollout_sensor

    resources = run.defs.resources
    print(challenger_sensor(dg.build_sensor_context(instance=run.instance, resources=resources)))
    other = demo_run.another_agents_test(run.pool, resources["mlflow"].model_name)
    if other:
        return f"A/B test waits: {other} is still running on this arbiter's routing table", []
    decision, rounds = "A/B test undecided", []
    for round_number in range(args.ab_rounds):
        demo_run.wait_for_routing(run.url, run.pool)
        summary = outside.users(args, args.ab_users, f"ab{round_number + 1}")
        wait_for_episodes(run.pool, list(read_truth(Path(summary["truth"]))), timeout_s=60)
        outcome = rollout_sensor(dg.build_sensor_context(instance=run.instance, resources=resources))
        decision = getattr(outcome, "skip_message", str(outcome))
        rated = {v: f"{t.get('rated', 0)} rated ({t.get('rated_up', 0)} up) of {t['n']}"
                 for v, t in summary["per_version"].items()}
        print(f"A/B round {round_number + 1}: {rated} -> {decision}", flush=True)
        rounds.append({"round": round_number + 1, "per_version": summary["per_version"], "decision": decision})
        if decision.startswith(("promote", "rollback")):
            break
    else:
        decision = (f"A/B test undecided after {args.ab_rounds} rounds of {args.ab_users} users, "
                    f"{args.rated_share:.0%} of whom rate ({decision})")
    return decision, rounds


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
                week["decision"], week["ab_rounds"] = ab_test(run, outside, args)
        else:
            week["decision"], week["ab_rounds"] = demo_run.not_registered(week["report"], failed_checks), []
        week["served_after"] = run.pool.get_routing().weights
        week["min_samples"] = defs.resources["rollout"].min_samples_per_arm
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
              f"users, {rows['from_labels']} labeled; {rows['held_out_for_validation']} rated-good episodes held out "
              "for validation)")
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
                  f"{_pct(labeler['confident_wrong'] / labeler['confident'] if labeler['confident'] else None)}")
        if labeler.get("ratings_wrong") is not None:
            print(f"ratings vs the hidden truth: {_pct(labeler['ratings_wrong'])} contradict it (mis-clicks)")
    if report:
        print(f"validation: {report.get('measure') or 'replay of held-out rated-good episodes'}")
        for name in ("sft", "incumbent"):
            metrics = report["metrics"].get(name)
            if metrics:
                print(f"  {name:10} accuracy {metrics['accuracy']:.3f} (n {metrics.get('n', '?')})")
        for name, gate in report["gates"].items():
            print(f"  gate {name}: {'passed' if gate['passed'] else 'FAILED'} - {gate['message']}")
    print(f"decision: {week['decision']}")
    for row in week.get("ab_rounds") or []:
        print(f"  A/B round {row['round']}: " + "; ".join(
            f"{v}: {t['n']} users, {t.get('rated', 0)} rated, {t.get('rated_up', 0)} up, "
            f"{_pct(t['satisfied'] / t['n'] if t['n'] else None)} satisfied (hidden)"
            for v, t in row["per_version"].items()) + f" -> {row['decision']}")
    rounds = week.get("ab_rounds") or []
    if rounds:
        totals: dict[str, dict[str, int]] = {}
        for row in rounds:
            for version, t in row["per_version"].items():
                total = totals.setdefault(version, {"n": 0, "rated": 0, "rated_up": 0, "satisfied": 0})
                for k in total:
                    total[k] += t.get(k, 0)
        print("A/B live feedback over all rounds: " + "; ".join(
            f"{v}: {t['rated']} rated of {t['n']} users, {_pct(t['rated_up'] / t['rated'] if t['rated'] else None)} "
            f"up (hidden truth: {_pct(t['satisfied'] / t['n'] if t['n'] else None)} satisfied)"
            for v, t in totals.items()) + f"; the test needs {week['min_samples']} rated episodes per arm")
        if "guardrail" in week["decision"].split(":")[0]:
            print("(decided by a guardrail measured on the rated episodes, not by the feedback test itself)")
    print(f"routing after the week: {week.get('served_after')}")
    print("skipped: GRPO (the outside agent's tools run in its client: nothing to roll out in); loop health (one "
          "run)" + ("" if week.get("ab_rounds") else "; the A/B test (no challenger registered)"))
    print("\nstage times:")
    for name, seconds in demo_run.STEPS:
        print(f"{seconds:8.1f} s  {name}")
    print(f"{time.perf_counter() - started:8.1f} s  total")


def _shares(values: dict) -> str:
    return ", ".join(f"{k} {v:.0%}" if v >= 0.01 or v == 0 else f"{k} {v:.1%}" for k, v in values.items())


if __name__ == "__main__":
    sys.exit(main())
