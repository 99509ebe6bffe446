"""One walk over a decoded JSON value that names where each part of it sits.

Checks that refuse a JSON document because of one value in it (a gateway request with a string no pool backend
can store, a routing spec with a credential in it) must say where that value is, and nothing else about it.
They share this walk and its path spelling (`messages[0].content`, `headers.api_key`) so that every such
message names a place the same way; the walk keeps its own stack, so a deeply nested document cannot exhaust
the interpreter's recursion limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


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
