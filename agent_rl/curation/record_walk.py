"""How the anonymizer walks records: episodes (messages, tool calls, JSON inside tool results), emails and
scenarios, with ids pseudonymized by shape and dates and call ids kept. Detection runs over every text of a batch
before any is rendered (`_two_phase`), so a name learnt in one text is replaced in all of them."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from agent_rl.curation.leak_check import PLAIN_KEY


class RecordWalker:
    """The Anonymizer's record walkers (a mixin: it needs the Anonymizer's `_detect`, `_render`, `config` and
    `pseudonymize_id`)."""

    def _two_phase(self, items: list[Any], transform: Callable[[Any, Callable[[str], str]], Any]) -> list[Any]:
        texts: list[str] = []

        def collect(text: str) -> str:
            texts.append(text)
            return text

        for item in items:
            transform(item, collect)
        self._detect(texts)
        return [transform(item, self._render) for item in items]

    def anonymize_json(self, value: Any) -> Any:
        """Every string in a JSON-like value (task metadata, ...) anonymized; keep_keys and id_keys as in episodes."""
        return self._walk(value, self.anonymize_text)

    def _walk(self, value: Any, fn: Callable[[str], str], key: str | None = None) -> Any:
        if key in self.config.keep_keys:
            return value
        if key in self.config.id_keys:
            return self._ids(value)
        if isinstance(value, str):
            return fn(value)
        if isinstance(value, Mapping):  # keys are text too: {"marguerite@x.com": {...}} must not pass unseen
            return {self._key(k, fn): self._walk(v, fn, k if isinstance(k, str) else None) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._walk(v, fn) for v in value)
        return value

    @staticmethod
    def _key(key: Any, fn: Callable[[str], str]) -> Any:
        """A JSON object's key, anonymized like any text unless it is a plain identifier ("order_id", "phone"),
        which names a field and holds nothing personal; an address, a name or a number as a key is rewritten."""
        if not isinstance(key, str) or PLAIN_KEY.fullmatch(key):
            return key
        return fn(key)

    def _json_text(self, text: Any, fn: Callable[[str], str]) -> Any:
        """Text that holds JSON (tool results, string arguments) is anonymized leaf by leaf."""
        if not isinstance(text, str):
            return self._walk(text, fn)
        stripped = text.lstrip()
        if stripped[:1] in ("{", "["):
            try:
                parsed = json.loads(text)
            except ValueError:
                return fn(text)
            # Keep the layout the text came in: tools emit compact JSON, and a row that SFT learns from must
            # render exactly what serving shows (a body's own ", " says nothing about the separators).
            compact = json.dumps(parsed, ensure_ascii=False, separators=(",", ":")) == text
            separators = (",", ":") if compact else None
            return json.dumps(self._walk(parsed, fn), ensure_ascii=False, separators=separators)
        return fn(text)

    def _message(self, message: Any, fn: Callable[[str], str]) -> Any:
        if not isinstance(message, Mapping):
            return self._walk(message, fn)
        out = dict(message)
        if isinstance(out.get("content"), str):
            out["content"] = self._json_text(out["content"], fn) if out.get("role") == "tool" else fn(out["content"])
        if isinstance(out.get("tool_calls"), list):
            calls = []
            for call in out["tool_calls"]:
                if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
                    function = dict(call["function"])
                    function["arguments"] = self._json_text(function.get("arguments"), fn)
                    call = {**call, "function": function}
                calls.append(call)
            out["tool_calls"] = calls
        return out

    def _ids(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.pseudonymize_id(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self._ids(v) for v in value)
        return value

    def _episode(self, episode: Mapping[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
        out = dict(episode)
        for name in ("citations", "sources", "scenario_id"):  # `sources`: exports of earlier releases
            if name in out:
                out[name] = self._ids(out[name])
        for name in ("question", "final_answer", "context", "inbox_id", "feedback"):
            if isinstance(out.get(name), str):
                out[name] = fn(out[name])
        messages = out.get("messages")
        if isinstance(messages, str):  # exported rows may carry messages as JSON text
            try:
                messages = json.loads(messages)
            except ValueError:
                out["messages"] = fn(messages)
                messages = None
        if isinstance(messages, list):
            out["messages"] = [self._message(m, fn) for m in messages]
        return out

    def _email(self, item: Any, fn: Callable[[str], str]) -> Any:
        data = item.model_dump() if hasattr(item, "model_dump") else dict(item)
        for name in ("inbox", "subject", "sender", "body"):
            if isinstance(data.get(name), str):
                data[name] = fn(data[name])
        for name in ("to", "cc", "bcc"):
            if isinstance(data.get(name), (list, tuple)):
                data[name] = type(data[name])(fn(v) if isinstance(v, str) else v for v in data[name])
        for name in ("message_id", "folder", "file"):  # `<...phillip.allen@enron.com>`, `allen-p/...`
            if isinstance(data.get(name), str):
                data[name] = self.pseudonymize_id(data[name])
        return type(item).model_validate(data) if hasattr(item, "model_validate") else data

    def _scenario(self, item: Any, fn: Callable[[str], str]) -> Any:
        data = item.model_dump() if hasattr(item, "model_dump") else dict(item)
        for name in ("id", "source_ids"):
            if name in data:
                data[name] = self._ids(data[name])
        for name in ("question", "answer", "inbox_id", "inbox"):
            if isinstance(data.get(name), str):
                data[name] = fn(data[name])
        return type(item).model_validate(data) if hasattr(item, "model_validate") else data

    # -- detection ----------------------------------------------------------------------------
