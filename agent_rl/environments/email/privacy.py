"""The email assistant's privacy pass over its records: anonymize the episodes, the emails and the scenarios with
one Anonymizer, then have the independent leak auditor (agent_rl/privacy/leak_check.py) scan every record that will
be written for original values. It lives here, not in curation, because only the email world has inboxes and
scenarios; privacy_pass.py runs it over the whole inbox store and writes what it returns. Both run the ground
floor's privacy kit (agent_rl/privacy), the one curation's pass for plug-ins runs.

One Anonymizer for all three keeps pseudonyms consistent between the trajectories, the inbox and the golden
answers, so rewards computed on anonymized data stay valid. The auditor learns what is personal from the raw input
by its own detectors, plus canaries this pass plants in its own input on every run (a canary email and episode,
dropped again before anything is written): a miss fails the gate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent_rl.privacy.anonymize import Anonymizer, RecordLayout, build_directory, episode_texts
from agent_rl.privacy.leak_check import Finding, input_words, plant_canaries
from agent_rl.privacy.audit import EPISODES_FILE, canary_seed, count_kinds, leak_auditor, scan_records
from agent_rl.surrogates import pseudonym_key
from agent_rl.environments.core import AnonymizerConfig
from agent_rl.environments.email.records import Email, Scenario

# Where the email world's records are written (assets/curation.py); findings name these.
EMAILS_FILE = "anonymized_environment/inbox.db"
SCENARIOS_FILE = "anonymized_environment/scenarios.jsonl"

# Which fields of the email world's records hold personal data: an email's headers and text (message ids, folders and
# file paths such as `<...phillip.allen@enron.com>` and `allen-p/...` keep their shape), a scenario's question,
# answer and inbox (its id and source email ids keep theirs).
EMAIL_LAYOUT = RecordLayout(texts=("inbox", "subject", "sender", "body"), text_lists=("to", "cc", "bcc"),
                            ids=("message_id", "folder", "file"))
SCENARIO_LAYOUT = RecordLayout(texts=("question", "answer", "inbox_id", "inbox"), ids=("id", "source_ids"))


@dataclass
class PrivacyResult:
    episodes: list[dict[str, Any]]
    emails: list[Email]
    scenarios: list[Scenario]
    report: dict[str, Any]
    leaks: list[Finding] = field(default_factory=list)


def anonymize_world(anonymizer: Anonymizer, emails: list[Email], scenarios: list[Scenario]
                    ) -> tuple[list[Email], list[Scenario]]:
    """The inbox and its scenarios in one pass of `anonymizer`, so every name they share maps the same way."""
    anon_emails, anon_scenarios = anonymizer.anonymize_records([(emails, EMAIL_LAYOUT), (scenarios, SCENARIO_LAYOUT)])
    return anon_emails, anon_scenarios


def email_texts(email: Email) -> list[str]:
    return EMAIL_LAYOUT.texts_of(email)


def scenario_texts(scenario: Scenario) -> list[str]:
    return SCENARIO_LAYOUT.texts_of(scenario)


def anonymize_partition(
    episodes: list[dict[str, Any]],
    emails: list[Email],
    scenarios: list[Scenario],
    canaries: list[str] | None = None,
    config: AnonymizerConfig | None = None,
    directory_emails: Iterable[Email] | None = None,
    plant: bool = True,
) -> PrivacyResult:
    """Anonymized copies of everything training will see, with the independent leak scan over all of it.

    `directory_emails` (default: `emails`) are the emails whose headers say who is a person: pass every
    inbox of the store, so a name from another mailbox's headers is known here too. `canaries` are extra
    values that must not survive; `plant` adds this pass's own canary email and episode.
    """
    config = config or AnonymizerConfig()
    header_emails = list(directory_emails) if directory_emails is not None else list(emails)
    directory = build_directory(header_emails)
    anonymizer = Anonymizer(config, directory)
    key = pseudonym_key(config.key.get_secret_value() if config.key else None)
    planted = plant_canaries(canary_seed(key, episodes, (e.message_id for e in emails)), avoid=input_words(
        [*(t for e in emails for t in email_texts(e)), *(t for e in episodes for t in episode_texts(e)),
         *(t for s in scenarios for t in scenario_texts(s))])) if plant else None
    work_emails = list(emails) + ([Email.model_validate(planted.email)] if planted else [])
    work_episodes = list(episodes) + ([planted.episode] if planted else [])

    anon_emails, anon_scenarios = anonymize_world(anonymizer, work_emails, scenarios)
    anon_episodes = anonymizer.anonymize_episodes(work_episodes)

    auditor = leak_auditor(key, config.public_terms)
    auditor.learn_headers([*header_emails, *work_emails])
    for email in work_emails:
        for text in email_texts(email):
            auditor.learn_text(text)
    for episode in work_episodes:
        for text in episode_texts(episode):
            auditor.learn_text(text)
    for scenario in scenarios:
        for text in scenario_texts(scenario):
            auditor.learn_text(text)
    auditor.add_literals([*(canaries or []), *(planted.values if planted else ())])

    kept_episodes, leaks = scan_records(auditor, anon_episodes, EPISODES_FILE, "line", planted is not None)
    kept_emails, email_leaks = scan_records(auditor, anon_emails, EMAILS_FILE, "row", planted is not None,
                                            lambda email: email.model_dump(mode="json"))
    leaks += email_leaks
    for i, scenario in enumerate(anon_scenarios):
        leaks += auditor.scan(SCENARIOS_FILE, f"line {i + 1}", scenario.model_dump(mode="json"))

    report = {**anonymizer.privacy_report(), "directory_entries": len(directory.originals()),
              "canaries": len(canaries or []), "planted_canaries": len(planted.values) if planted else 0,
              "originals_known_to_check": len(auditor.parts) + len(auditor.addresses) + len(auditor.phones),
              "records_scanned": len(anon_episodes) + len(anon_emails) + len(anon_scenarios),
              "leaks": len(leaks), "leaks_by_kind": count_kinds(f.kind for f in leaks)}
    return PrivacyResult(kept_episodes, kept_emails, anon_scenarios, report, leaks)
