"""Versions served by a vLLM server as LoRA adapters on its one base model, loaded and unloaded at run time.

On a GPU the base model lives in a vLLM server started with LoRA enabled (`vllm serve BASE --enable-lora
--max-lora-rank R`, with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`). Promoting or rolling back a version then
loads or unloads an adapter through vLLM's dynamic-adapter endpoints instead of starting a server:

    POST {base_url}/load_lora_adapter    {"lora_name": NAME, "lora_path": DIR}
    POST {base_url}/unload_lora_adapter  {"lora_name": NAME}

and requests for the version are ordinary chat completions with `model=NAME`. A `VllmAdapterUpstream` is such a
version: an `OpenAIUpstream` (gateway and batch paths alike) whose model is the adapter's name, loading the
adapter when the arbiter loads the version and unloading it when the routing drops it (`release`).

vLLM takes one adapter per name, and registered versions can be two-adapter stacks (SFT, then GRPO trained over
the merged SFT model). Both add low-rank updates, so the stack is written as one adapter whose rank is the sum
(`write_combined_adapter`): the server's --max-lora-rank must allow it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat

from agent_rl.agent.row_lora import write_combined_adapter
from agent_rl.arbiter.upstreams import ENV_NAME_PATTERN, OpenAIUpstream, OpenAIUpstreamConfig, spec_problems

LORA_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"


class VllmAdapterConfig(BaseModel):
    """`vllm-lora:{...}`: one adapter on a vLLM server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(min_length=1, pattern=r"^https?://", description="the vLLM server's OpenAI base URL, with /v1")
    lora_name: str = Field(pattern=LORA_NAME_PATTERN, description="the adapter's name on the server (the request's model)")
    lora_path: str = Field(min_length=1, description="the adapter directory as the vLLM server sees it")
    api_key_env: str | None = Field(None, pattern=ENV_NAME_PATTERN, description="environment variable with the server's key")
    timeout_s: PositiveFloat = 60.0
    max_retries: NonNegativeInt = Field(2, le=5)


class VllmServing(BaseModel):
    """Where registered versions are served when the arbiter fronts a vLLM server (ArbiterConfig.vllm)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(min_length=1, pattern=r"^https?://", description="the vLLM server's OpenAI base URL, with /v1")
    adapter_dir: Path = Field(description="folder the arbiter writes each version's combined adapter into")
    server_adapter_dir: str | None = Field(
        None, description="the same folder as the vLLM server sees it (default: adapter_dir, a shared filesystem)")
    api_key_env: str | None = Field(None, pattern=ENV_NAME_PATTERN)
    lora_prefix: str = Field("agent-rl-", pattern=r"^[A-Za-z0-9_.-]{0,32}$", description="adapter names are PREFIX + version")


class AdapterLoadError(RuntimeError):
    """The vLLM server refused to load (or unload) an adapter."""


class VllmAdapterUpstream(OpenAIUpstream):
    """A version served by a vLLM server as the adapter `lora_name` (loaded on creation)."""

    def __init__(self, config: VllmAdapterConfig, version: str | None = None) -> None:
        super().__init__(OpenAIUpstreamConfig(base_url=config.base_url, model=config.lora_name,
                                              api_key_env=config.api_key_env, timeout_s=config.timeout_s,
                                              max_retries=config.max_retries))
        self.adapter = config
        self.version = version or f"vllm:{config.lora_name}"
        self.load()

    def _post(self, endpoint: str, body: dict[str, Any]) -> httpx.Response:
        problem = ""
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                time.sleep(self.config.retry_backoff_s * 2 ** (attempt - 1))
            try:
                with httpx.Client(base_url=self._base, headers=self._headers, timeout=self.config.timeout_s) as client:
                    response = client.post(endpoint, json=body)
            except httpx.TransportError as exc:
                problem = type(exc).__name__
                continue
            if response.status_code >= 500 and attempt < self.config.max_retries:
                problem = f"HTTP {response.status_code}"
                continue
            return response
        raise AdapterLoadError(f"vLLM {endpoint} for {self.adapter.lora_name!r} failed: {problem}")

    def load(self) -> None:
        """Load the adapter on the server; one already loaded under this name counts as loaded."""
        response = self._post("load_lora_adapter", {"lora_name": self.adapter.lora_name,
                                                    "lora_path": self.adapter.lora_path})
        if response.status_code == 200 or (response.status_code == 400 and "already" in _text(response)):
            return
        raise AdapterLoadError(f"vLLM refused to load adapter {self.adapter.lora_name!r}: HTTP "
                               f"{response.status_code}: {_text(response)[:300]}")

    def release(self) -> None:
        """Unload the adapter (the routing no longer sends traffic to it); one already gone is fine."""
        response = self._post("unload_lora_adapter", {"lora_name": self.adapter.lora_name})
        if response.status_code in (200, 404) or (response.status_code == 400 and "not" in _text(response)):
            return
        raise AdapterLoadError(f"vLLM refused to unload adapter {self.adapter.lora_name!r}: HTTP "
                               f"{response.status_code}: {_text(response)[:300]}")


def _text(response: httpx.Response) -> str:
    try:
        payload = response.json()
    except ValueError:
        return response.text
    if isinstance(payload, dict):
        error = payload.get("error")
        message = error.get("message") if isinstance(error, dict) else payload.get("message")
        if message:
            return str(message)
    return response.text


def load_vllm_adapter(raw: str) -> VllmAdapterUpstream:
    """The loader behind `vllm-lora:{...}` specs."""
    from pydantic import ValidationError

    from agent_rl.arbiter.policy_errors import PolicyLoadError

    try:
        config = VllmAdapterConfig.model_validate_json(raw)
    except ValidationError as exc:
        raise PolicyLoadError(f"vllm-lora spec: {spec_problems(exc)}") from None
    return VllmAdapterUpstream(config)


def registered_on_vllm(serving: VllmServing, version: str, adapters: list[str | Path]) -> VllmAdapterUpstream:
    """A registered version (its adapter stack) loaded on the vLLM server as `PREFIX + version`."""
    name = serving.lora_prefix + re.sub(r"[^A-Za-z0-9_.-]", "-", version)
    local = write_combined_adapter(adapters, serving.adapter_dir / name)
    seen = f"{serving.server_adapter_dir.rstrip('/')}/{name}" if serving.server_adapter_dir else str(local.resolve())
    config = VllmAdapterConfig(base_url=serving.base_url, lora_name=name, lora_path=seen,
                               api_key_env=serving.api_key_env)
    return VllmAdapterUpstream(config, version=version)
