"""Names only in bodies, names in forwarded Lotus Notes headers, names inside ids and paths: the anonymizer
replaces them, and an auditor that shares none of its detectors proves it, without copying a value anywhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent_rl.privacy.anonymize import AnonymizerConfig, episode_texts
from agent_rl.curation.datasets import sft_rows
from agent_rl.environments.email.grpo_rows import grpo_rows
from agent_rl.environments.email.privacy import anonymize_partition
from agent_rl.environments.email.records import Email, Scenario

# Full names of varied origins, only ever written in bodies; none is in any header or among the surrogates.
BODY_NAMES = [
    "Marguerite Dubois", "Oluwaseun Adebayo-Okonkwo", "Nguyen Thi Lan", "Siobhan O'Callaghan", "Dmitri Volkov",
    "Aiko Tanabe", "Rahul Venkataraman", "Ewa Kowalczyk-Nowak", "Thandiwe Dlamini", "Joaquín Echeverría",
    "Hamid Farahani", "Lars-Erik Bergkvist", "Priyanka Chaturvedi", "Kwame Mensah-Boateng", "Solveig Halvorsen",
    "Mateus Albuquerque",
]
BODY_TEMPLATES = [
    "Call {} at the Portland office before the nomination deadline.",
    "{} has the signed confirmation for the Malin delivery.",
    "I spoke with {} yesterday; the volumes are fine.",
    "Please send the revised curve to {} and copy me.",
    "Thanks,\n{}",
    "The Calpine redline came back from {} this morning.",
    "Per {}, the pipeline maintenance moves to Friday.",
    "Regards,\n\n{}\nGas Structuring",
]


def _parts(name: str) -> list[str]:
    return [p for p in re.split(r"[ \-]", name) if len(p) > 2]


def _left(parts: list[str], text: str) -> list[str]:
    return [p for p in parts if re.search(rf"(?<![\w]){re.escape(p)}(?![\w])", text)]


@pytest.fixture(scope="module")
def planted(demo_env):
    """Demo emails, with the 16 names planted in bodies, in a correct episode's tool result and in a scenario."""
    emails = list(demo_env.emails)
    inbox = emails[0].inbox
    bodies = [BODY_TEMPLATES[i % len(BODY_TEMPLATES)].format(name) for i, name in enumerate(BODY_NAMES)]
    planted_emails = [Email(message_id=f"<9{i:05d}.planted@mail.example.com>", inbox=inbox, subject="Malin volumes",
                            sender=emails[0].sender, to=(inbox,), body=body) for i, body in enumerate(bodies)]
    episode = next(e for e in demo_env.episodes if e["outcome"] == "correct" and
                   any(m["role"] == "tool" and m["content"].startswith("[{") for m in e["messages"]))
    episode = json.loads(json.dumps(episode))
    for message in episode["messages"]:
        if message["role"] == "tool" and message["content"].startswith("[{"):
            hits = json.loads(message["content"])
            hits[0]["snippet"] = " ".join(bodies)
            message["content"] = json.dumps(hits, separators=(",", ":"))
    scenario = demo_env.scenarios[0].model_copy(update={
        "question": f"Who did {BODY_NAMES[0]} ask to call?", "answer": BODY_NAMES[1]})
    return emails + planted_emails, [episode], [scenario, *demo_env.scenarios[1:5]]


def test_names_only_in_bodies_leave_no_part_in_emails_sft_or_grpo_rows(planted):
    emails, episodes, scenarios = planted
    result = anonymize_partition(episodes, emails, scenarios, config=AnonymizerConfig(key="test-key"))
    texts = [t for e in result.emails for t in episode_texts(e)]
    texts += [json.dumps(row) for row in sft_rows(result.episodes, min_quality=0.0, max_idk_share=None)]
    texts += [json.dumps(row) for row in grpo_rows([s.model_dump(mode="json") for s in result.scenarios], "train")]
    assert len(texts) > 100
    survivors = {name: _left(_parts(name), "\n".join(texts)) for name in BODY_NAMES}
    assert {name: left for name, left in survivors.items() if left} == {}
    assert result.report["leaks"] == 0, [str(leak) for leak in result.leaks]


def test_the_check_catches_what_the_anonymizer_misses_and_reports_it_masked(planted):
    """The same data through an anonymizer blind to free-text names (no NER, no name finder), as the
    anonymizer was for these names before: the auditor still finds them, and says where, never what."""
    emails, episodes, scenarios = planted
    blind = AnonymizerConfig(key="test-key", ner=False, name_finder=False)
    result = anonymize_partition(episodes, emails, scenarios, config=blind)
    names = [f for f in result.leaks if f.kind == "name"]
    assert len(names) >= len(BODY_NAMES)
    where = {(f.file, f.field) for f in names}
    assert ("anonymized_environment/inbox.db", "body") in where
    assert any(f.file == "anonymized_episodes/episodes.jsonl" and f.field.startswith("messages[") for f in names)
    assert any(f.file == "anonymized_environment/scenarios.jsonl" and f.field in ("question", "answer") for f in names)
    assert any(f.file == "planted canary" for f in result.leaks)  # its own canaries went unnoticed too
    shown = json.dumps(result.report) + "\n".join(str(f) for f in result.leaks) + repr(result.leaks)
    for name in BODY_NAMES:
        for part in _parts(name):
            assert not re.search(rf"(?i)\b{re.escape(part)}\b", shown), part
    from agent_rl.privacy.leak_check import mask

    assert mask("donna lowry") == "d**** l****"


def test_curation_plants_its_own_canaries_and_drops_them_before_writing(demo_env):
    from agent_rl.privacy.leak_check import CANARY_EPISODE_ID, CANARY_INBOX

    result = anonymize_partition(demo_env.episodes[:20], demo_env.emails, demo_env.scenarios[:5],
                                 config=AnonymizerConfig(key="test-key"))
    assert result.report["planted_canaries"] >= 5 and result.report["leaks"] == 0
    assert all(e.inbox != CANARY_INBOX for e in result.emails) and len(result.emails) == len(demo_env.emails)
    assert all(e.get("episode_id") != CANARY_EPISODE_ID for e in result.episodes) and len(result.episodes) == 20
    # With nothing replaced, the canaries are the first thing the check trips on.
    blind = anonymize_partition([], demo_env.emails[:5], [], config=AnonymizerConfig(key="k", entities=()))
    assert {"name", "phone", "card", "canary"} <= {f.kind for f in blind.leaks if f.file == "planted canary"}


def test_ids_folders_paths_and_scenario_ids_are_pseudonymized_consistently(demo_env):
    owner = "phillip.allen@enron.com"
    message_id = "<8069939.1075855675628.JavaMail.phillip.allen@enron.com>"
    email = Email(message_id=message_id, inbox=owner, sender=f"Phillip K Allen <{owner}>", to=(owner,),
                  subject="Gas curve", body="The curve is attached.", folder="\\Allen, Phillip K.\\Inbox",
                  file="allen-p/inbox/12.")
    scenario = Scenario(id="demo-fact-0001-absent-phillip.allen", inbox_id=owner, question="When is the curve due?",
                        answer="Friday", source_ids=[message_id], category="date", split="train",
                        query_date="2001-05-01T00:00:00Z")
    tool = json.dumps([{"id": message_id, "subject": "Gas curve"}], separators=(",", ":"))
    episode = {**demo_env.episodes[0], "context": owner, "scenario_id": scenario.id, "citations": [message_id],
               "messages": [{"role": "tool", "content": tool},
                            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "read_email", "arguments": json.dumps({"message_id": message_id})}}]}]}
    result = anonymize_partition([episode], [email], [scenario], config=AnonymizerConfig(key="test-key"))
    (out_email,), (out_scenario,), (out_episode,) = result.emails, result.scenarios, result.episodes
    written = json.dumps([out_email.model_dump(mode="json"), out_scenario.model_dump(mode="json"), out_episode])
    assert not re.search(r"(?i)phillip|allen", written)
    assert result.report["leaks"] == 0
    # Citations and replays still line up.
    assert out_episode["citations"] == [out_email.message_id] == out_scenario.source_ids
    assert out_episode["scenario_id"] == out_scenario.id and out_episode["context"] == out_email.inbox
    assert json.loads(out_episode["messages"][0]["content"])[0]["id"] == out_email.message_id
    arguments = json.loads(out_episode["messages"][1]["tool_calls"][0]["function"]["arguments"])
    assert arguments["message_id"] == out_email.message_id
    assert out_email.message_id.startswith("<8069939.1075855675628.JavaMail.") and out_email.file.endswith("/inbox/12.")


def test_the_check_scans_ids_too():
    """A name inside an id that no list knows is still found: the auditor reads every field."""
    from agent_rl.privacy.leak_check import LeakAuditor

    auditor = LeakAuditor(b"salt")
    auditor.learn_headers([Email(message_id="<m1@x.com>", inbox="zbigniew.brzezinski@x.com")])
    findings = auditor.scan("anonymized_environment/inbox.db", "row 1",
                            {"message_id": "<1.2.zbigniew.brzezinski@x.com>", "file": "brzezinski-z/inbox/1."})
    assert {f.field for f in findings} == {"message_id", "file"}
    assert all("brzezinski" not in str(f).lower() for f in findings)


def test_a_declared_public_place_is_no_leak_and_a_person_beside_it_still_is():
    """The demo's site "Sandy Hook" reads as a census first name and surname; declared public, it is not a
    person's name, while the pilot's owner "Nadia Pemberton" is still caught."""
    from agent_rl.privacy.leak_check import LeakAuditor

    text = "Budget for the Sandy Hook battery storage pilot, per Nadia Pemberton."
    for public, leaked in (((), {"Sandy Hook", "Nadia Pemberton"}), (("Sandy Hook",), {"Nadia Pemberton"})):
        auditor = LeakAuditor(b"salt", public=public)
        auditor.learn_text(text)
        for name in ("Sandy Hook", "Nadia Pemberton"):
            found = auditor.scan("sft_dataset/train.jsonl", "line 1", {"content": f"Ask {name} about it."})
            assert bool(found) == (name in leaked), (public, name)


def test_a_declared_public_place_written_in_lower_case_is_no_leak_either():
    """Users type "sandy hook" in lower case; a lower-case first name + surname pair is a person only when it is
    not a declared public term, while a person written in lower case ("nadia pemberton") is still caught."""
    from agent_rl.privacy.leak_check import LeakAuditor

    text = "what is the budget for the sandy hook pilot? ask nadia pemberton."
    for public, leaked in (((), {"sandy hook", "nadia pemberton"}), (("Sandy Hook",), {"nadia pemberton"})):
        auditor = LeakAuditor(b"salt", public=public)
        auditor.learn_text(text)
        for name in ("sandy hook", "nadia pemberton"):
            found = auditor.scan("sft_dataset/train.jsonl", "line 1", {"content": f"ask {name} about it."})
            assert bool(found) == (name in leaked), (public, name)


def _enron_paths() -> tuple[Path, Path]:
    local = Path(__file__).resolve().parents[1] / "data"
    if (local / "emails_sample.csv").is_file() and (local / "enron_annotated.json").is_file():
        return local / "emails_sample.csv", local / "enron_annotated.json"
    from tests.conftest import ENRON_ANNOTATED, ENRON_CSV

    return ENRON_CSV, ENRON_ANNOTATED


def test_enron_names_in_forwarded_notes_headers_lose_their_surname_too(tmp_path):
    """`Alan Aronowitz@ECT`, `Joseph P Hirl/HOU/ECT`, quoted To:/cc: lines: every person the annotated questions
    point to that appears in a body keeps no name part, and the Notes org codes stay as they are."""
    from agent_rl.environments.email.inbox.ingest import ingest
    from agent_rl.environments.email.inbox.store import open_inbox_store

    csv_path, annotated_path = _enron_paths()
    if not csv_path.is_file():
        pytest.skip(f"no Enron sample at {csv_path}")
    store = open_inbox_store(f"sqlite:///{tmp_path / 'enron.db'}")
    ingest(csv_path, store, progress=False)
    emails = [e for a in store.inboxes() for e in store.iter_emails(a)]
    result = anonymize_partition([], emails, [], config=AnonymizerConfig(key="test-key"))

    names: set[str] = set()
    for document in json.loads(annotated_path.read_text())["data"]:
        for paragraph in document["paragraphs"]:
            for qa in paragraph["qas"]:
                asked = re.match(r"(?:Who is|What is the (?:email address|phone number) of) +(.+)\?$", qa["question"])
                names.update([asked.group(1).strip()] if asked else [])
                if qa["question"].startswith("Who"):
                    names.update(a["text"].strip() for a in qa["answers"])
    raw = "\n".join(e.body for e in emails)
    people = sorted(n for n in names if re.fullmatch(r"[A-Z][a-z]+(?: [A-Z]\.?)? [A-Z][A-Za-z'\-]+", n) and n in raw)
    assert len(people) >= 15 and {"Alan Aronowitz", "Joseph P Hirl", "Susan Musch"} <= set(people)
    out = "\n".join(e.body for e in result.emails)
    assert {n: _left(_parts(n), out) for n in people if _left(_parts(n), out)} == {}
    assert "/HOU/ECT@ECT" in out and "@ECT" in out
    assert result.report["leaks"] == 0


def test_a_canary_shares_no_word_with_the_input_or_the_surrogates(demo_env):
    """Canaries are drawn afresh for each partition (their seed is the input's ids); a canary named with a word of
    the input ("Creek" of a site's name) or of the surrogates ("Ramon") would make that word all over the output
    read as a leaked canary: a fast demo's week once failed no_pii_leak with 296 such findings."""
    from agent_rl.privacy.leak_check import input_words, plant_canaries
    from agent_rl.environments.email.privacy import email_texts, scenario_texts
    from agent_rl.surrogates import FIRST_NAMES, LAST_NAMES

    texts = [*(t for e in demo_env.emails for t in email_texts(e)), *(t for s in demo_env.scenarios
                                                                      for t in scenario_texts(s))]
    avoid = input_words(texts)
    taken = avoid | {n.lower() for n in (*FIRST_NAMES, *LAST_NAMES)}
    for seed in range(2000):
        people = plant_canaries(str(seed), avoid=avoid).values[:3]
        words = {w.lower() for person in people for w in re.split(r"[ -]", person)}
        assert not words & taken, (seed, words & taken)
    # Without the input's words, some seeds draw one (what the pass used to plant).
    assert any({w.lower() for p in plant_canaries(str(seed)).values[:3] for w in re.split(r"[ -]", p)} & avoid
               for seed in range(2000))


def test_the_privacy_kits_old_module_names_in_curation_are_the_moved_modules_warned():
    """The kit moved to the ground floor (agent_rl/privacy) so environments import nothing above it; a plug-in that
    imported it from curation keeps working for one release, warned, and gets the very same module objects."""
    import importlib
    import sys

    moved = {"anonymize": "anonymize", "leak_check": "leak_check", "leak_scan": "leak_scan", "patterns": "patterns",
             "directory": "directory", "names": "names", "record_walk": "record_walk",
             "presidio_engines": "presidio_engines", "privacy": "audit"}
    for old, new in moved.items():
        name = f"agent_rl.curation.{old}"
        sys.modules.pop(name, None)
        with pytest.warns(DeprecationWarning, match=f"now agent_rl.privacy.{new}"):
            assert importlib.import_module(name) is importlib.import_module(f"agent_rl.privacy.{new}")
    from agent_rl.curation.anonymize import Anonymizer
    from agent_rl.privacy.anonymize import Anonymizer as Kit

    assert Anonymizer is Kit
