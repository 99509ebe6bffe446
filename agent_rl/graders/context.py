"""What graders need from the operator: a chat endpoint, an embedding function, the python sandbox's limits.

A grader's JSON comes from whoever brought the job; these come from whoever runs the trainer. So untrusted
Python stays off unless `python.enabled` is set here, and `cosine` or `score_model` refuse at validation
rather than guess a model to call when nothing is configured.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, PrivateAttr

from agent_rl.chat_client import ChatClient, ChatEndpoint

# texts -> one vector per text (the operator's embedding model, for text_similarity's cosine metric)
EmbedFunction = Callable[[list[str]], Sequence[Sequence[float]]]


class PythonSandboxConfig(BaseModel):
    """Limits of the separate process a `python` grader runs in; off unless the operator enables it."""

    model_config = ConfigDict(frozen=True)

    enabled: bool = Field(default=False, description="run untrusted python graders at all")
    timeout_s: PositiveFloat = Field(default=30.0, description="wall-clock limit per grade, interpreter start included")
    memory_mb: PositiveInt = Field(default=1024, description="address-space limit (RLIMIT_AS) of the grader process")
    max_file_mb: PositiveInt = Field(default=64, description="largest file the grader may write (RLIMIT_FSIZE)")
    max_source_kb: PositiveInt = Field(default=256, description="largest grader source accepted")
    network_namespace: bool = Field(
        default=True,
        description="also move the grader into an empty network namespace where the kernel allows it (Linux)",
    )
    python_executable: str = Field(
        default=sys.executable, description="interpreter for graders (its installed packages are importable)"
    )


class GraderContext(BaseModel):
    """The operator's side of grading: limits, endpoints and injected functions. One per trainer."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    python: PythonSandboxConfig = Field(default_factory=PythonSandboxConfig)
    chat_endpoint: ChatEndpoint | None = Field(
        default=None,
        description="OpenAI-compatible endpoint for score_model graders; each grader's model replaces its model",
    )
    chat_transport: httpx.BaseTransport | None = Field(default=None, description="for tests: an in-process transport")
    embed: EmbedFunction | None = Field(default=None, description="embedding function for the cosine metric")
    _clients: dict[ChatEndpoint, ChatClient] = PrivateAttr(default_factory=dict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def chat_client(self, endpoint: ChatEndpoint) -> ChatClient:
        """One kept-open client per distinct endpoint (model and sampling included), shared by threads."""
        with self._lock:
            client = self._clients.get(endpoint)
            if client is None:
                client = self._clients[endpoint] = ChatClient(endpoint, transport=self.chat_transport)
            return client

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
