"""How the anonymizer walks records: episodes (messages, tool calls, JSON inside tool results) and the flat records
of an environment's world, each described by a `RecordLayout` (which fields are free text, lists of texts, ids), with
ids pseudonymized by shape and dates and call ids kept. Detection runs over every text of a batch before any is
rendered (`_two_phase`), so a name learnt in one text is replaced in all of them."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_rl.privacy.leak_check import PLAIN_KEY
from agent_rl.json_walk import holds_json, rebuild


@dataclass(frozen=True)
class RecordLayout:
    """Which fields of a world's record (a pydantic model or a mapping) hold personal data, and how: `texts` are
    free text anonymized like any other, `text_lists` lists or tuples of such texts (recipients), `ids` ids, folders
    or file paths (or nested lists of them) whose names and addresses are pseudonymized and whose shape is kept. Any
    other field is copied as it is. The environment that owns the record declares its layout; the loop knows none."""

    texts: tuple[str, ...] = ()
    text_lists: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()

    def texts_of(self, record: Any) -> list[str]:
        """The record's free texts as this layout names them (its texts, then its lists' items): what a leak
        auditor learns personal values from, so it reads exactly the fields the anonymizer rewrites."""
        get = record.get if isinstance(record, Mapping) else lambda name: getattr(record, name, None)
        texts = [value for value in map(get, self.texts) if isinstance(value, str)]
        for value in map(get, self.text_lists):
            if isinstance(value, (list, tuple)):
                texts += [item for item in value if isinstance(item, str)]
        return texts


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
        """Every string in `value` through `fn`, keys too; without recursion, so a structure nested deeper than the
        interpreter's stack (a pool row older than the gateway's depth limit) is rewritten all the same."""
        return rebuild(value, lambda node, name: self._visit(node, fn, name), lambda name: self._key(name, fn), key)

    def _visit(self, value: Any, fn: Callable[[str], str], key: Any) -> tuple[bool, Any]:
        """`rebuild`'s step: (True, the part rewritten) for a kept value, an id or a string; (False, None) for a
        container to descend into."""
        key = key if isinstance(key, str) else None
        if key in self.config.keep_keys:
            return True, value
        if key in self.config.id_keys:
            return True, self._ids(value)
        if isinstance(value, str):
            return True, fn(value)
        if isinstance(value, (Mapping, list, tuple)):  # keys are text too: {"marguerite@x.com": {...}} (`_key`)
            return False, None
        return True, value

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
        if not holds_json(text):
            return fn(text)
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):  # not JSON, or nested past what the parser takes: anonymized as text
            return fn(text)
        # Keep the layout the text came in: tools emit compact JSON, and a row that SFT learns from must
        # render exactly what serving shows (a body's own ", " says nothing about the separators).
        try:
            compact = json.dumps(parsed, ensure_ascii=False, separators=(",", ":")) == text
            separators = (",", ":") if compact else None
            return json.dumps(self._walk(parsed, fn), ensure_ascii=False, separators=separators)
        except RecursionError:  # parsed at the parser's limit, too deep to write back: anonymized as text
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
        """An id (or a list of them, nested as deep as it likes) pseudonymized; anything else kept."""
        def visit(node: Any, _: Any) -> tuple[bool, Any]:
            if isinstance(node, str):
                return True, self.pseudonymize_id(node)
            return not isinstance(node, (list, tuple)), node

        return rebuild(value, visit)

    def _episode(self, episode: Mapping[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
        out = dict(episode)
        for name in ("citations", "sources", "task_id", "scenario_id"):  # `sources`, `scenario_id`: earlier exports
            if name in out:
                out[name] = self._ids(out[name])
        for name in ("question", "final_answer", "context", "inbox_id", "feedback"):
            if isinstance(out.get(name), str):
                out[name] = fn(out[name])
        messages = out.get("messages")
        if isinstance(messages, str):  # exported rows may carry messages as JSON text
            try:
                messages = json.loads(messages)
            except (ValueError, RecursionError):
                out["messages"] = fn(messages)
                messages = None
        if isinstance(messages, list):
            out["messages"] = [self._message(m, fn) for m in messages]
        return out

    def _record(self, item: Any, fn: Callable[[str], str], layout: RecordLayout) -> Any:
        """A copy of one world record with its fields rewritten as `layout` says, of the record's own type."""
        data = item.model_dump() if hasattr(item, "model_dump") else dict(item)
        for name in layout.ids:
            if name in data:
                data[name] = self._ids(data[name])
        for name in layout.texts:
            if isinstance(data.get(name), str):
                data[name] = fn(data[name])
        for name in layout.text_lists:
            if isinstance(data.get(name), (list, tuple)):
                data[name] = type(data[name])(fn(v) if isinstance(v, str) else v for v in data[name])
        return type(item).model_validate(data) if hasattr(item, "model_validate") else data

    def anonymize_records(self, groups: Sequence[tuple[Sequence[Any], RecordLayout]]) -> list[list[Any]]:
        """Several kinds of records of one world in one pass (a mailbox and its questions), so every name they
        share maps the same way; returns each group's records, in order."""
        tagged = [(g, item) for g, (items, _) in enumerate(groups) for item in items]
        out = self._two_phase(tagged, lambda t, fn: (t[0], self._record(t[1], fn, groups[t[0]][1])))
        return [[record for g, record in out if g == index] for index in range(len(groups))]

    # -- detection ----------------------------------------------------------------------------
