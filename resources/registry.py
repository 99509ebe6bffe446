"""The MLflow tracking server and model registry, as a typed resource (dagster-mlflow is a legacy resource
that pins pandas<3, so we wrap our own)."""


from dagster import ConfigurableResource
from pydantic import Field

from agent_rl import settings
from agent_rl.registry import MODEL_NAME


class MlflowResource(ConfigurableResource):
    tracking_uri: str = Field(default="", description="empty: MLFLOW_TRACKING_URI or sqlite under AGENT_RL_HOME")
    experiment: str = Field(default="agent-rl")
    model_name: str = Field(default=MODEL_NAME, description="registered model name (one per environment: "
                            "agent-rl-email, agent-rl-support, ...)")

    def uri(self) -> str:
        return self.tracking_uri or settings.mlflow_uri()
