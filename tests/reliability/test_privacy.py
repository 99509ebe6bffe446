"""Privacy: PII canaries planted in the pool (questions, assistant text, tool results, answers) and in the
inbox never come out of curation and training: not in any anonymized dataset, the anonymized inbox, the
Dagster event log, the logs, the adapter's model card or the MLflow run."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest
from dagster._serdes import serialize_value

from agent_rl import settings
from agent_rl.agent.models import build_tiny_model
from agent_rl.curation.datasets import load_jsonl
from agent_rl.pool import PoolRepository
from agent_rl.environments.email.records import Email
from curation_run import ANONYMIZED_STAGES, materialize_curation, seed_pool
from resources.curation import CurationResource

NAMES = ["Bartholomew Quinlan", "Philippa Marchetti"]
STREETS = ["1742 Larkspur Terrace", "88 Gullwing Road, Apt 5B"]
PHONES = ["(503) 555-0187", "+1 212 555 0199"]
CARDS = ["4111 1111 1111 1111", "5500-0000-0000-0004"]  # Luhn-valid, as real card numbers are
EMAILS = ["bart.quinlan@canarymail.example.com"]
CANARIES = NAMES + STREETS + PHONES + CARDS + EMAILS
PII_SENTENCE = (f"{NAMES[0]} of {STREETS[0]}, Portland, phone {PHONES[0]}, paid with card {CARDS[0]}; "
                f"{NAMES[1]} lives at {STREETS[1]} and takes calls on {PHONES[1]} (card {CARDS[1]}, mail {EMAILS[0]}).")
RAW_STAGES = ("pool_episodes", "validated_episodes")  # before the privacy boundary: raw by design


def _plant_in_episode(episode: dict, where: str) -> dict:
    """Canaries in one part of an episode, keeping it a valid, correct episode."""
    episode = json.loads(json.dumps(episode, default=str))
    if where == "question":
        episode["question"] = f"{episode['question']} (asked for {NAMES[0]}, {PHONES[0]})"
        for message in episode["messages"]:
            if message["role"] == "user":
                message["content"] = f"{message['content']} (asked for {NAMES[0]}, {PHONES[0]})"
    elif where == "tool result":
        for message in episode["messages"]:
            if message["role"] == "tool" and message["content"].startswith("{"):
                shown = json.loads(message["content"])
                if "body" in shown:
                    shown["body"] += "\n" + PII_SENTENCE
                    message["content"] = json.dumps(shown)
    elif where == "assistant text":
        for message in episode["messages"]:
            if message["role"] == "assistant":
                message["content"] = f"Checking with {NAMES[1]} at {STREETS[1]} ({CARDS[1]})."
    elif where == "answer":
        suffix = f" (confirmed by {NAMES[0]}, {STREETS[0]}, {EMAILS[0]})"
        episode["final_answer"] += suffix
        for message in episode["messages"]:
            for call in message.get("tool_calls") or []:
                function = call.get("function", call)
                if function.get("name") == "return_final_answer":
                    arguments = function["arguments"]
                    if isinstance(arguments, str):
                        arguments = json.loads(arguments)
                    arguments["answer"] += suffix
                    function["arguments"] = arguments
    return episode


def _plant(store, episodes) -> list[str]:
    """Plant canaries in four correct episodes and in one email of the first inbox; returns the episode ids."""
    correct = [e.model_dump(mode="json") for e in episodes if str(e.outcome) == "correct"]
    planted = [_plant_in_episode(e, where) for e, where in
               zip(correct, ["question", "tool result", "assistant text", "answer"])]
    untouched = [e for e in episodes if e.episode_id not in {p["episode_id"] for p in planted}]
    PoolRepository(settings.pool_url()).insert_episodes(untouched + planted)

    inbox = store.inboxes()[0]
    first = next(iter(store.iter_emails(inbox)))
    store.add_emails([Email(
        message_id="<canary-0001@canarymail.example.com>", inbox=inbox, date=first.date - timedelta(days=1),
        subject=f"Card on file for {NAMES[0]}", sender=f"{NAMES[0]} <{EMAILS[0]}>", to=(inbox,),
        body=f"Hello,\n\n{PII_SENTENCE}\n\nBest,\n{NAMES[0]}\n{PHONES[0]}",
    )])
    return [p["episode_id"] for p in planted]


def _found(text: str) -> list[str]:
    return [c for c in CANARIES if c in text]


def _scan_tree(root: Path, skip: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Canaries per file under `root` (bytes decoded as UTF-8, so SQLite files are read too)."""
    hits = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not any(part in skip for part in path.relative_to(root).parts):
            found = _found(path.read_bytes().decode("utf-8", errors="ignore"))
            if found:
                hits[str(path.relative_to(root))] = found
    return hits


@pytest.mark.slow
def test_planted_pii_never_leaves_the_privacy_boundary(tmp_path, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    store, episodes = seed_pool()
    planted_ids = _plant(store, episodes)
    instance = dg.DagsterInstance.ephemeral()

    result, partition = materialize_curation(CurationResource(min_points=10, canaries=CANARIES), instance=instance)
    assert result.success
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert all(checks.values()), checks

    artifacts = settings.home() / "artifacts"
    # Positive control: the canaries did reach curation (raw export) and the planted episodes stayed in.
    raw = _scan_tree(artifacts / "pool_episodes")
    assert set(sum(raw.values(), [])) == set(CANARIES)
    balanced_ids = {row["episode_id"] for row in load_jsonl(settings.artifact_dir("balanced_episodes", partition) / "episodes.jsonl")}
    assert set(planted_ids) <= balanced_ids, "a planted episode was dropped before the end: the scan proves less"
    assert {p.name for p in artifacts.iterdir()} >= set(ANONYMIZED_STAGES)

    # 1. Every file past the privacy boundary, the anonymized inbox database included.
    assert _scan_tree(artifacts, skip=RAW_STAGES) == {}

    # 2. The Dagster event log: materialization and check metadata, log messages, everything.
    records = instance.all_logs(result.run_id)
    assert any(r.dagster_event and r.dagster_event.is_step_materialization for r in records)
    leaking = [r.dagster_event_type for r in records if _found(serialize_value(r))]
    assert leaking == []

    # 3. Tiny SFT on the curated data through the training entry point, with MLflow tracking:
    #    the adapter, its model card, checkpoints and the MLflow store and artifacts hold no canary.
    train_dir = tmp_path / "train"
    train_dir.mkdir()
    config = {
        "model_path": str(build_tiny_model(tmp_path / "tiny")),
        "rows_jsonl": str(settings.artifact_dir("sft_dataset", partition) / "train.jsonl"),
        "out_dir": str(train_dir / "sft"),
        "settings": {"max_steps": 2, "save_steps": 1, "per_device_train_batch_size": 2, "max_length": 8192},
        "tracking": {"uri": f"sqlite:///{train_dir / 'mlflow.db'}", "dagster_run_id": result.run_id},
    }
    (train_dir / "sft.json").write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-m", "agent_rl.train", "sft", "--config", str(train_dir / "sft.json")],
        capture_output=True, text=True, timeout=600, cwd=train_dir,  # ./mlruns, if MLflow makes one, lands here
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": config["tracking"]["uri"]},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (train_dir / "sft" / "adapter").is_dir()
    assert any(train_dir.rglob("README.md")), "no model card written: nothing to scan"
    assert _scan_tree(train_dir) == {}
    assert _found(done.stdout + done.stderr) == []

    # 4. Everything logged in this process (library, Dagster, uvicorn) and printed to stdout/stderr.
    out, err = capfd.readouterr()
    assert _found(caplog.text) == [] and _found(out) == [] and _found(err) == []


# Names of varied origins written only in bodies (never in a header), as an auditor planted them.
BODY_NAMES = ["Marguerite Dubois", "Oluwaseun Adebayo-Okonkwo", "Siobhan O'Callaghan", "Rahul Venkataraman",
              "Ewa Kowalczyk-Nowak", "Thandiwe Dlamini"]
BODY_TEXT = (f"Call {BODY_NAMES[0]} at the Portland office. {BODY_NAMES[1]} has the confirmation; I spoke with "
             f"{BODY_NAMES[2]} yesterday.\nPer {BODY_NAMES[3]}, the maintenance moves to Friday.\n\nThanks,\n"
             f"{BODY_NAMES[4]}\n\n-----Original Message-----\nFrom: {BODY_NAMES[5]}\nSubject: Malin volumes")
BODY_PARTS = sorted({p for n in BODY_NAMES for p in n.replace("-", " ").split() if len(p) > 2})


def _plant_body_names(store, episodes) -> None:
    """The names in the body of one inbox email and in a tool result of one correct episode."""
    correct = next(e.model_dump(mode="json") for e in episodes if str(e.outcome) == "correct"
                   and any(m["role"] == "tool" and m["content"].startswith("{") for m in e.model_dump()["messages"]))
    for message in correct["messages"]:
        if message["role"] == "tool" and message["content"].startswith("{"):
            shown = json.loads(message["content"])
            shown["body"] = shown.get("body", "") + "\n" + BODY_TEXT
            message["content"] = json.dumps(shown, separators=(",", ":"))
    PoolRepository(settings.pool_url()).insert_episodes(
        [e for e in episodes if e.episode_id != correct["episode_id"]] + [correct])
    inbox = store.inboxes()[0]
    first = next(iter(store.iter_emails(inbox)))
    store.add_emails([first.model_copy(update={"message_id": "<body-names-0001@mail.example.com>",
                                               "body": BODY_TEXT})])


def _parts_in(text: str) -> list[str]:
    return [p for p in BODY_PARTS if re.search(rf"(?<!\w){re.escape(p)}(?!\w)", text)]


def test_names_only_in_bodies_never_pass_the_privacy_boundary():
    store, episodes = seed_pool()
    _plant_body_names(store, episodes)
    result, partition = materialize_curation(CurationResource(min_points=10))
    assert result.success
    assert {e.check_name: e.passed for e in result.get_asset_check_evaluations()}["no_pii_leak"] is True

    artifacts = settings.home() / "artifacts"
    raw = (artifacts / "validated_episodes").rglob("*.jsonl")
    assert any(_parts_in(path.read_text()) for path in raw)  # positive control: they reached curation
    leaks = {}
    for path in sorted(artifacts.rglob("*")):
        if path.is_file() and not set(path.relative_to(artifacts).parts) & set(RAW_STAGES):
            found = _parts_in(path.read_bytes().decode("utf-8", errors="ignore"))
            if found:
                leaks[str(path.relative_to(artifacts))] = found
    assert leaks == {}
    assert (artifacts / "sft_dataset").is_dir() and (artifacts / "grpo_dataset").is_dir()
    report = json.loads((settings.artifact_dir("anonymized_episodes", partition) / "privacy.json").read_text())
    assert report["planted_canaries"] >= 5 and report["leaks"] == 0  # its own canaries were planted and removed


def test_a_miss_fails_the_gate_and_says_where_without_the_value():
    """A canary no detector can know (a code word) survives: the gate blocks training, and the event log,
    the check's metadata and privacy.json show its place, kind and a masked form, never the value."""
    code_word = "Quillfeather Zonderwick"
    store, episodes = seed_pool()
    inbox = store.inboxes()[0]
    first = next(iter(store.iter_emails(inbox)))
    store.add_emails([first.model_copy(update={"message_id": "<code-word-0001@mail.example.com>",
                                               "body": f"the code word is {code_word.lower()} for the vault"})])
    PoolRepository(settings.pool_url()).insert_episodes(episodes)
    instance = dg.DagsterInstance.ephemeral()
    result, partition = materialize_curation(CurationResource(min_points=10, canaries=[code_word]), instance=instance)
    check = next(e for e in result.get_asset_check_evaluations() if e.check_name == "no_pii_leak")
    assert check.passed is False
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "sft_dataset" not in materialized and "balanced_episodes" not in materialized
    assert "grpo_dataset" not in materialized  # the GRPO prompts come from the same anonymization: gated too
    examples = check.metadata["examples"].value
    assert any("anonymized_environment/inbox.db" in x and "field body" in x and "q*********** z*********" in x
               for x in examples), examples
    privacy = (settings.artifact_dir("anonymized_episodes", partition) / "privacy.json").read_text()
    logged = [serialize_value(r) for r in instance.all_logs(result.run_id)]
    for text in [privacy, json.dumps(examples), *logged]:
        assert "quillfeather" not in text.lower() and "zonderwick" not in text.lower()
