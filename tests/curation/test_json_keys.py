"""Personal data used as a JSON object's key is anonymized and audited like any other text: in tool results and
arguments, task metadata, and the leak check's own findings, whose field paths never repeat a personal key."""

from __future__ import annotations

import json

from agent_rl.privacy.anonymize import Anonymizer, AnonymizerConfig, build_directory
from agent_rl.curation.plugin_privacy import anonymize_plugin_partition
from agent_rl.privacy.audit import leak_auditor

ADDRESS = "marguerite.okb@lakeside-mail.com"
PHONE = "(415) 555-0142"
CONTACTS = {"contacts": {ADDRESS: {"phone": PHONE, "name": "Marguerite Okafor-Brandt"}}}


def episode() -> dict:
    return {
        "episode_id": "ep-keys", "created_at": "2026-11-20T00:00:00+00:00", "environment": "gateway",
        "context": "gateway", "task_category": "lookup", "question": "Who do I call?", "policy_version": "prod",
        "outcome": "unjudged", "reward": None, "feedback": "up",
        "messages": [
            {"role": "user", "content": "Who do I call?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "lookup", "arguments": json.dumps({"by_address": {ADDRESS: True}})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": json.dumps(CONTACTS)},
            {"role": "assistant", "content": f"Call Marguerite Okafor-Brandt at {PHONE} ({ADDRESS})."},
        ],
    }


def test_a_personal_key_is_pseudonymized_consistently_with_the_same_value_elsewhere():
    anonymizer = Anonymizer(AnonymizerConfig(key="k"), build_directory([]))
    out = anonymizer.anonymize_episodes([episode()])[0]
    text = json.dumps(out)
    assert ADDRESS not in text and "555-0142" not in text
    result = json.loads(out["messages"][2]["content"])
    (surrogate,) = result["contacts"]  # the key was rewritten, the structure kept
    assert "@" in surrogate and surrogate in out["messages"][3]["content"]  # same pseudonym as in the answer
    assert set(result["contacts"][surrogate]) == {"phone", "name"}  # field names stay
    arguments = json.loads(out["messages"][1]["tool_calls"][0]["function"]["arguments"])
    assert list(arguments["by_address"]) == [surrogate]


def test_the_gateway_privacy_pass_leaves_no_key_behind_and_reports_none():
    result = anonymize_plugin_partition(None, [episode()], [], config=AnonymizerConfig(key="k"))
    assert ADDRESS not in json.dumps(result.episodes) and not result.leaks


def test_the_auditor_finds_a_personal_key_and_names_its_path_without_it():
    auditor = leak_auditor(b"k")
    auditor.add_literals([ADDRESS])
    findings = auditor.scan("episodes.jsonl", "1", {"messages": [{"content": json.dumps(CONTACTS)}]})
    assert findings, "a personal key went unseen"
    for finding in findings:
        shown = f"{finding} {finding.field}"
        assert "marguerite" not in shown.lower() and "lakeside" not in shown.lower()
    assert any("(key)" in f.field and "<key #" in f.field for f in findings)


def test_a_directory_keyed_by_surname_comma_given_name_loses_the_names_and_keeps_places():
    """A tool's directory keyed "Jover, Nerissa" left both names: the comma split the run, and neither word alone
    looked like anyone. A line that is only "Surname, Given" is a person; "Houston, Texas" is a place and stays."""
    anonymizer = Anonymizer(AnonymizerConfig(key="k"), build_directory([]))
    result = {"directory": {"Jover, Nerissa": {"desk": "B36"}, "Degori, Tanya K.": {"desk": "B2"},
                            "Houston, Texas": {"desk": "B9"}}}
    text = json.dumps(anonymizer.anonymize_episodes([{**episode(), "messages": [
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps(result)}]}])[0])
    for part in ("Jover", "Nerissa", "Degori", "Tanya"):
        assert part not in text
    assert "Houston, Texas" in text
    assert anonymizer.anonymize_texts(["Houston, Texas", "Portland, Oregon"]) == ["Houston, Texas", "Portland, Oregon"]
