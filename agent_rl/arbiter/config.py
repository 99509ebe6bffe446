"""Typed configuration of the arbiter service, with defaults that run on a laptop."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PositiveInt, field_validator

from agent_rl.environments.runner import RunnerConfig
from agent_rl.arbiter.files import FilesConfig
from agent_rl.arbiter.keys import ApiKey
from agent_rl.arbiter.vllm_lora import VllmServing
from agent_rl.finetuning.jobs import JobsConfig


class ArbiterConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    pool_url: str | None = Field(None, description="benchmark pool; default AGENT_RL_POOL_URL or SQLite under AGENT_RL_HOME")
    # Settable as `inbox_url` too (its first name, kept for existing configurations).
    store_url: str | None = Field(
        None, validation_alias=AliasChoices("store_url", "inbox_url"),
        description="the store of the world the environment's contexts live in, for an environment that takes one "
                    "(the email assistant's inbox store); default AGENT_RL_STORE_URL or SQLite under AGENT_RL_HOME")
    admin_token_env: str = Field(
        "AGENT_RL_ADMIN_TOKEN", description="environment variable holding the bearer token for routing changes"
    )
    api_keys: tuple[ApiKey, ...] | None = Field(
        None, description="keys of the callers of /v1/ask and /v1/feedback; None reads api_keys_file or the environment"
    )
    api_keys_file: Path | None = Field(
        None, description="JSON list of API key entries; default $AGENT_RL_API_KEYS_FILE, else the JSON in $AGENT_RL_API_KEYS"
    )
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    default_routing: dict[str, float] = Field(
        default_factory=lambda: {"heuristic": 1.0},
        description="weights used while the pool's routing table is empty (version names double as specs)",
    )
    environment: str = Field(
        "email", description="the environment /v1/ask serves: 'email' (inboxes and scenarios) or a plug-in by name "
                             "or import path, whose tasks are the replayable references and whose contexts callers name")
    # Settable as `scenarios_path` too (its first name, kept for existing configurations).
    tasks_path: Path | None = Field(
        None, validation_alias=AliasChoices("tasks_path", "scenarios_path"),
        description="the replayable tasks' file, for an environment that reads one (the email assistant: JSONL of "
                    "Scenario records); requests naming a task_id are judged against it"
    )
    batch_window_ms: float = Field(
        0.0, ge=0, le=1000, description="how long to wait for more requests of the same version before running a batch"
    )
    max_batch: PositiveInt = Field(16, description="most episodes run together in one runner call (and committed in one transaction)")
    episode_workers: PositiveInt = Field(4, description="threads that run episodes (each has its own inbox connection)")
    routing_ttl_s: float = Field(1.0, ge=0, description="how long routing read from the pool is reused")
    split_cores: bool = Field(
        True, description="while several versions on engines of their own are routed (an A/B test on CPU), each "
                          "engine computes on its share of the cores (agent_rl/arbiter/placement.py)")
    max_body_bytes: PositiveInt = Field(64 * 1024, description="larger request bodies are refused with 413")
    # The OpenAI-compatible gateway (gateway/): whole conversations travel in each request.
    gateway_max_body_bytes: PositiveInt = Field(
        4 * 1024 * 1024, description="larger gateway request bodies (/v1/chat/completions) are refused with 413")
    gateway_idle_s: float = Field(300.0, gt=0, description="a gateway episode without calls for this long ends and is written")
    gateway_write_retry_s: float = Field(
        3.0, ge=0, description="how long an episode write retries (with backoff) before an explicit end answers 503")
    gateway_rate_per_s: float = Field(20.0, gt=0, description="gateway requests per second per API key (token bucket)")
    gateway_rate_burst: PositiveInt = Field(40, description="gateway requests one API key may send at once")
    gateway_max_live: PositiveInt = Field(
        10_000, description="live gateway episodes kept in memory; beyond it the least recently active one ends")
    files: FilesConfig = Field(default_factory=FilesConfig, description="OpenAI's Files API (/v1/files): where "
                               "uploads are kept, size limits")
    jobs: JobsConfig = Field(default_factory=JobsConfig, description="OpenAI's fine-tuning jobs API "
                             "(/v1/fine_tuning/jobs): where jobs are kept, which graders a job may bring")
    vllm: VllmServing | None = Field(
        None, description="serve registered versions as adapters loaded on this vLLM server (GPU) instead of on "
                          "the arbiter's own shared base")

    @field_validator("environment")
    @classmethod
    def _known_environment(cls, spec: str) -> str:
        from agent_rl.environments.core import EnvironmentError
        from agent_rl.environments.registry import resolve

        try:
            resolve(spec)
        except EnvironmentError as exc:
            raise ValueError(str(exc)) from None
        return spec.strip()

    @field_validator("default_routing")
    @classmethod
    def _some_traffic(cls, weights: dict[str, float]) -> dict[str, float]:
        if not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError("default_routing needs weights >= 0 with a positive sum, e.g. {'heuristic': 1.0}")
        return weights
