"""The rollout controller: starts an A/B test when a challenger is registered and applies the decisions.

Its state (a RolloutState) is saved with every routing change in the pool's routing history,
so the sensors that call it keep no state of their own and a restarted Dagster daemon, or a
second deployment, resumes the same test. Every decision is recorded three times: the routing
history (with its statistics), MLflow version tags, and the caller's log; each shows the evidence it
read (ratings alone or ratings and labels, per arm rated and labeled episodes, both lifts, the statistic).

When a test starts, the newest labeler curation kept (agent_rl/feedback/frozen.py), fitted on ratings older than
the test, is copied into the test's own folder and named in its state: every look of that test scores both arms'
unjudged episodes with it, whatever later weeks' curation fits (agent_rl/ab/evidence.py: what the test assumes).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agent_rl import registry, settings
from agent_rl.ab.evidence import LabeledArm
from agent_rl.ab.outcomes import arm_stats_from_episodes, labeled_arms_from_episodes
from agent_rl.ab.rollout import Decision, Labels, RolloutConfig, RolloutState, apply_decision, decide
from agent_rl.ab.stats import ArmStats
from agent_rl.pool.repository import PoolRepository
from agent_rl.utc import as_utc

BASE_VERSION = "base"  # what an empty routing table serves: the prompted base model
STATE_KEY = "rollout_state"


def incumbent_of(weights: dict[str, float]) -> str | None:
    """The version production serves now: the largest share of the routing table (ties: by name); None when
    nothing is routed (a version at weight 0 serves nothing)."""
    routed = [version for version, weight in weights.items() if weight > 0]
    if not routed:
        return None
    return min(routed, key=lambda version: (-weights[version], version))


def latest_state(pool: PoolRepository) -> RolloutState | None:
    """The latest rollout state recorded in the pool's routing history, if any (whichever agent's test it is)."""
    for change in reversed(pool.routing_history()):
        if change.stats and STATE_KEY in change.stats:
            return RolloutState.model_validate(change.stats[STATE_KEY])
    return None


def is_registered_version(version: str) -> bool:
    return version.startswith("v") and version[1:].isdigit()


def version_id(registry_version: str) -> str:
    """Routing/pool name of a registry version: `v3` (its spec is `mlflow:v3`)."""
    return f"v{registry_version}"


def version_spec(version: str, base_spec: str = "base") -> str:
    """Where the arbiter loads a version from: the base model spec, or the registry."""
    return base_spec if version == BASE_VERSION else f"mlflow:{version}"


class RolloutController:
    def __init__(
        self,
        pool: PoolRepository,
        config: RolloutConfig | None = None,
        tracking_uri: str | None = None,
        model_name: str = registry.MODEL_NAME,
        log: Callable[[str], Any] = logging.getLogger(__name__).info,
        base_spec: str = "base",
        home: Path | None = None,
    ) -> None:
        self.pool = pool
        self.config = config or RolloutConfig()
        self.tracking_uri = tracking_uri
        self.model_name = model_name
        self.log = log
        self.base_spec = base_spec
        self.home = home  # where curation's labelers and the tests' frozen copies lie; None: AGENT_RL_HOME

    def _home(self) -> Path:
        return self.home if self.home is not None else settings.home()

    # -- state ------------------------------------------------------------------------------

    def current_state(self) -> RolloutState | None:
        """The latest rollout state recorded in the routing history, if any."""
        return latest_state(self.pool)

    def _alias(self, alias: str) -> registry.RegisteredVersion | None:
        try:
            return registry.get_version(alias, name=self.model_name, tracking_uri=self.tracking_uri)
        except LookupError:
            return None

    # -- actions ----------------------------------------------------------------------------

    def start_if_new_challenger(self, now: datetime | None = None) -> RolloutState | None:
        """Route 10% to a newly registered `challenger`; None when there is nothing new to test."""
        found = self._alias("challenger")
        if found is None:
            return None
        challenger = version_id(found.version)
        state = self.current_state()
        if state is not None and state.challenger == challenger and state.model_name in (None, self.model_name):
            return None  # already under test, promoted or rolled back (another agent's model numbers alike)
        if state is not None and not state.finished:
            self.log(f"challenger {challenger} waits: the test of {state.challenger} is still running")
            return None
        # The champion is what production serves when the challenger arrives (a registered model, a rule-based
        # agent, an external API model), never a stand-in; whatever else is routed keeps its share, scaled.
        routing = self.pool.get_routing()
        baseline = {v: w for v, w in routing.weights.items() if w > 0 and v != challenger}
        if not baseline:
            baseline = {BASE_VERSION: 1.0}
        champion = incumbent_of(baseline)
        started = as_utc(now) if now is not None else datetime.now(timezone.utc)
        labeler, labeler_note = self._freeze_labeler(challenger, started)
        new = RolloutState.start(champion, challenger, self.config, now=started, baseline_weights=baseline,
                                 model_name=self.model_name, labeler=labeler, labeler_note=labeler_note)
        weights = new.weights()
        self.pool.set_routing(
            weights,
            specs=self._specs(weights, routing.specs),
            reason=f"A/B test started: {challenger} at {new.step_share:.0%} against {champion}",
            actor="challenger_sensor",
            stats={STATE_KEY: new.model_dump(mode="json")},
        )
        registry.tag_version(found.version, {"rollout": "testing", "rollout.step": f"{new.step_share:.2f}"},
                             name=self.model_name, tracking_uri=self.tracking_uri)
        self.log(f"A/B test started: {weights}; {labeler_note}")
        return new

    def _freeze_labeler(self, challenger: str, started: datetime) -> tuple[str | None, str]:
        """The newest labeler curation kept, fitted on ratings before `started`, copied for this test (its path
        relative to the home, and a note); (None, why) when there is none."""
        from agent_rl.feedback.frozen import freeze_for_test

        return freeze_for_test(self._home(), self.model_name, challenger, started)

    def labels(self, state: RolloutState, episodes: list) -> Labels:
        """Both arms' episodes scored by the labeler frozen for this test, or why there is nothing to score (with
        the episodes served per arm either way). `episodes` are both arms' since the test began."""
        served = dict(Counter(episode.policy_version for episode in episodes))
        if state.labeler is None:
            return Labels(note=state.labeler_note or "no labeler was frozen when this test started", served=served)
        if not self.config.labels.use:
            return Labels(note="labels are off (use_labels false)", served=served)
        from agent_rl.feedback.frozen import FrozenLabeler

        try:
            frozen = FrozenLabeler.load(self._home() / state.labeler)
        except (OSError, ValueError, KeyError, EOFError, AttributeError, ImportError) as exc:
            return Labels(note=f"the labeler frozen for this test cannot be read ({state.labeler}: "
                               f"{type(exc).__name__}: {exc})", served=served)
        arms = labeled_arms_from_episodes(episodes, frozen.probabilities, since=state.test_started_at)
        return Labels(champion=arms.get(state.champion, LabeledArm()),
                      challenger=arms.get(state.challenger, LabeledArm()), labeler=frozen.summary(), served=served)

    def evaluate(self, now: datetime | None = None) -> Decision | None:
        """Decide on the running test from the pool's outcomes since it began; None when none runs."""
        state = self.current_state()
        if state is None or state.finished:
            return None
        episodes = [
            episode
            for page in self.pool.iter_export(start=state.test_started_at)
            for episode in page.episodes
            if episode.policy_version in (state.champion, state.challenger)
        ]
        stats = arm_stats_from_episodes(episodes, since=state.test_started_at, step_starts=state.step_starts())
        looked = as_utc(now) if now is not None else datetime.now(timezone.utc)
        decision = decide(
            state, stats.get(state.champion, ArmStats(0, 0)), stats.get(state.challenger, ArmStats(0, 0)),
            self.config, now=now, labels=self.labels(state, episodes),
            unserved=self.pool.serving_failures(looked - self.config.outage_hold),
        )
        if decision.action == "hold":
            return decision
        new_state = apply_decision(state, decision)
        self.pool.set_routing(
            decision.new_weights,
            specs=self._specs(decision.new_weights, self.pool.get_routing().specs),
            reason=f"{decision.action}: {decision.reason}",
            actor="rollout_sensor",
            stats={STATE_KEY: new_state.model_dump(mode="json"), "decision": decision.stats},
        )
        self._record_in_registry(state, decision)
        self.log(f"rollout {decision.message()}")
        return decision

    def _specs(self, weights: dict[str, float], known: dict[str, str]) -> dict[str, str]:
        """Where each routed version loads from: the spec it was routed with, else its registry or base spec."""
        return {v: known.get(v) or version_spec(v, self.base_spec) for v in weights}

    def _record_in_registry(self, state: RolloutState, decision: Decision) -> None:
        challenger = state.challenger.removeprefix("v")
        tags = {"rollout": decision.action, "rollout.cause": str(decision.cause), "rollout.reason": decision.reason[:500]}
        test = decision.stats.get("test") if isinstance(decision.stats, dict) else None
        if isinstance(test, dict):
            tags.update({f"rollout.{k}": test[k] for k in ("p_value", "lift", "n", "method") if k in test})
        tags.update(evidence_tags(decision.stats.get("evidence") if isinstance(decision.stats, dict) else None))
        if decision.action == "promote":
            tags["rollout"] = "promoted"
            if is_registered_version(state.champion):
                registry.set_alias("previous_champion", state.champion.removeprefix("v"),
                                   name=self.model_name, tracking_uri=self.tracking_uri)
            registry.set_alias("champion", challenger, name=self.model_name, tracking_uri=self.tracking_uri)
            registry.delete_alias("challenger", name=self.model_name, tracking_uri=self.tracking_uri)
        elif decision.action == "rollback":
            tags["rollout"] = "rolled_back"
            registry.delete_alias("challenger", name=self.model_name, tracking_uri=self.tracking_uri)
        else:
            tags["rollout.step"] = f"{decision.new_weights.get(state.challenger, 0):.2f}"
        registry.tag_version(challenger, tags, name=self.model_name, tracking_uri=self.tracking_uri)


def evidence_tags(evidence: dict[str, Any] | None) -> dict[str, Any]:
    """MLflow tags of the evidence a decision read: its source, per arm rated and labeled episodes, the ratings'
    and labels' lifts, the ratings-vs-labels check, the frozen labeler's week and check, and the summary line."""
    if not evidence:
        return {}
    tags: dict[str, Any] = {"rollout.evidence": evidence.get("source"),
                            "rollout.evidence.summary": str(evidence.get("summary", ""))[:500]}
    for role in ("champion", "challenger"):
        arm = evidence.get(role) or {}
        for key in ("episodes", "rated", "labeled"):
            if arm.get(key) is not None:
                tags[f"rollout.{role}.{key}"] = arm[key]
    for key in ("ratings_lift", "labels_lift"):
        if evidence.get(key) is not None:
            tags[f"rollout.{key}"] = f"{evidence[key]:.4f}"
    check = evidence.get("disagreement") or {}
    if check:
        tags["rollout.labels_vs_ratings_z"] = f"{check['z']:.3f}"
        tags["rollout.labels_disagree"] = check["disagree"]
    labeler = evidence.get("labeler") or {}
    if labeler:
        tags["rollout.labeler"] = (f"week {labeler.get('week')}: "
                                   + ("passed" if labeler.get("passed") else f"failed ({labeler.get('reason')})")
                                   + (f", AUC {labeler['auc']:.3f}" if labeler.get("auc") is not None else "")
                                   + (f", ECE {labeler['ece']:.3f}" if labeler.get("ece") is not None else ""))[:500]
    if evidence.get("note"):
        tags["rollout.evidence.note"] = str(evidence["note"])[:500]
    return tags
