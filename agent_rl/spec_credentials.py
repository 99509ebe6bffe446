"""Credentials never travel in a routing spec: the spec is stored in `routing` and `routing_history` and shown to
whoever may read the routing, at any weight (0% staged, or kept for rollback, included). A spec names the
environment variable that holds a key (`api_key_env`); a spec that carries one itself is refused where it is
written, naming the version and the field, never the value."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

from agent_rl.json_walk import walk

# JSON keys that hold a secret themselves (`api_key_env` names a variable, so it is allowed).
SECRET_KEYS = re.compile(r"^(api_?key|apikey|key|token|access_token|auth_token|bearer|password|passwd|secret|"
                         r"client_secret|authorization|credentials?)$", re.IGNORECASE)
# A bare token pasted into a spec: provider key shapes (sk-..., Bearer ...).
TOKEN_SHAPES = re.compile(r"\b(sk-[A-Za-z0-9_-]{8,}|Bearer\s+[A-Za-z0-9._~+/-]{8,})")


def credential_problem(spec: str) -> str | None:
    """Why `spec` may not be stored (it carries a credential), or None. Names the field, never its value."""
    if TOKEN_SHAPES.search(spec):
        return "contains what looks like an API key or bearer token"
    body = spec.split(":", 1)[1] if ":" in spec else spec
    try:
        data = json.loads(body) if body.lstrip().startswith("{") else None
    except ValueError:
        data = None
    if data is not None:
        found = _secret_field(data)
        if found:
            return (f"field {found!r} holds a credential: set it in an environment variable on the arbiter and name "
                    "that variable in api_key_env")
    for url in re.findall(r"[a-z][a-z0-9+.-]*://[^\s\"']+", spec, flags=re.IGNORECASE):
        try:
            parts = urlsplit(url)
        except ValueError:
            continue
        if parts.password or parts.username:
            return "a URL in it carries a user name or password"
    return None


def _secret_field(value: Any) -> str | None:
    """The path of the first field named like a credential that holds a value, or None."""
    for path, _, key, item in walk(value):
        if key is not None and SECRET_KEYS.match(str(key)) and item not in (None, ""):
            return path
    return None
