"""The runner of fine-tuning jobs: each queued job (agent_rl/finetuning/jobs.py) becomes a Dagster run of the loop.

`python -m pipelines.fine_tuning` claims queued jobs one at a time and runs each in a child process of its own, whose
AGENT_RL_HOME is the job's folder: the job's pool, artifacts and partition are its own and never mix with
production's week, while Dagster's instance (DAGSTER_HOME) and MLflow are the shared ones, so the run shows in the
Dagster UI and its model is registered (under a registered model of the job's, so no production sensor takes it
for a challenger) and served through the gateway under the name the job reports (`fine_tuned_model`).

A job's rows enter the loop as episodes, judged by the job's grader: a supervised row as the demonstration it is,
a reinforcement row as the base model's own reply (what the model can already do is what RL starts from). Then the
retraining job runs as every week does: curation with its privacy gate, SFT on what passed, GRPO for reinforcement
jobs, validation on the validation file (base model against candidate, reward before and after in the events),
registry. A cancelled job's child is stopped and nothing it left is registered.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent_rl import settings
from agent_rl.environments.openai_jobs.environment import PYTHON_GRADERS_ENV
from agent_rl.finetuning.jobs import JobStateError
from agent_rl.finetuning.serving import registered_model
from agent_rl.stop_signals import Stopped
from agent_rl.stop_signals import install as install_stop_signals

POLL_S = 2.0
SUPERVISED, REINFORCEMENT = "supervised", "reinforcement"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.fine_tuning", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs-root", type=Path, default=None, help="the job store's folder (default: the arbiter's)")
    parser.add_argument("--once", action="store_true", help="run the queued jobs, then exit (default: keep polling)")
    parser.add_argument("--allow-python-graders", action="store_true",
                        help="run jobs' python graders (sandboxed; allow them to the arbiter's API as well)")
    parser.add_argument("--run", metavar="JOB_ID", help=argparse.SUPPRESS)  # the child process of one job
    args = parser.parse_args(argv)
    if args.allow_python_graders:
        os.environ[PYTHON_GRADERS_ENV] = "1"
    store = open_store(args.jobs_root)
    if args.run:
        return run_one(store, args.run)
    install_stop_signals()  # SIGTERM or Ctrl-C: the job in progress fails with the reason, its run is stopped
    try:
        return work(store, once=args.once)
    except Stopped as stopped:
        print(f"fine-tuning runner: stopped by {stopped.args[0]}", file=sys.stderr, flush=True)
        return 128 + stopped.signum


def open_store(root: Path | None):
    from agent_rl.finetuning.jobs import JobStore, default_root

    return JobStore(root or default_root())


def work(store, once: bool = False, poll_s: float = POLL_S) -> int:
    """Claim and run queued jobs, one at a time; with `once`, return when none is queued."""
    while True:
        job = store.claim_next()
        if job is None:
            if once:
                return 0
            time.sleep(poll_s)
            continue
        run_in_child(store, job)


def run_in_child(store, job) -> None:
    """Run one claimed job in a child process with the job's own home; stop it if the job is cancelled; a child that
    dies without finishing the job fails it."""
    folder = store.job_dir(job.id)
    home = folder / "home"
    home.mkdir(parents=True, exist_ok=True)
    models = home / "models"
    if not models.exists():  # base models and merged versions are the installation's, not copied per job
        models.symlink_to(settings.models_dir(), target_is_directory=True)
    env = {**os.environ, "AGENT_RL_HOME": str(home), "MLFLOW_TRACKING_URI": settings.mlflow_uri(),
           "AGENT_RL_JOB_DIR": str(folder), "AGENT_RL_PROFILE": profile_for(job.model)}
    env.pop("AGENT_RL_POOL_URL", None)
    env.pop("AGENT_RL_STORE_URL", None)
    env.pop("AGENT_RL_INBOX_URL", None)
    command = [sys.executable, "-m", "pipelines.fine_tuning", "--jobs-root", str(store.root), "--run", job.id]
    with open(folder / "run.log", "ab") as log:
        child = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            watch(store, job, child)
        except Stopped:  # the runner itself was asked to stop: its job fails with that reason, then its run stops
            # Said before the run is stopped: a run told to stop ends its job itself ("training failed") before it
            # exits, and the first to finish a job wins.
            with contextlib.suppress(JobStateError):  # the run ended the job on its own a moment before
                store.finish(job.id, "failed", error={"code": "runner_stopped", "param": None,
                                                       "message": "the fine-tuning runner was stopped during the job"})
            stop_child(child)
            raise
    if child.returncode != 0 and not store.job(job.id).status.finished:  # cancelled, or ended by the child itself
        store.finish(job.id, "failed", error={"code": "job_failed", "param": None,
                                               "message": f"the job's run stopped with exit status {child.returncode}"})


def stop_child(child: subprocess.Popen) -> None:
    """SIGTERM to the job's process group, SIGKILL after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def watch(store, job, child: subprocess.Popen) -> None:
    """Wait for the job's child; stop it when the job is cancelled."""
    while child.poll() is None:
        if store.is_cancelled(job.id):
            stop_child(child)
            store.add_event(job.id, "Fine-tuning job stopped: it was cancelled")
            return
        time.sleep(0.5)


def profile_for(model: str | None) -> str:
    """The tiny model trains with the fast profile's sizes; any other with the installation's profile."""
    return "fast" if model == "tiny" else os.environ.get("AGENT_RL_PROFILE") or "default"


# -- the child: one job ---------------------------------------------------------------------------


def run_one(store, job_id: str) -> int:
    """The job's loop, in this process (AGENT_RL_HOME is the job's folder). Exit 0 when the job was finished here,
    succeeded or failed with its reason; non-zero only when something unforeseen stopped it."""
    from agent_rl.environments.openai_jobs import OpenAIJobEnvironment

    folder = store.job_dir(job_id)
    spec = json.loads((folder / "job.json").read_text())
    try:
        environment = OpenAIJobEnvironment(str(folder))
        seeded = seed_pool(environment, spec, store.tenant_of(job_id))
    except Exception as exc:  # noqa: BLE001 - the job reports why, the runner goes on
        end(store, job_id, "failed", error={"code": "invalid_job", "param": None,
                                        "message": f"{type(exc).__name__}: {exc}"[:500]})
        return 0
    store.add_event(job_id, f"Read {seeded['episodes']} training rows; {seeded['passed']} replies pass the grader "
                            f"({seeded['source']})", data=seeded)
    if store.is_cancelled(job_id):
        return 0
    result, report = run_loop(job_id, spec, environment, seeded)
    if store.is_cancelled(job_id):
        return 0
    if result is None:
        end(store, job_id, "failed", error={"code": "training_failed", "param": None, "message": report})
        return 0
    before, after = report["reward_before"], report["reward_after"]
    name = store.fine_tuned_model_name(store.job(job_id))
    from agent_rl import registry

    version = registry.get_version("challenger", name=registered_model(job_id), tracking_uri=settings.mlflow_uri())
    registry.tag_version(version.version, {"fine_tuned_model": name, "fine_tuning_job": job_id},
                         name=registered_model(job_id), tracking_uri=settings.mlflow_uri())
    metrics = {"valid_mean_reward": after, "valid_mean_reward_before": before, "valid_accuracy": report["accuracy"]}
    store.add_checkpoint(job_id, report["steps"], metrics, f"{name}:ckpt-step-{report['steps']}")
    if report.get("grpo_disqualified"):  # the reward-hacking check kept GRPO's model out: say so, it is news
        store.add_event(job_id, f"GRPO's model was not shipped: {report['grpo_disqualified']}", level="warn")
    store.add_event(job_id, f"Validation: mean reward {before:.3f} before, {after:.3f} after "
                            f"({report['held_out']} held-out rows; shipped: {report['why']})", data=metrics)
    end(store, job_id, "succeeded", fine_tuned_model=name, trained_tokens=report.get("trained_tokens"))
    return 0


def end(store, job_id: str, status: str, **details: Any) -> None:
    """Finish the job here unless it has ended already: a runner being stopped fails its job ("runner_stopped")
    before it stops this run, and that reason stands."""
    with contextlib.suppress(JobStateError):
        store.finish(job_id, status, **details)


class ReferencePolicy:
    """Replies to each task's conversation with the row's own target reply: a supervised row played as the
    demonstration it is, so the grader judges it like any episode."""

    version = "training_file"
    reads_conversations_only = True

    def __init__(self, references: dict[str, str]) -> None:
        self.references = references  # the opening messages' JSON -> the reply

    def act(self, conversations, tools, max_new_tokens):
        from agent_rl.agent.policy import PolicyTurn

        return [PolicyTurn(content=self.references[conversation_key(c)]) for c in conversations]


def conversation_key(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, sort_keys=True, ensure_ascii=False)


def seed_pool(environment, spec: dict[str, Any], tenant: str) -> dict[str, Any]:
    """Write the job's training rows to the job's pool as judged episodes; what passed is what SFT learns from."""
    from agent_rl.environments.runner import Play, RunnerConfig, play_episodes
    from agent_rl.policy_specs import load_policy
    from agent_rl.pool.repository import PoolRepository
    from agent_rl.records import Outcome, Split

    tasks = environment.tasks(Split.TRAIN)
    if spec["method"] == SUPERVISED:
        policy: Any = ReferencePolicy({conversation_key(environment.opening_messages(t)): t.reference for t in tasks})
        source = "the training file's replies"
    else:
        policy = load_policy(spec["model"])
        source = f"replies of {spec['model']}"
    episodes = play_episodes(policy, environment, [Play(t, tenant=tenant) for t in tasks], RunnerConfig(max_turns=1))
    pool = PoolRepository(settings.pool_url())
    try:
        pool.insert_episodes(episodes)
    finally:
        pool.close()
    return {"episodes": len(episodes), "passed": sum(e.outcome == Outcome.CORRECT for e in episodes),
            "source": source}


def training_changes(job_id: str, spec: dict[str, Any], environment, seeded: dict[str, Any]) -> dict[str, dict]:
    """The profile's resources as this job changes them: its environment and registered model, gates sized to a
    job's file, training from the base model, and OpenAI's hyperparameters where given."""
    from agent_rl.records import Split

    hyper = {k: v for k, v in (spec.get("hyperparameters") or {}).items() if v not in (None, "auto")}
    sft: dict[str, Any] = {}
    if "n_epochs" in hyper:
        sft.update(num_train_epochs=int(hyper["n_epochs"]), max_steps=-1)
    if "batch_size" in hyper:
        sft["per_device_train_batch_size"] = int(hyper["batch_size"])
    changes: dict[str, dict] = {
        "environment": {"name": "openai_job", "also": []},
        # A reinforcement job's base model may pass nothing yet: then SFT is skipped and GRPO starts from the base.
        "curation": {"min_points": min(10, seeded["episodes"]), "min_categories": 1, "max_tenant_share": 1.0,
                     "label_unrated": False, "allow_empty_sft": spec["method"] == REINFORCEMENT},
        "training": {"base_model": spec["model"], "start_from": "base", "grpo_enabled": spec["method"] == REINFORCEMENT},
        "evaluation": {"gate": "open", "max_tasks": max(1, len(environment.tasks(Split.TEST)))},
        "mlflow": {"model_name": registered_model(job_id)},
    }
    if sft:
        changes["training"]["sft_overrides"] = sft
    return changes


def run_loop(job_id: str, spec: dict[str, Any], environment, seeded: dict[str, Any]):
    """(Dagster result, figures) of the job's retraining run; (None, why) when it did not register a model."""
    import dagster as dg

    from assets.partitions import weekly
    from assets.stages import EvaluationReport
    from pipelines.definitions import defs
    from pipelines.profiles import resource_config

    changes = training_changes(job_id, spec, environment, seeded)
    partition = weekly.get_partition_keys()[-1]
    job = defs.resolve_job_def("retraining_job")
    run_config = {"resources": resource_config(defs, changes)}
    result = job.execute_in_process(instance=dg.DagsterInstance.get(), run_config=run_config, partition_key=partition,
                                    raise_on_error=False, tags={"fine_tuning_job": job_id})
    failed = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"
              or (e.event_type_value == "ASSET_CHECK_EVALUATION" and not e.event_specific_data.passed)]
    if not result.success or failed:
        return None, "; ".join(describe(e) for e in failed)[:500] or "the retraining run failed"
    report = EvaluationReport(partition).read()
    candidate = report["choice"]["candidate"]
    return result, {
        "why": report["choice"].get("reason"), "grpo_disqualified": report["choice"].get("grpo_disqualified"),
        "reward_before": mean_reward(report["episodes"]["incumbent"]),
        "reward_after": mean_reward(report["episodes"][candidate]),
        "accuracy": report["metrics"]["candidate"]["accuracy"],
        "held_out": report["metrics"]["candidate"]["n"],
        "steps": trained_steps(partition, candidate),
    }


def describe(event) -> str:
    if event.event_type_value == "STEP_FAILURE":
        error = event.event_specific_data.error
        last = error.message.strip().splitlines()[-1] if error else "failed"
        return f"{event.step_key}: {last.rpartition('Failure: ')[2]}"
    evaluation = event.event_specific_data
    return f"check {evaluation.check_name}: {evaluation.description or 'failed'}"


def mean_reward(path: str) -> float:
    rewards = [json.loads(line).get("reward") or 0.0 for line in Path(path).read_text().splitlines() if line.strip()]
    return statistics.fmean(rewards) if rewards else 0.0


def trained_steps(partition: str, candidate: str) -> int:
    """Optimizer steps of the shipped model's training (SFT's, plus GRPO's when it ships): the trainers' last
    checkpoint of each stage."""
    from assets.stages import GrpoAdapter, SftAdapter

    steps = 0
    for stage in (SftAdapter, GrpoAdapter) if candidate == "grpo" else (SftAdapter,):
        numbers = [int(p.name.split("-", 1)[1]) for p in stage(partition).checkpoints()
                   if p.name.split("-", 1)[1].isdigit()]
        steps += max(numbers, default=0)
    return steps


if __name__ == "__main__":
    sys.exit(main())
