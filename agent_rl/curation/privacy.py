"""The privacy pass of a partition: anonymize episodes and the environment with one Anonymizer, then
scan every output for original values (the header directory plus planted canaries).

One Anonymizer for both keeps pseudonyms consistent between the trajectories, the inbox and the
golden answers, so rewards computed on anonymized data stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_rl.curation.anonymize import Anonymizer, AnonymizerConfig, Leak, build_directory, episode_texts, scan_for_leaks
from agent_rl.records import Email, Scenario


@dataclass
class PrivacyResult:
    episodes: list[dict[str, Any]]
    emails: list[Email]
    scenarios: list[Scenario]
    report: dict[str, Any]
    leaks: list[Leak] = field(default_factory=list)


def email_texts(email: Email) -> list[str]:
    return [email.inbox, email.sender, email.subject, email.body, *email.to, *email.cc, *email.bcc]


def scenario_texts(scenario: Scenario) -> list[str]:
    return [scenario.inbox_id, scenario.question, scenario.answer]


def anonymize_partition(
    episodes: list[dict[str, Any]],
    emails: list[Email],
    scenarios: list[Scenario],
    canaries: list[str] | None = None,
    config: AnonymizerConfig | None = None,
) -> PrivacyResult:
    """Anonymized copies of everything training will see, with the leak scan over all of it."""
    directory = build_directory(emails)
    anonymizer = Anonymizer(config, directory)
    anon_emails, anon_scenarios = anonymizer.anonymize_environment(emails, scenarios)
    anon_episodes = anonymizer.anonymize_episodes(episodes)
    texts: list[str] = []
    for episode in anon_episodes:
        texts.extend(episode_texts(episode))
    for email in anon_emails:
        texts.extend(email_texts(email))
    for scenario in anon_scenarios:
        texts.extend(scenario_texts(scenario))
    originals = [*directory.originals(), *(canaries or [])]
    leaks = scan_for_leaks(texts, originals)
    report = {**anonymizer.privacy_report(), "directory_entries": len(directory.originals()),
              "canaries": len(canaries or []), "texts_scanned": len(texts), "leaks": len(leaks)}
    return PrivacyResult(anon_episodes, anon_emails, anon_scenarios, report, leaks)
