"""Validation settings: the held-out sample and the gates a candidate must pass to be registered."""

from dagster import ConfigurableResource
from pydantic import Field, field_validator

from agent_rl.evaluate.harness import EvalConfig
from agent_rl.evaluate.gates import GateKind, GateSettings
from agent_rl.turn_budget import DEFAULT_MAX_TURNS


class EvaluationResource(ConfigurableResource):
    max_tasks: int = Field(default=60, ge=1, description="held-out tasks per model (fixed seed)")
    seed: int = 0
    gate: GateKind = Field(default="superiority", description="superiority (fewer errors, paired test), "
                           "non_inferiority (within a margin at lower cost) or open (no quality bar)")
    min_error_reduction: float = Field(default=0.10, le=1, description="superiority: share of the incumbent's "
                                       "errors the candidate must avoid")
    alpha: float = Field(default=0.05, gt=0, le=1, description="level of the paired test and the confidence bounds")
    non_inferiority_margin: float = Field(default=0.05, ge=0, le=1, description="accuracy points the candidate "
                                          "may trail by under non_inferiority")
    min_cost_ratio: float = Field(default=5.0, ge=1, description="non_inferiority: times cheaper per 1k requests")
    max_forgetting_drop: float = Field(default=0.10, ge=0, le=1)
    torch_threads: int = Field(default=1, ge=1, description="CPU threads for the models under evaluation (it runs "
                               "in the Dagster step's process); 1 on a busy machine, every core when it runs alone")
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1, description="turn budget per episode; GRPO trains with "
                           "the same one unless grpo_overrides sets max_turns apart")
    batch_size: int = Field(default=16, ge=1, description="episodes decoded together; larger is faster when the "
                            "evaluation has the machine to itself (bf16 greedy outputs depend slightly on it)")

    answer_judge: str | None = Field(
        default="labeler", description="replay validation (a gateway week) compares the candidate's answers in words "
        "with the approved episodes' through this model judge (agent_rl/evaluate/replay.py: AnswerJudging): JSON of "
        "agent_rl.feedback.judge.JudgeConfig ({\"endpoint\": {\"base_url\": ..., \"model\": ..., \"api_key_env\": "
        "...}}); \"labeler\" (default): the week's labeler judge (curation's labeler_judge) when one is set; None "
        "or \"\": no judge, answer quality is left to the A/B test")
    min_answer_share: float = Field(
        default=0.5, ge=0, le=1, description="the answer check fails the improvement gate when the share of answers "
        "judged at least as good as the approved ones is below this beyond chance (exact test at alpha, over "
        "episodes); 0: report only")

    @field_validator("answer_judge")
    @classmethod
    def _judge_config(cls, value: str | None) -> str | None:
        from agent_rl.feedback.judge import JudgeConfig

        if value and value.strip() != "labeler":
            JudgeConfig.model_validate_json(value)  # a misspelt field fails when the profile loads
        return value

    def answer_judging(self, labeler_judge: str | None = None):
        """The answer check's judge and bar (`AnswerJudging`), or None when no judge is set: `answer_judge`, or the
        week's labeler judge (`labeler_judge`, JSON of JudgeConfig) when `answer_judge` is "labeler"."""
        from agent_rl.evaluate.replay import AnswerJudging
        from agent_rl.feedback.judge import JudgeConfig

        chosen = labeler_judge if (self.answer_judge or "").strip() == "labeler" else self.answer_judge
        if not chosen:
            return None
        return AnswerJudging(judge=JudgeConfig.model_validate_json(chosen), min_share=self.min_answer_share,
                             seed=self.seed)

    def eval_config(self) -> EvalConfig:
        return EvalConfig(max_tasks=self.max_tasks, seed=self.seed, max_turns=self.max_turns,
                          batch_size=self.batch_size)

    def gates(self) -> GateSettings:
        return GateSettings(kind=self.gate, min_error_reduction=self.min_error_reduction, alpha=self.alpha,
                            margin=self.non_inferiority_margin, min_cost_ratio=self.min_cost_ratio,
                            max_forgetting_drop=self.max_forgetting_drop, seed=self.seed)
