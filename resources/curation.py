"""Curation settings: the quality gates that stop training, balancing, and the planted privacy canaries."""

from typing import Literal

from dagster import ConfigurableResource
from pydantic import Field, field_validator, model_validator

from agent_rl.privacy.anonymize import AnonymizerConfig
from agent_rl.curation.balance import BalanceConfig
from agent_rl.curation.datasets import DEFAULT_MAX_IDK_SHARE
from agent_rl.curation.validate import DEFAULT_EPISODE_CHARS, GateConfig


class CurationResource(ConfigurableResource):
    min_points: int = Field(default=5000, ge=0, description="clean episodes a partition needs to feed training")
    min_clean_ratio: float = Field(default=0.95, ge=0, le=1)
    min_categories: int = Field(default=5, ge=0)
    cap_per_category: int = Field(default=2000, ge=1, description="balanced episodes per task category")
    min_quality: float = Field(default=0.8, ge=0, le=1, description="SFT keeps correct episodes at least this good")
    allow_empty_sft: bool = Field(default=False, description="no episode good enough for SFT skips SFT instead of "
                                  "failing the run (a reinforcement fine-tuning job: GRPO then starts from the base "
                                  "model)")
    max_idk_share: float | None = Field(
        default=DEFAULT_MAX_IDK_SHARE, ge=0, lt=1,
        description="most SFT rows answering \"I don't know\" (share; None = no cap; see curation.datasets.sft_rows)")
    canaries: list[str] = Field(default_factory=list, description="planted PII that must never survive curation")
    public_terms: list[str] = Field(
        default_factory=list, description="names in your data that are never a person's (departments, sites, cities, "
        "products): a name detector leaves them, so task answers survive anonymization; a name that is also a "
        "person's first or last name in the name lists stays replaced inside a person's name")

    max_episode_chars: int = Field(
        default=DEFAULT_EPISODE_CHARS, ge=1, description="characters of text one episode may hold: a larger one is "
        "quarantined ('episode too large') before the privacy pass reads it (curation.validate.ValidationConfig)")
    max_tenant_share: float = Field(
        default=0.5, gt=0, le=1, description="most of a gateway week's SFT rows and of its held-out replay set one "
        "tenant may hold when several tenants sent traffic (at least 1/tenants; agent_rl/curation/tenants.py)")

    distrust_disagreeing_tenants: bool = Field(
        default=True, description="a tenant whose 'up' ratings disagree with the evidence it does not control (a "
        "labeler fitted on the other tenants' ratings, the implicit signals) loses its ratings for the week: its "
        "episodes leave the SFT rows and the held-out set and fit no labeler; off: it is only reported "
        "(agent_rl/curation/tenant_agreement.py)")
    tenant_agreement_alpha: float = Field(default=0.01, gt=0, lt=1, description="false-flag rate per honest tenant")
    tenant_agreement_min_rated: int = Field(default=20, ge=1, description="ratings a tenant needs to be checked")
    tenant_agreement_min_effect: float = Field(
        default=0.2, ge=0, lt=0.5, description="how far past 0.5 the share of pairs where the tenant's 'up' episode "
        "shows less satisfaction than another tenant's must be, besides p < alpha")

    label_unrated: bool = Field(default=True, description="gateway episodes: label the ones nobody rated from their "
                                "implicit signals, with a labeler calibrated on the rated ones (agent_rl/feedback)")
    label_positive_threshold: float = Field(default=0.8, gt=0.5, le=1, description="labeled good at or above")
    label_negative_threshold: float = Field(default=0.2, ge=0, lt=0.5, description="labeled bad at or below")
    labeler_min_auc: float = Field(default=0.76, ge=0.5, le=1, description="the labeler's check: out-of-fold AUC")
    labeler_max_ece: float = Field(default=0.05, gt=0, le=1, description="the labeler's check: calibration error")
    labeler_judge: str | None = Field(
        default=None, description="a model judge labels instead of the signals, held to the same thresholds and "
        "bars: JSON of agent_rl.feedback.judge.JudgeConfig ({\"endpoint\": {\"base_url\": ..., \"model\": ..., "
        "\"api_key_env\": ...}, \"mode\": \"absolute\" or \"relative\"}); None: the signals labeler")
    labeler_judge_role: Literal["labeler", "signal"] = Field(
        default="labeler", description="what `labeler_judge` does: \"labeler\" labels with the judge's own scores "
        "(checked against the ratings, never fitted to them); \"signal\" adds its score to the implicit signals as "
        "one more input of the signals labeler, which learns from the ratings how far to trust it, calibrates the "
        "combination and checks it out of fold (needs the signals labeler's 100 ratings, 20 of each kind)")

    @field_validator("labeler_judge")
    @classmethod
    def _judge_config(cls, value: str | None) -> str | None:
        from agent_rl.feedback.judge import JudgeConfig

        if value:
            JudgeConfig.model_validate_json(value)  # a misspelt field fails when the profile loads
        return value

    @model_validator(mode="after")
    def _signal_needs_a_judge(self):
        if self.labeler_judge_role == "signal" and not self.labeler_judge:
            raise ValueError("labeler_judge_role \"signal\" needs a judge: set labeler_judge (JSON of "
                             "agent_rl.feedback.judge.JudgeConfig), or use the role \"labeler\"")
        return self

    def labeler(self):
        """The labeler's settings (a model judge's when `labeler_judge` is set, alone or as one signal of the signals
        labeler by `labeler_judge_role`), or None when unrated gateway episodes stay unlabeled."""
        from agent_rl.feedback.labeler import LabelerConfig

        if not self.label_unrated:
            return None
        signals = LabelerConfig(positive_threshold=self.label_positive_threshold,
                                negative_threshold=self.label_negative_threshold, min_auc=self.labeler_min_auc,
                                max_ece=self.labeler_max_ece)
        if not self.labeler_judge:
            return signals
        from agent_rl.feedback.judge import JudgeConfig
        from agent_rl.feedback.judge_agreement import JudgeAndSignalsLabeler, JudgeLabeler

        judge = JudgeConfig.model_validate_json(self.labeler_judge)
        if self.labeler_judge_role == "signal":
            return JudgeAndSignalsLabeler(judge=judge, signals=signals)
        return JudgeLabeler(judge=judge, positive_threshold=signals.positive_threshold,
                            negative_threshold=signals.negative_threshold, min_auc=signals.min_auc,
                            max_ece=signals.max_ece)

    def tenant_agreement(self):
        """The settings of the check of each tenant's ratings against the week's other evidence."""
        from agent_rl.curation.tenant_agreement import AgreementConfig

        return AgreementConfig(min_rated=self.tenant_agreement_min_rated, alpha=self.tenant_agreement_alpha,
                               min_effect=self.tenant_agreement_min_effect)

    def anonymizer(self, public_terms: tuple[str, ...] = ()) -> AnonymizerConfig:
        """The anonymizer's settings: these public terms, the data's own (`public_terms`) after them."""
        return AnonymizerConfig(public_terms=tuple(dict.fromkeys([*self.public_terms, *public_terms])))

    def gates(self) -> GateConfig:
        return GateConfig(min_points=self.min_points, min_clean_ratio=self.min_clean_ratio,
                          min_categories=self.min_categories)

    def balance(self) -> BalanceConfig:
        return BalanceConfig(cap_per_category=self.cap_per_category)
