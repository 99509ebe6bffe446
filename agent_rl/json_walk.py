"""Walks over a decoded JSON value that never recurse, and the nesting limit the arbiter holds requests to.

Checks that refuse a JSON document because of one value in it (a gateway request with a string no pool backend
can store, a routing spec with a credential in it, a tool schema nested too deep) must say where that value is,
and nothing else about it. They share these walks and their path spelling (`messages[0].content`,
`headers.api_key`) so that every such message names a place the same way. Every walk here keeps its own stack,
so a deeply nested document cannot exhaust the interpreter's recursion limit: curation's anonymizer and leak
check rebuild and read episodes with them for the same reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# The deepest nesting the arbiter accepts in a request body, counted in objects and arrays from the body's root
# (`{"a": [1]}` is 2 deep), and in each string that holds JSON (a tool result, tool-call arguments, a message
# content written as JSON), counted from that text's own root. Real requests nest a handful of levels (a tool
# schema's objects within objects seldom pass ten); a few hundred levels in a kilobyte break what reads the pool
# later (pydantic's serializer stops at 255, the JSON parser at the interpreter's recursion limit), so they are
# refused at the door with a 400 instead.
MAX_JSON_DEPTH = 32
# How many parts of a path a depth error shows: the request's own fields, not the keys of what nests below them
# (`messages[1].tool_calls[0].function.arguments` for a string of JSON, `tools[0].function.parameters` for a
# structure nested too deep).
_TEXT_PARTS = 6
_STRUCTURE_PARTS = 4
_END = object()
# A JSON string (to its closing quote, or the end of an unterminated one) or a bracket: each character is read
# once, so measuring a text is linear in its length whatever it holds.
_OPENS_JSON = re.compile(r"\s*+[\[{]")
_JSON_TEXT_PART = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)|[\[\]{}]', re.DOTALL)


def walk(value: Any) -> Iterator[tuple[str, str, str | None, Any]]:
    """Every part of `value` in document order (a part before what it holds, siblings in order), as
    `(path, parent_path, key, node)`: `path` is "" for `value` itself, `key` the dict key that names `node`
    (None for `value` itself and for list items)."""
    stack: list[tuple[str, str, str | None, Any]] = [("", "", None, value)]
    while stack:
        path, parent, key, node = stack.pop()
        yield path, parent, key, node
        if isinstance(node, dict):
            children = [(f"{path}.{name}" if path else str(name), path, name, item) for name, item in node.items()]
        elif isinstance(node, list):
            children = [(f"{path}[{index}]", path, None, item) for index, item in enumerate(node)]
        else:
            continue
        stack.extend(reversed(children))


def strings(value: Any) -> Iterator[str]:
    """Every string in `value`, mapping keys included (each just before its value), in document order."""
    stack: list[Iterator[Any]] = [iter((value,))]
    while stack:
        node = next(stack[-1], _END)
        if node is _END:
            stack.pop()
        elif isinstance(node, str):
            yield node
        elif isinstance(node, Mapping):
            stack.append(iter([part for pair in node.items() for part in pair]))
        elif isinstance(node, (list, tuple)):
            stack.append(iter(node))


def holds_json(text: str) -> bool:
    """Whether a string reads as JSON text to the walkers that parse such strings (it opens an object or array,
    after any whitespace: what `text.lstrip()[:1]` tells, without copying the text)."""
    return _OPENS_JSON.match(text) is not None


def text_too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON text opens more than `limit` objects and arrays inside one another; brackets inside strings
    do not count. Text that is not valid JSON is measured the same way: a parser tries it before it fails."""
    if text.count("{") + text.count("[") <= limit:  # too few brackets to nest that deep (counted in C)
        return False
    depth = 0
    for match in _JSON_TEXT_PART.finditer(text):
        char = text[match.start()]
        if char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth = max(depth - 1, 0)
    return False


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> str | None:
    """The path of the first part of `value` nested more than `limit` levels deep, or None. A string that holds
    JSON is measured from its own root, as the walkers that parse it do. The path shows only its first parts, so
    an error names the field without repeating the keys of what nests inside it."""
    if _within_limit(value, limit):  # the common case, on every gateway call: no paths kept
        return None
    return _first_too_deep(value, limit)


def _within_limit(value: Any, limit: int) -> bool:
    """Whether nothing in `value` nests more than `limit` levels deep (too_deep's answer, without its path)."""
    stack = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        node, level = pop()
        kind = type(node)
        if kind is str:
            if holds_json(node) and text_too_deep(node, limit):
                return False
            continue
        if kind is dict or isinstance(node, Mapping):
            children: Any = node.values()
        elif kind is list or isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        if level + 1 > limit:
            return False
        for item in children:
            if type(item) in _LEAVES:
                continue
            push((item, level + 1))
    return True


_LEAVES = (int, float, bool, type(None))


def _first_too_deep(value: Any, limit: int) -> str | None:
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 0, ())]
    while stack:
        node, level, trail = stack.pop()
        if isinstance(node, str):
            if holds_json(node) and text_too_deep(node, limit):
                return _path(trail) or "body"
            continue
        if isinstance(node, Mapping):
            children: Any = node.items()
        elif isinstance(node, (list, tuple)):
            children = enumerate(node)
        else:
            continue
        if level + 1 > limit:
            return _path(trail[:_STRUCTURE_PARTS]) or "body"
        stack.extend((item, level + 1, (*trail, name) if len(trail) < _TEXT_PARTS else trail)
                     for name, item in reversed(list(children)))
    return None


def rebuild(value: Any, visit: Callable[[Any, Any], tuple[bool, Any]],
            rename: Callable[[Any], Any] = lambda key: key, key: Any = None) -> Any:
    """`value` rebuilt bottom-up without recursion. `visit(node, key)` gives `(True, replacement)` for a node it
    handles whole, `(False, None)` for a container to descend into (a mapping comes back a dict, a list or tuple
    keeps its type); `key` is the mapping key that names the node (None at the top and for list items), and
    `rename` turns each key into the rebuilt one, before its value is visited."""
    done, out = visit(value, key)
    if done:
        return out
    stack = [_Rebuilt(value)]
    while True:
        frame = stack[-1]
        item = next(frame.items, _END)
        if item is _END:
            stack.pop()
            if not stack:
                return frame.result()
            stack[-1].add(frame.result())
            continue
        child_key, child = frame.enter(item, rename)
        done, out = visit(child, child_key)
        if done:
            frame.add(out)
        else:
            stack.append(_Rebuilt(child))


def rewrite_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """`value` with `fn` applied to every string value in it, keys kept (a mapping comes back a dict, a list or
    tuple keeps its type): how a pseudonymizer's text function reaches every string of a row or a record."""
    def visit(node: Any, key: Any) -> tuple[bool, Any]:
        if isinstance(node, str):
            return True, fn(node)
        return not isinstance(node, (Mapping, list, tuple)), node

    return rebuild(value, visit)


class _Rebuilt:
    """One container being rebuilt by `rebuild`: its parts so far and the (renamed) key of the part in hand."""

    __slots__ = ("container", "items", "parts", "key")

    def __init__(self, container: Any) -> None:
        self.container = container
        self.items = iter(container.items() if isinstance(container, Mapping) else container)
        self.parts: list[Any] = []
        self.key: Any = None

    def enter(self, item: Any, rename: Callable[[Any], Any]) -> tuple[Any, Any]:
        """(key, node) of the next part; a mapping's key is renamed now, before its value is visited."""
        if not isinstance(self.container, Mapping):
            return None, item
        self.key = rename(item[0])
        return item

    def add(self, out: Any) -> None:
        self.parts.append((self.key, out) if isinstance(self.container, Mapping) else out)

    def result(self) -> Any:
        return dict(self.parts) if isinstance(self.container, Mapping) else type(self.container)(self.parts)


def _path(trail: tuple[Any, ...]) -> str:
    out = ""
    for part in trail:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
