"""OpenAI's grader templates: `{{ item.field }}`, `{{ item.nested.field }}`, `{{ sample.output_json.field }}`.

Only two namespaces exist, as in OpenAI's guide: `item` (the dataset row) and `sample` (what the policy produced,
see sample.py). A path walks objects by key and lists by index (`a.b.0` or `a.b[0]`). A string renders as it
is; anything else renders as JSON (so `{{ sample.output_tools }}` is the tool calls' JSON).

An item field that a template names must exist: `check_template` finds a missing one against a representative
item when the job is set up, and rendering raises on one, because a grader that quietly reads "" for a missing
reference answer trains the policy towards nothing. A missing sample field is the policy's doing (it answered
without the JSON field asked for): it renders as "" and is reported in the grade's reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_rl.graders.config import GraderConfigError
from agent_rl.graders.sample import SAMPLE_FIELDS

NAMESPACES = ("item", "sample")
_TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_HEAD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)")
_SEGMENT = re.compile(r"\.([^.\[\]\s]+)|\[(\d+)\]|\[(['\"])(.*?)\3\]")


class TemplateError(GraderConfigError):
    """A template that cannot be read, or names an item field the item does not have."""


@dataclass(frozen=True)
class Reference:
    """One `{{ namespace.path }}` in a template."""

    namespace: str
    path: tuple[str | int, ...]
    written: str  # as it stands between the braces, for messages

    def dotted(self, upto: int | None = None) -> str:
        return ".".join([self.namespace, *(str(p) for p in self.path[:upto])])


def parse_reference(expression: str) -> Reference:
    """The namespace and path of one template expression, or a TemplateError saying what is wrong with it."""
    written = expression.strip()
    head = _HEAD.match(expression)
    if not head:
        raise TemplateError(f"template {{{{ {written} }}}}: expected {{{{ item.<field> }}}} or {{{{ sample.<field> }}}}")
    namespace = head.group(1)
    if namespace not in NAMESPACES:
        raise TemplateError(
            f"template {{{{ {written} }}}}: unknown namespace {namespace!r}; the namespaces are {', '.join(NAMESPACES)}"
        )
    path: list[str | int] = []
    position, end = head.end(), len(expression.rstrip())
    while position < end:
        segment = _SEGMENT.match(expression, position)
        if not segment:
            raise TemplateError(f"template {{{{ {written} }}}}: cannot read the path at {expression[position:end]!r}")
        if segment.group(1) is not None:
            path.append(segment.group(1))
        elif segment.group(2) is not None:
            path.append(int(segment.group(2)))
        else:
            path.append(segment.group(4))
        position = segment.end()
    if not path:
        raise TemplateError(f"template {{{{ {written} }}}}: name a variable, e.g. {{{{ {namespace}.<field> }}}}")
    return Reference(namespace, tuple(path), written)


def references(template: str) -> Iterator[Reference]:
    """Every reference in a template, in order."""
    for match in _TEMPLATE.finditer(template):
        yield parse_reference(match.group(1))


class _Missing(LookupError):
    def __init__(self, depth: int, why: str) -> None:
        super().__init__(why)
        self.depth = depth
        self.why = why


def _walk(root: Any, reference: Reference) -> Any:
    value = root
    for depth, segment in enumerate(reference.path):
        if isinstance(value, Mapping):
            key = str(segment)
            if key not in value:
                fields = ", ".join(sorted(map(str, value))[:20]) or "none"
                raise _Missing(depth, f"has no field {key!r} (fields there: {fields})")
            value = value[key]
        elif isinstance(value, Sequence) and not isinstance(value, str | bytes):
            index = segment if isinstance(segment, int) else int(segment) if str(segment).isdigit() else None
            if index is None or index >= len(value):
                raise _Missing(depth, f"is a list of {len(value)}, it has no element {segment!r}")
            value = value[index]
        else:
            shown = "null" if value is None else type(value).__name__
            raise _Missing(depth, f"is {shown}, it has no field {segment!r}")
    return value


def _item_error(reference: Reference, missing: _Missing) -> TemplateError:
    where = reference.dotted(missing.depth) if missing.depth else "the item"
    return TemplateError(
        f"template {{{{ {reference.written} }}}}: the item has no field {reference.dotted()} ({where} {missing.why})"
    )


def lookup(reference: Reference, sample: Mapping[str, Any], item: Mapping[str, Any]) -> tuple[Any, str | None]:
    """The referenced value, and why it is missing when it is (sample side only; a missing item field raises)."""
    if reference.namespace == "item":
        try:
            return _walk(item, reference), None
        except _Missing as missing:
            raise _item_error(reference, missing) from None
    try:
        return _walk(sample, reference), None
    except _Missing:
        return None, f"{reference.dotted()} is missing from the sample"


def as_text(value: Any) -> str:
    """How a value stands in rendered text: strings as they are, everything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render(template: str, sample: Mapping[str, Any], item: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The template with every reference replaced, and the sample references that were missing (rendered "")."""
    missing: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        value, why = lookup(parse_reference(match.group(1)), sample, item)
        if why:
            missing.append(why)
            return ""
        return as_text(value)

    return _TEMPLATE.sub(substitute, template), missing


def check_template(template: str, example_item: Mapping[str, Any], where: str) -> None:
    """Raise a TemplateError when the template is unreadable, names an unknown sample field or a missing item field."""
    for reference in references(template):
        if reference.namespace == "item":
            try:
                _walk(example_item, reference)
            except _Missing as missing:
                raise TemplateError(f"{where}: {_item_error(reference, missing)}") from None
        elif str(reference.path[0]) not in SAMPLE_FIELDS:
            raise TemplateError(
                f"{where}: template {{{{ {reference.written} }}}}: the sample has no field {str(reference.path[0])!r}; "
                f"sample fields: {', '.join(SAMPLE_FIELDS)}"
            )
