"""The week's validation behind the `evaluation_report` asset: SFT alone, SFT + GRPO and production's incumbent
measured on the same held-out set, the better trained model chosen, and the gates it must pass.

What the held-out set is follows from what the run's episodes allow (`Capabilities`), never from the environment's
name: tasks played to the end in the anonymized worlds curation left, or, with no world of ours (live traffic
judged by its users), a step-by-step replay of the held-out episodes judged good (rated, or labeled). A replay
checks the kind of action at each step; where an answer judge is configured it also compares the candidate's
answers in words with the approved ones (replay.py: `AnswerJudging`), and that check joins the improvement gate;
without one the report says that answer quality is left to the A/B test. The asset resolves the partition's paths
and resources, calls `held_out_measure` and `validate`, and writes what they return.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent_rl.curation.datasets import save_jsonl
from agent_rl.curation.live import is_labeled_good
from agent_rl.environments.core import Capabilities, ProbeItem
from agent_rl.environments.worlds import AnonymizedWorld
from agent_rl.evaluate.cache import EvaluationCache
from agent_rl.evaluate.gates import GateOutcome, GateSettings, forgetting_gate, promotion_gate
from agent_rl.evaluate.harness import EvalConfig, evaluate_environments, forgetting_probe, torch_threads
from agent_rl.evaluate.metrics import EvalMetrics
from agent_rl.evaluate.replay import AnswerCheck, AnswerJudging, Replayed, held_out_sample, judge_answers, replay
from agent_rl.evaluate.report import CandidateChoice, choose_candidate

PLAYED = "held-out tasks played to the end and judged"


@dataclass
class HeldOut:
    """What the models are measured on: `play(policy, name)` gives a model's metrics and the episodes it played."""

    measure: str  # what accuracy means here, for the report and the evaluation cache's key
    play: Callable[[Any, str], tuple[EvalMetrics, list]]
    probe_items: list[ProbeItem] | None = None  # the environments' forgetting probe (None: the loop's own)
    per_environment: dict[str, dict] = field(default_factory=dict)  # model -> environment -> metrics (several)
    environments: list = field(default_factory=list)  # opened to play in: closed by `close`
    # A replay's check of a model's answers (by name) against the approved ones; None: tasks played and judged.
    check_answers: Callable[[str, GateSettings], AnswerCheck] | None = None
    # Models whose answers the check needs from this run: never reused from the evaluation cache, which keeps metrics
    # only (else a rerun of a week whose candidate failed the answer check would pass it unjudged).
    answers_needed: frozenset[str] = frozenset()

    def close(self) -> None:
        for environment in self.environments:
            environment.close()


def held_out_measure(capabilities: Capabilities, config: EvalConfig, *, worlds: Callable[[], list[AnonymizedWorld]],
                     rated_good: Callable[[], list[dict]], answer_judge: AnswerJudging | None = None) -> HeldOut:
    """The held-out set the run's episodes allow: the anonymized worlds' held-out tasks (`worlds`, as GRPO saw
    them) when there is a world of ours, else a replay of the held-out episodes judged good (`rated_good`: rated
    or labeled; the tools ran in the client, so the steps users approved are all there is to measure against), whose
    candidate's answers `answer_judge` compares with the approved ones (None: left to the A/B test)."""
    if not capabilities.world:
        episodes = rated_good()
        played: dict[str, Replayed] = {}

        def play_replay(policy: Any, name: str) -> tuple[EvalMetrics, list]:
            played[name] = replay(policy, episodes, config)
            return played[name].metrics, []

        def check_answers(name: str, gates: GateSettings) -> AnswerCheck:
            done = played.get(name) if answer_judge is not None else None
            if answer_judge is not None and done is None:
                raise RuntimeError(f"{name} was not replayed in this run: its answers cannot be judged")
            return judge_answers(answer_judge, done.steps if done else [], done.turns if done else [],
                                 alpha=gates.alpha, gating=gates.kind != "open")

        sample = held_out_sample(episodes, config.max_tasks, config.seed)
        labeled = sum(1 for e in sample if is_labeled_good(e))
        return HeldOut(f"replay of {len(sample)} held-out gateway episodes judged good ({len(sample) - labeled} rated "
                       f"by users, {labeled} labeled by the week's labeler): accuracy is the share of their steps "
                       "where the model takes the approved kind of action (the same tools, or a reply in words)",
                       play_replay,
                       check_answers=check_answers,
                       answers_needed=frozenset({"sft", "grpo"}) if answer_judge is not None else frozenset())
    pairs = [(world.environment, world.tasks) for world in worlds()]
    per_environment: dict[str, dict] = {}

    def play(policy: Any, name: str) -> tuple[EvalMetrics, list]:
        combined, each = evaluate_environments(policy, pairs, config, version=name)
        if len(pairs) > 1:
            per_environment[name] = {env: m.model_dump() for env, m in each.items()}
        return combined.metrics, combined.episodes

    return HeldOut(PLAYED, play, probe_items=[item for env, _ in pairs for item in env.grading().probe] or None,
                   per_environment=per_environment, environments=[env for env, _ in pairs])


@dataclass
class Model:
    """One model to measure: how to load it, and the fingerprint of its weights (None: not cached)."""

    load: Callable[[], Any]
    weights: Callable[[], str | None]
    label: str = ""  # how the log names it beyond its role ("(v3: mlflow:v3)")


@dataclass
class Validation:
    """Every model's figures, the candidate chosen and its gates: what the report, the checks and MLflow show."""

    results: dict[str, EvalMetrics]
    probes: dict[str, float | None]
    episode_files: dict[str, str]
    simulation: dict | None  # the incumbent's simulation label, when production's agent is simulated
    choice: CandidateChoice
    improvement: GateOutcome
    forgetting: GateOutcome
    answers: AnswerCheck | None = None  # a replay's check of the candidate's answers (None: tasks judged)

    @property
    def candidate(self) -> EvalMetrics:
        return self.results[self.choice.name]

    def report(self, run_id: str, incumbent: tuple[str, str], held_out: HeldOut, hacked: str | None,
               skipped: str | None) -> dict[str, Any]:
        version, spec = incumbent
        return {
            "dagster_run_id": run_id,  # readers take the report of the run they ran, never a leftover
            "incumbent": {"version": version, "spec": spec, "simulation": self.simulation},
            "choice": {"candidate": self.choice.name, "reason": self.choice.reason, "grpo_disqualified": hacked,
                       "grpo_skipped": skipped},
            "measure": held_out.measure,
            "per_environment": held_out.per_environment,
            "metrics": {"candidate": self.candidate.model_dump(),
                        **{n: m.model_dump() for n, m in self.results.items()}},
            "forgetting_probe": self.probes,
            "episodes": self.episode_files,
            "gates": {"improvement": self.improvement.as_dict(), "forgetting": self.forgetting.as_dict()},
            **({"answers": self.answers.as_dict()} if self.answers is not None else {}),
        }


def validate(models: dict[str, Model], held_out: HeldOut, *, base: Callable[[], Any], gates: GateSettings,
             incumbent_version: str, cache: EvaluationCache, inputs: str, out_dir: Path, threads: int,
             hacked: str | None, skipped: str | None, log: Any, base_weights: str | None = None) -> Validation:
    """Measure `models` ("sft", "grpo", "incumbent") on `held_out`, each model's held-out episodes written under
    `out_dir`, and weigh the better trained one against the incumbent. SFT + GRPO is not measured when its rollouts
    hacked the reward or it never ran. A model measured before on the same held-out world (same weights, same
    `inputs`) is not played again, unless a replay's answer check needs its answers. The forgetting probe compares
    the candidate with the `base` model (whose probe is reused when `base_weights` were probed on the same items
    before). A replay's answer check (`HeldOut.check_answers`) joins the improvement
    gate: its line is added to the gate's message, its figures to the gate's details, and answers judged worse
    than the approved ones beyond chance fail the gate (replay.py: `AnswerJudging` says why)."""
    models = dict(models)
    if hacked:  # disqualified: evaluating it would decide nothing
        log.warning(f"SFT + GRPO disqualified, not evaluated: {hacked}")
        del models["grpo"]
    if skipped:
        log.warning(skipped)
        models.pop("grpo", None)
    weights = {name: model.weights() for name, model in models.items()}
    results: dict[str, EvalMetrics] = {}
    probes: dict[str, float | None] = {}
    files: dict[str, str] = {}
    simulation = None
    for name, model in models.items():
        hit = cache.get(weights[name], inputs) if weights[name] and name not in held_out.answers_needed else None
        if hit is not None:
            results[name], episodes, probes[name] = hit
            for episode in episodes:
                episode.policy_version = name
            if episodes:
                files[name] = save_held_out(episodes, out_dir, name)
            log.info(f"{name}{model.label}: the same weights were evaluated on this held-out world before; "
                     f"reusing that result (accuracy {results[name].accuracy:.1%})")
            continue
        log.info(f"evaluating {name}{model.label}")
        with torch_threads(threads):
            policy = model.load()
            results[name], episodes = held_out.play(policy, name)
            if episodes:  # each held-out episode as played, to see which tasks a model got wrong and how
                files[name] = save_held_out(episodes, out_dir, name)
            if name == "incumbent":
                simulation = simulation_label(policy)
            # A rule-based or simulated incumbent has no general knowledge to lose: no probe.
            probes[name] = forgetting_probe(policy, items=held_out.probe_items) if hasattr(policy, "model") else None
            del policy
        if weights[name]:
            cache.put(weights[name], inputs, results[name], episodes, probes[name])
    probes["base"] = _base_probe(base, base_weights, held_out.probe_items, cache, threads, log)
    held_out.close()
    choice = choose_candidate(results["sft"], results.get("grpo"), disqualified=hacked, skipped=skipped)
    log.info(choice.reason)
    improvement = promotion_gate(results[choice.name], results["incumbent"], gates,
                                 incumbent_name=f"production's {incumbent_version}")
    answers = held_out.check_answers(choice.name, gates) if held_out.check_answers is not None else None
    if answers is not None:
        (log.info if answers.passed and answers.status != "judge unavailable" else log.warning)(answers.summary)
        improvement = with_answers(improvement, answers)
    forgetting = forgetting_gate(probes[choice.name] or 0.0, probes["base"] or 0.0, gates)
    return Validation(results, probes, files, simulation, choice, improvement, forgetting, answers)


def _base_probe(base: Callable[[], Any], weights: str | None, items: list[ProbeItem] | None,
                cache: EvaluationCache, threads: int, log: Any) -> float:
    """The base model's forgetting probe: read from the cache when the same weights answered the same items before
    (every week compares with the same base, and loading it costs an engine start of its own), else measured."""
    key = _probe_key(items)
    hit = cache.get_probe(weights, key) if weights else None
    if hit is not None:
        log.info(f"base model: probed on the same items before; reusing its forgetting probe ({hit:.0%})")
        return hit
    with torch_threads(threads):
        policy = base()
        probe = forgetting_probe(policy, items=items)
        del policy
    if weights:
        cache.put_probe(weights, key, probe)
    return probe


def _probe_key(items: list[ProbeItem] | None) -> str:
    """What a probe's answer depends on besides the weights: its questions and patterns, and how the model is served
    (the engine and its dtype: bf16 and fp32 may answer differently)."""
    from agent_rl.agent.engine import ENGINE_ENV, engine_dtype

    asked = [(i.question, list(i.expected)) for i in items] if items else "built-in"
    served = [os.environ.get(ENGINE_ENV, ""), engine_dtype()]
    return hashlib.sha256(json.dumps([asked, served], default=str).encode()).hexdigest()


def with_answers(improvement: GateOutcome, answers: AnswerCheck) -> GateOutcome:
    """The improvement gate with the answer check beside it: its line in the message, its figures in the details
    (MLflow logs them as `gate.improvement.answers_*`), failed when the answer check failed."""
    figures = {"answers_status": answers.status, "answers_judged": answers.answers_judged,
               "answers_at_least_as_good": answers.answers_at_least_as_good,
               **({"answers_share": answers.share} if answers.share is not None else {}),
               **({"answers_p_value": answers.p_value} if answers.p_value is not None else {})}
    return replace(improvement, passed=improvement.passed and answers.passed,
                   message=f"{improvement.message}; {answers.summary}", details={**improvement.details, **figures})


def simulation_label(policy: Any) -> dict | None:
    """How a simulated policy (an API model played by rules) says so; None for one that is measured as it is."""
    simulation = getattr(policy, "simulation", None)
    return simulation.label() if simulation is not None else None


def save_held_out(episodes: list, folder: Path, name: str) -> str:
    """`episodes/<name>.jsonl`: one model's held-out episodes, played in the anonymized world (no personal data
    to keep out), replacing the file of an earlier run of the partition whole."""
    path = Path(folder) / "episodes" / f"{name}.jsonl"
    save_jsonl((episode.model_dump(mode="json") for episode in episodes), path)
    return str(path)


def environment_table(per_environment: dict[str, dict]) -> str:
    """Accuracy and failures of each model on each environment of a run that trains on several."""
    lines = ["| model | environment | n | accuracy | failure_rate |", "|---|---|---|---|---|"]
    for model, environments in per_environment.items():
        for name, m in environments.items():
            lines.append(f"| {model} | {name} | {m['n']} | {m['accuracy']:.1%} | {m['failure_rate']:.1%} |")
    return "\n".join(lines)
