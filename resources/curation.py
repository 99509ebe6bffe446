"""Curation settings: the quality gates that stop training, balancing, and the planted privacy canaries."""


from dagster import ConfigurableResource
from pydantic import Field

from agent_rl.curation.balance import BalanceConfig
from agent_rl.curation.datasets import DEFAULT_MAX_IDK_SHARE
from agent_rl.curation.validate import GateConfig


class CurationResource(ConfigurableResource):
    min_points: int = Field(default=5000, ge=0, description="clean episodes a partition needs to feed training")
    min_clean_ratio: float = Field(default=0.95, ge=0, le=1)
    min_categories: int = Field(default=5, ge=0)
    cap_per_category: int = Field(default=2000, ge=1, description="balanced episodes per task category")
    min_quality: float = Field(default=0.8, ge=0, le=1, description="SFT keeps correct episodes at least this good")
    max_idk_share: float | None = Field(
        default=DEFAULT_MAX_IDK_SHARE, ge=0, lt=1,
        description="most SFT rows answering \"I don't know\" (share; None = no cap; see curation.datasets.sft_rows)")
    canaries: list[str] = Field(default_factory=list, description="planted PII that must never survive curation")

    def gates(self) -> GateConfig:
        return GateConfig(min_points=self.min_points, min_clean_ratio=self.min_clean_ratio,
                          min_categories=self.min_categories)

    def balance(self) -> BalanceConfig:
        return BalanceConfig(cap_per_category=self.cap_per_category)
