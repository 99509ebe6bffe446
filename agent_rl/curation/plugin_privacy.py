"""The privacy pass for a plug-in environment: the same Anonymizer and independent auditor (privacy.py's audit
helpers) as the email assistant's (environments/email/privacy.py), fed by what the environment declares
(its world's `World.privacy()`), applied to the week's episodes, the environment's tasks and its world
(`World.anonymized`).

One Anonymizer for all three keeps pseudonyms consistent: a customer's surrogate name and email in an
anonymized episode are the ones in the anonymized database, so a task replays to the same outcome. The auditor
learns what is personal from the raw episodes, tasks and world on its own, plus the people the environment
declares and this pass's planted canaries; any original value in any record written fails the gate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_rl.privacy.anonymize import Anonymizer, AnonymizerConfig, Directory, episode_texts
from agent_rl.privacy.leak_check import Finding, input_words, plant_canaries
from agent_rl.privacy.audit import EPISODES_FILE, canary_seed, count_kinds, leak_auditor, scan_records
from agent_rl.surrogates import pseudonym_key
from agent_rl.environments.core import Environment, Task

TASKS_FILE = "anonymized_environment/tasks.jsonl"
WORLD_FILE = "anonymized_environment/environment.pkl"
MAX_DEPTH = 12


@dataclass
class PluginPrivacyResult:
    episodes: list[dict[str, Any]]
    tasks: list[Task]
    environment: Environment | None
    report: dict[str, Any]
    leaks: list[Finding] = field(default_factory=list)


def world_values(value: Any, depth: int = 0) -> Any:
    """An environment's world as plain JSON-like data (dataclasses, mappings, sequences, object attributes), for
    the auditor to learn from and to scan; callables and private attributes are left out."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: world_values(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): world_values(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [world_values(v, depth + 1) for v in value]
    if hasattr(value, "__dict__") and not callable(value):
        return {k: world_values(v, depth + 1) for k, v in vars(value).items() if not k.startswith("_")}
    return None


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def has_personal_world(environment: Environment) -> bool:
    """Whether the environment declares personal data in its tasks and world (`World.holds_personal_data`)."""
    return environment.world().holds_personal_data()


def directory_of(environment: Environment, contexts: Iterable[str]) -> tuple[Directory, list[tuple[str, str]]]:
    """The people the environment declares in these contexts, as the Anonymizer's directory."""
    directory, people = Directory(), []
    known = environment.world().privacy().known_people
    if known is not None:
        for context in sorted(set(contexts)):
            for name, address in known(context):
                people.append((str(name), str(address)))
                directory.add_address(str(name), str(address))
                directory.add_name(str(name))
    return directory, people


def anonymize_plugin_partition(
    environment: Environment | None,
    episodes: list[dict[str, Any]],
    tasks: list[Task],
    canaries: list[str] | None = None,
    config: AnonymizerConfig | None = None,
    plant: bool = True,
    name: str | None = None,
) -> PluginPrivacyResult:
    """Anonymized episodes, tasks and world of a plug-in, with the independent leak scan over all of them.

    `environment` None: episodes of an environment with no world (the gateway's live traffic), with no tasks;
    `name` is then the environment its episodes carry, for the report."""
    config = config or AnonymizerConfig()
    public = tuple(environment.world().privacy().public_terms) if environment is not None else ()
    if public:
        config = config.model_copy(update={"public_terms": tuple(dict.fromkeys(config.public_terms + public))})
    contexts = [str(e.get("context") or "") for e in episodes] + [t.context for t in tasks]
    directory, people = directory_of(environment, contexts) if environment is not None else (Directory(), [])
    anonymizer = Anonymizer(config, directory)
    key = pseudonym_key(config.key.get_secret_value() if config.key else None)
    world_words = [*(t for task in tasks for t in (task.prompt, task.reference or "", *_strings(task.metadata))),
                   *(_strings(world_values(environment)) if environment is not None else ())]
    planted = plant_canaries(canary_seed(key, episodes, (task.id for task in tasks)), avoid=input_words(
        [*(t for e in episodes for t in episode_texts(e)), *world_words])) if plant else None
    work_episodes = list(episodes) + ([planted.episode] if planted else [])

    anon_episodes = anonymizer.anonymize_episodes(work_episodes)
    # Tasks and world are the environment's own: rewritten (and audited) when it declares personal data in them.
    # One that declares none keeps them as they are (pseudonymizing a timetable's station names would break it);
    # its episodes are anonymized all the same, since users type what they like.
    personal_world = environment is not None and has_personal_world(environment)
    anon_tasks = [task.model_copy(update={
        "prompt": anonymizer.anonymize_text(task.prompt),
        "reference": anonymizer.anonymize_text(task.reference) if task.reference else task.reference,
        "metadata": anonymizer.anonymize_json(dict(task.metadata)),
    }) for task in tasks] if personal_world else list(tasks)
    anon_environment = ((environment.world().anonymized(anonymizer.anonymize_text) or environment) if personal_world
                        else environment)

    auditor = leak_auditor(key, config.public_terms)
    if planted:
        auditor.learn_headers([planted.email])  # its message id is an id, not an address
    world_texts = [*(t for task in tasks for t in (task.prompt, task.reference or "", *_strings(task.metadata))),
                   *_strings(world_values(environment))] if personal_world else []
    for text in [*(t for e in work_episodes for t in episode_texts(e)), *world_texts]:
        auditor.learn_text(text)
    auditor.add_literals([*(v for pair in people for v in pair if v), *(canaries or []),
                          *(planted.values if planted else ())])

    kept, leaks = scan_records(auditor, anon_episodes, EPISODES_FILE, "line", planted is not None)
    if personal_world:
        for i, task in enumerate(anon_tasks):
            leaks += auditor.scan(TASKS_FILE, f"line {i + 1}", task.model_dump(mode="json"))
        if anon_environment is environment:
            # It declares personal data but kept its world as it was: one finding for the whole world.
            leaks.append(Finding(WORLD_FILE, "world", "", "raw_world", "anonymized() returned the raw world", "-"))
        else:
            leaks += auditor.scan(WORLD_FILE, "world", world_values(anon_environment))
    name = environment.name if environment is not None else name
    report = {**anonymizer.privacy_report(), "environment": name, "directory_entries": len(people),
              "world": ("anonymized" if personal_world else "none" if environment is None
                        else "declared free of personal data, kept"),
              "canaries": len(canaries or []), "planted_canaries": len(planted.values) if planted else 0,
              "records_scanned": len(anon_episodes) + len(anon_tasks) + 1,
              "leaks": len(leaks), "leaks_by_kind": count_kinds(f.kind for f in leaks)}
    return PluginPrivacyResult(kept, anon_tasks, anon_environment, report, leaks)


def merged_privacy_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One privacy report of several per-environment passes (a run on several plug-ins): counts added, entity
    and leak kinds merged, each pass's report kept under its environment."""
    if len(reports) == 1:
        return reports[0]
    merged: dict[str, Any] = {"per_environment": {r.get("environment", str(i)): r for i, r in enumerate(reports)},
                              "environment": ", ".join(str(r.get("environment")) for r in reports)}
    for report in reports:
        for key, value in report.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                merged[key] = merged.get(key, 0) + value
            elif key in ("entities", "leaks_by_kind") and isinstance(value, dict):
                bucket = merged.setdefault(key, {})
                for kind, count in value.items():
                    bucket[kind] = bucket.get(kind, 0) + count
    return merged
