"""The reward rubric, after ART-E: tiers by outcome, plus small extra credit inside each tier.

Tiers, worst to best (default weights):
  format error            -2.0 .. -1.8   + partial credit
  wrong answer            -1.0           + partial credit
  "I don't know"/ran out   0.0           + partial credit
  correct                  1.0           + right sources + source precision + turn efficiency
Partial credit (found the right email in search results, read it, cited it) stays below 0.5,
so no amount of it lifts an episode into the next tier. "I don't know" on an unanswerable
question is judged correct before it reaches the rubric (the runner decides the outcome).

On the ground floor: an environment's judge scores with it, its rollouts carry a `RubricObservation` for GRPO's
reward groups (environments/rollouts.py, train/rewards.py) and the runner marks format errors with `FormatErrorKind`;
it needs nothing but the records. agent_rl/reward/rubric.py re-exports it under its old name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent_rl.records import Outcome
from agent_rl.turn_budget import DEFAULT_MAX_TURNS


class FormatErrorKind(StrEnum):
    UNPARSABLE = "unparsable_tool_call"  # the model's output held a tool call we could not parse
    UNKNOWN_TOOL = "unknown_tool"  # it called a tool that does not exist
    NO_TOOL_CALL = "no_tool_call"  # it wrote plain text: answers must come through return_final_answer
    POLICY_ERROR = "policy_error"  # the policy itself failed (raised, or returned garbage)


@dataclass
class RubricObservation:
    """Everything the rubric looks at, gathered from one finished episode."""

    outcome: Outcome
    sources: list[str] = field(default_factory=list)
    gold_source_ids: list[str] = field(default_factory=list)
    found_gold: bool = False  # a gold email appeared in some search result
    read_gold: bool = False  # the agent read a gold email
    turns: int = 0
    max_turns: int = DEFAULT_MAX_TURNS
    format_error: FormatErrorKind | None = None

    @property
    def answer_correct(self) -> bool:
        return self.outcome == Outcome.CORRECT

    @property
    def cited_gold(self) -> bool:
        return bool(set(self.sources) & set(self.gold_source_ids))

    @property
    def sources_correct(self) -> bool:
        """All gold emails cited; for an unanswerable question, nothing cited."""
        if not self.gold_source_ids:
            return not self.sources
        return set(self.gold_source_ids) <= set(self.sources)

    @property
    def source_precision(self) -> float:
        """Share of cited emails that are gold: citing every hit is not free."""
        if not self.sources:
            return 1.0 if not self.gold_source_ids else 0.0
        return len(set(self.sources) & set(self.gold_source_ids)) / len(set(self.sources))


class RubricWeights(BaseModel):
    """The rubric's numbers; validation keeps the tiers strictly ordered whatever they are set to."""

    model_config = ConfigDict(frozen=True, extra="forbid")  # a misspelt weight fails instead of being ignored

    unparsable_tool_call: float = Field(-2.0, description="base reward for an unparsable tool call")
    unknown_tool: float = Field(-1.9, description="base reward for calling a tool that does not exist")
    no_tool_call: float = Field(-1.8, description="base reward for answering in plain text")
    policy_error: float = Field(-2.0, description="base reward when the policy failed outright")
    wrong: float = Field(-1.0, description="base reward for a wrong answer")
    idk: float = Field(0.0, description="base reward for saying \"I don't know\" on an answerable question")
    ran_out: float = Field(0.0, description="base reward for running out of turns, tokens or time")
    correct: float = Field(1.0, description="base reward for a correct answer")
    found_gold: float = Field(0.1, ge=0, description="partial credit: a gold email appeared in search results")
    read_gold: float = Field(0.2, ge=0, description="partial credit: a gold email was read")
    cited_gold: float = Field(0.1, ge=0, description="partial credit: a gold email was cited")
    sources_correct: float = Field(0.3, ge=0, description="correct tier: all gold emails cited")
    source_precision: float = Field(0.1, ge=0, description="correct tier: times the share of citations that are gold")
    turn_efficiency: float = Field(0.1, ge=0, description="correct tier: times the share of turns left unused")

    @property
    def partial_max(self) -> float:
        return self.found_gold + self.read_gold + self.cited_gold

    def format_error_base(self, kind: FormatErrorKind) -> float:
        return float(getattr(self, kind.value))

    @model_validator(mode="after")
    def _tiers_ordered(self) -> RubricWeights:
        if self.partial_max >= 0.5:
            raise ValueError(f"partial credit found_gold+read_gold+cited_gold = {self.partial_max} must stay below 0.5")
        worst_format = max(self.format_error_base(kind) for kind in FormatErrorKind)
        checks = [
            ("every format error + partial credit", worst_format + self.partial_max, "wrong", self.wrong),
            ("wrong + partial credit", self.wrong + self.partial_max, "min(idk, ran_out)", min(self.idk, self.ran_out)),
            ("max(idk, ran_out) + partial credit", max(self.idk, self.ran_out) + self.partial_max, "correct", self.correct),
        ]
        for lower_name, lower, upper_name, upper in checks:
            if not lower < upper:
                raise ValueError(f"rubric tiers out of order: {lower_name} = {lower} must be below {upper_name} = {upper}")
        return self


@dataclass(frozen=True)
class Reward:
    total: float
    components: dict[str, float]


def _partial(obs: RubricObservation, weights: RubricWeights) -> dict[str, float]:
    return {
        "found_gold": weights.found_gold if obs.found_gold else 0.0,
        "read_gold": weights.read_gold if obs.read_gold else 0.0,
        "cited_gold": weights.cited_gold if obs.cited_gold else 0.0,
    }


def score(obs: RubricObservation, weights: RubricWeights | None = None) -> Reward:
    """The reward of one episode; `components` name every term and sum to `total`."""
    weights = weights or RubricWeights()
    components: dict[str, float]

    if obs.outcome == Outcome.FORMAT_ERROR:
        kind = obs.format_error or FormatErrorKind.UNPARSABLE
        components = {f"format_error.{kind.value}": weights.format_error_base(kind), **_partial(obs, weights)}
    elif obs.outcome == Outcome.WRONG:
        components = {"wrong": weights.wrong, **_partial(obs, weights)}
    elif obs.outcome == Outcome.IDK:
        components = {"idk": weights.idk, **_partial(obs, weights)}
    elif obs.outcome == Outcome.RAN_OUT:
        components = {"ran_out": weights.ran_out, **_partial(obs, weights)}
    else:  # correct
        turns_left = 1.0 - min(max(obs.turns, 0), obs.max_turns) / max(obs.max_turns, 1)
        components = {
            "correct": weights.correct,
            "sources_correct": weights.sources_correct if obs.sources_correct else 0.0,
            "source_precision": weights.source_precision * obs.source_precision,
            "turn_efficiency": weights.turn_efficiency * turns_left,
        }
    return Reward(total=sum(components.values()), components=components)


def reward_bounds(weights: RubricWeights | None = None) -> tuple[float, float]:
    """The lowest and highest reward `score` can give with these weights (curation checks rewards fall inside)."""
    weights = weights or RubricWeights()
    lowest = min(weights.format_error_base(kind) for kind in FormatErrorKind)
    highest = weights.correct + weights.sources_correct + weights.source_precision + weights.turn_efficiency
    return lowest, highest
