"""Finding an environment by what a user types: a built-in name, an import path, or an installed plug-in.

`load_environment("email")` gives a built-in; `load_environment("my_package.module:MyEnvironment")` imports a
class (or a factory function) from the user's code; a pip-installed package registers its own under the
entry point group `agent_rl.environments` (`[project.entry-points."agent_rl.environments"] support =
"my_package.env:SupportEnvironment"`), after which its name works like a built-in. Every failure is an
EnvironmentError naming what was asked for and what went wrong.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import re
import warnings
from os import PathLike
from typing import Any

from agent_rl.environments.core import Capabilities, Environment, EnvironmentError, check_environment

ENTRY_POINT_GROUP = "agent_rl.environments"
# What a setting that names no environment trains, and what GRPO plays on the store it is given with no plug-in.
DEFAULT = "email"
BUILTINS: dict[str, str] = {
    "email": "agent_rl.environments.email.environment:EmailEnvironment",
    "support": "agent_rl.environments.support:SupportEnvironment",
    "openai_job": "agent_rl.environments.openai_jobs:OpenAIJobEnvironment",
    "gateway": "agent_rl.environments.gateway:GatewayEnvironment",
}
# Command groups a built-in environment adds to the `agent-rl` CLI: name -> (typer app import path, help).
BUILTIN_COMMANDS: dict[str, tuple[str, str]] = {
    "inbox": ("agent_rl.environments.email.inbox.cli:app", "Build, ingest and search email inboxes."),
}
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def available() -> dict[str, str]:
    """Every environment name that loads without an import path: built-ins, then installed plug-ins."""
    names = dict(BUILTINS)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(entry.name, entry.value)
    return names


def resolve(spec: str) -> Any:
    """The class or factory `spec` names (not yet instantiated)."""
    if not isinstance(spec, str) or not spec.strip():
        raise EnvironmentError(str(spec), "an environment is named by a non-empty string")
    spec = spec.strip()
    target = spec if ":" in spec else available().get(spec)
    if target is None:
        raise EnvironmentError(spec, f"unknown; known: {', '.join(sorted(available()))}, or give an import path "
                               "'package.module:ClassName'")
    if not _IMPORT_PATH.match(target):
        raise EnvironmentError(spec, f"{target!r} is not an import path 'package.module:ClassName'")
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvironmentError(spec, f"module {module_name!r} cannot be imported: {exc}") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise EnvironmentError(spec, f"module {module_name!r} has no {attribute!r}") from None


@functools.lru_cache(maxsize=256)
def capabilities_of(spec: str | None) -> Capabilities:
    """What the episodes of the environment `spec` names let the loop do, read from its class without building it
    (curation asks it of every episode row; `resolve` strips the name); the contract's defaults for a factory
    function, and for a name (or None) nothing here resolves (an episode of a plug-in this installation lacks is judged like any plug-in's)."""
    try:
        factory = resolve(spec or "")
    except EnvironmentError:
        return Capabilities()
    declared = getattr(factory, "capabilities", None) if isinstance(factory, type) else None
    return declared if isinstance(declared, Capabilities) else Capabilities()


def setting_names(value: str) -> list[str]:
    """The environments a setting names, in order: `AGENT_RL_ENV=support,examples.timetable:TimetableEnvironment`
    trains one policy on both (blank parts ignored)."""
    return [part.strip() for part in value.split(",") if part.strip()]


def load_environment(spec: str, **options: Any) -> Environment:
    """An instance of the environment `spec` names, built with `options`, checked against the contract."""
    factory = resolve(spec)
    if not callable(factory):
        raise EnvironmentError(spec, "is neither a class nor a factory function")
    try:
        environment = factory(**options)
    except TypeError as exc:
        raise EnvironmentError(spec, f"cannot be built with options {sorted(options)}: {exc}") from None
    return check_environment(environment)


def accepted_options(spec: str, options: dict[str, Any]) -> dict[str, Any]:
    """Those of `options` that the factory `spec` names takes by name (all of them when it takes **kwargs): a
    setting that names one environment's world (the email assistant's inbox store) passes over the others."""
    factory = resolve(spec)
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read: let load_environment say what it refuses
        return dict(options)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(options)
    names = {p.name for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                      inspect.Parameter.KEYWORD_ONLY)}
    return {key: value for key, value in options.items() if key in names}


def world_options(spec: str, store_url: str | None = None, tasks_path: str | PathLike[str] | None = None
                  ) -> dict[str, str]:  # fmt: skip
    """The options naming a world's store and tasks file (a command line's `--store-url`, `--tasks`) that the
    environment `spec` takes: `store_url` and `tasks_path` by those names, or a tasks file as `scenarios_path`, the
    name plug-ins written after the email assistant's first options took (warned: it goes in the next release)."""
    named = {key: str(value) for key, value in (("store_url", store_url), ("tasks_path", tasks_path)) if value}
    taken = accepted_options(spec, named)
    if "tasks_path" in named and "tasks_path" not in taken and accepted_options(spec, {"scenarios_path": ""}):
        warnings.warn(f"environment {spec!r} takes its tasks file as scenarios_path: name the option tasks_path "
                      "(scenarios_path goes in the next release)", DeprecationWarning, stacklevel=2)
        taken["scenarios_path"] = named["tasks_path"]
    return taken


def environment_commands() -> list[tuple[str, Any, str]]:
    """(name, typer app, help) of each built-in environment's CLI commands, for `agent-rl <name> ...`."""
    commands = []
    for name, (target, help_text) in BUILTIN_COMMANDS.items():
        module_name, _, attribute = target.partition(":")
        commands.append((name, getattr(importlib.import_module(module_name), attribute), help_text))
    return commands
