"""API keys for the arbiter's callers: who may ask about which contexts, and who may replay tasks.

A key is a random token the caller sends as `Authorization: Bearer <token>`; the arbiter keeps
only its SHA-256, so a leaked key list grants nothing. Each key belongs to one tenant (recorded on
every episode it causes) and names the contexts it may use: an email address for the email assistant,
a customer database for another environment, say, by their ids; `"*"` means every context the arbiter
serves. Only keys with `replay` may have their requests judged against a task's reference answer:
those episodes become training labels.

Keys come from configuration, never from the request: `ArbiterConfig.api_keys`, else the JSON file
named by `ArbiterConfig.api_keys_file` or $AGENT_RL_API_KEYS_FILE, else the JSON text in
$AGENT_RL_API_KEYS. Both hold a list of key entries (`ApiKey` records).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError, field_validator

log = logging.getLogger(__name__)

KEYS_ENV = "AGENT_RL_API_KEYS"
KEYS_FILE_ENV = "AGENT_RL_API_KEYS_FILE"
ANY_CONTEXT = "*"
TOKEN_PREFIX = "ark_"

ContextId = Annotated[str, StringConstraints(min_length=1, max_length=320, strip_whitespace=True)]


def hash_token(token: str) -> str:
    """The form a key is kept in: the hex SHA-256 of its token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    """A fresh key token (256 random bits); shown once to whoever creates the key, stored only hashed."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class ApiKey(BaseModel):
    """One caller's key, as configured: its hash, tenant and scope."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$",
                    description="a name for the key, safe to log (never the token)")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the token")
    tenant: str = Field(min_length=1, max_length=200, description="recorded on every episode this key causes")
    contexts: tuple[ContextId, ...] = Field(min_length=1, description="context ids this key may use, or '*' for all")
    replay: bool = Field(False, description="may name tasks, whose episodes are judged against their reference answers")

    @field_validator("tenant")
    @classmethod
    def _tenant_text(cls, tenant: str) -> str:
        if not tenant.strip():
            raise ValueError("tenant must not be blank")
        return tenant.strip()

    @classmethod
    def create(cls, key_id: str, tenant: str, contexts: Iterable[str], replay: bool = False) -> tuple[str, ApiKey]:
        """A new token and the entry that admits it (the token is not kept anywhere)."""
        token = new_token()
        return token, cls(id=key_id, sha256=hash_token(token), tenant=tenant, contexts=tuple(contexts), replay=replay)

    def may_use(self, context_id: str) -> bool:
        return ANY_CONTEXT in self.contexts or context_id in self.contexts

    def context_filter(self) -> frozenset[str] | None:
        """The contexts this key is limited to; None when it may use every one."""
        return None if ANY_CONTEXT in self.contexts else frozenset(self.contexts)


class KeyConfigError(ValueError):
    """The configured key list cannot be used; the message names the source and the bad entry."""


_ENTRIES = TypeAdapter(list[ApiKey])


class KeyRing:
    """The configured keys, looked up by the hash of a presented token."""

    def __init__(self, keys: Sequence[ApiKey] = (), source: str = "configuration") -> None:
        by_hash: dict[str, ApiKey] = {}
        seen_ids: set[str] = set()
        for key in keys:
            if key.id in seen_ids:
                raise KeyConfigError(f"{source}: key id {key.id!r} is given twice")
            if key.sha256 in by_hash:
                raise KeyConfigError(f"{source}: keys {by_hash[key.sha256].id!r} and {key.id!r} have the same sha256")
            seen_ids.add(key.id)
            by_hash[key.sha256] = key
        self._by_hash = by_hash
        self.source = source

    def __len__(self) -> int:
        return len(self._by_hash)

    def keys(self) -> list[ApiKey]:
        return list(self._by_hash.values())

    def find(self, token: str) -> ApiKey | None:
        # A dict lookup by hash: timing tells an attacker about hashes, and a hash says nothing of a token.
        return self._by_hash.get(hash_token(token))

    @classmethod
    def parse(cls, raw: str | bytes, source: str) -> KeyRing:
        """Keys from JSON text: a list of entries, or {"keys": [...]}."""
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise KeyConfigError(f"{source}: not valid JSON ({exc})") from exc
        if isinstance(data, Mapping) and set(data) == {"keys"}:
            data = data["keys"]
        try:
            keys = _ENTRIES.validate_python(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'top level'}: {e['msg']}" for e in exc.errors(include_input=False)
            )
            raise KeyConfigError(f"{source}: expected a list of API key entries: {problems}") from exc
        return cls(keys, source)

    @classmethod
    def load(cls, keys: Sequence[ApiKey] | None = None, path: Path | None = None,
             environ: Mapping[str, str] | None = None) -> KeyRing:
        """Explicit keys, else the file at `path`, else $AGENT_RL_API_KEYS_FILE, else $AGENT_RL_API_KEYS."""
        environ = os.environ if environ is None else environ
        if keys is not None:
            return cls(keys, "ArbiterConfig.api_keys")
        if path is None and environ.get(KEYS_FILE_ENV):
            path = Path(environ[KEYS_FILE_ENV])
        if path is not None:
            return KeyFile(path)
        if environ.get(KEYS_ENV):
            return cls.parse(environ[KEYS_ENV], f"${KEYS_ENV}")
        return cls((), "no configuration")


def _read_key_file(path: Path) -> KeyRing:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise KeyConfigError(f"API key file {path}: cannot be read ({exc.strerror or exc})") from exc
    return KeyRing.parse(raw, f"API key file {path}")


def _file_state(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


class KeyFile(KeyRing):
    """The keys of a JSON key file, re-read when the file changes (checked at most every `check_s` seconds), so a
    key added or revoked (`agent-rl arbiter revoke-key`) takes effect in a running arbiter without a restart.

    A file that no longer reads or parses keeps the last good keys and logs the problem (never the file's
    contents): the writers replace the file atomically, so this only follows a hand edit gone wrong."""

    def __init__(self, path: Path, check_s: float = 1.0) -> None:
        self.path, self.check_s = Path(path), check_s
        self._state = _file_state(self.path)
        ring = _read_key_file(self.path)  # a broken file at start-up is an error, as before
        super().__init__(ring.keys(), ring.source)
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.check_s:
            return
        with self._lock:
            self._checked = now
            state = _file_state(self.path)
            if state == self._state:
                return
            try:
                ring = _read_key_file(self.path)
            except KeyConfigError as exc:
                log.error("API key file %s changed but cannot be used, keeping the %d keys read before: %s",
                          self.path, len(self._by_hash), exc.args[0] if exc.args else "unreadable")
                self._state = state
                return
            self._by_hash, self._state = ring._by_hash, state
            log.info("API key file %s re-read: %d keys", self.path, len(self._by_hash))

    def __len__(self) -> int:
        self._refresh()
        return super().__len__()

    def keys(self) -> list[ApiKey]:
        self._refresh()
        return super().keys()

    def find(self, token: str) -> ApiKey | None:
        self._refresh()
        return super().find(token)


def _write_keys(path: Path, keys: Sequence[ApiKey]) -> None:
    text = json.dumps([k.model_dump(mode="json") for k in keys], indent=2) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def revoke_key(path: Path, key_id: str) -> ApiKey:
    """Remove the key named `key_id` from the key file (replaced atomically); a running arbiter stops accepting it
    within a second. KeyConfigError when the file has no such key."""
    keys = _read_key_file(path).keys()
    kept = [k for k in keys if k.id != key_id]
    if len(kept) == len(keys):
        raise KeyConfigError(f"API key file {path}: no key with id {key_id!r}")
    _write_keys(path, kept)
    return next(k for k in keys if k.id == key_id)


def add_key(path: Path, key: ApiKey) -> None:
    """Add `key` to the JSON key file at `path` (created if missing), replaced atomically: a reader (a
    starting arbiter) sees the old list or the new one, never half a file."""
    keys = _read_key_file(path).keys() if path.exists() else []
    KeyRing([*keys, key], f"API key file {path}")  # refuses a repeated id or token before anything is written
    _write_keys(path, [*keys, key])
