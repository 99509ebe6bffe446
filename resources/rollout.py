"""The A/B rollout settings the sensors use, as a resource so they can be changed per deployment."""


from datetime import timedelta

from dagster import ConfigurableResource
from pydantic import Field

from agent_rl.ab.rollout import LabelSettings, RolloutConfig


class RolloutResource(ConfigurableResource):
    alpha: float = Field(default=0.05, gt=0, lt=1, description="false promotion / rollback bound")
    min_samples_per_arm: int = Field(default=100, ge=1)
    min_samples_per_step: int = Field(default=200, ge=1)
    max_step_hours: float = Field(default=72.0, gt=0)
    steps: list[float] = Field(default=[0.1, 0.5, 1.0])
    tau_squared: float = Field(default=0.01, gt=0, description="mSPRT mixture variance: the squared lift you expect")
    base_spec: str = Field(default="base", description="the model that serves as champion before one is registered")
    use_labels: bool = Field(default=True, description="read the frozen week's labels beside the ratings "
                             "(prediction-powered), when its labeler passed its check")
    labels_min_rated_per_arm: int = Field(default=10, ge=2, description="with labels: rated episodes each arm "
                                          "needs before its ratings may correct its labels")
    labels_disagreement_alpha: float = Field(default=0.05, gt=0, lt=1, description="level at which ratings "
                                             "contradicting the labels hold the test")

    def config(self) -> RolloutConfig:
        return RolloutConfig(
            steps=tuple(self.steps),
            alpha=self.alpha,
            min_samples_per_arm=self.min_samples_per_arm,
            min_samples_per_step=self.min_samples_per_step,
            max_step_duration=timedelta(hours=self.max_step_hours),
            tau_squared=self.tau_squared,
            labels=LabelSettings(use=self.use_labels, min_rated_per_arm=self.labels_min_rated_per_arm,
                                 disagreement_alpha=self.labels_disagreement_alpha),
        )
