import json
import socket

import pytest

from agent_rl.privacy.anonymize import (
    Anonymizer,
    AnonymizerConfig,
    build_directory,
    episode_texts,
    scan_for_leaks,
)
from agent_rl.surrogates import Surrogates, luhn_valid
from agent_rl.environments.email.privacy import anonymize_world
from agent_rl.environments.email.records import Category, Email


@pytest.fixture(scope="module")
def directory(demo_env):
    return build_directory(demo_env.emails)


@pytest.fixture(scope="module")
def anonymized(demo_env, directory):
    anonymizer = Anonymizer(AnonymizerConfig(key="test-key"), directory)
    emails, scenarios = anonymize_world(anonymizer, demo_env.emails, demo_env.scenarios)
    episodes = anonymizer.anonymize_episodes(demo_env.episodes)
    return anonymizer, emails, scenarios, episodes


def test_directory_derives_first_and_last_names_from_headers():
    d = build_directory([Email(message_id="m", inbox="sherry.ortiz@x.com", sender='"Ortiz, Sherry" <s.o@x.com>',
                               to=("vince.kaminski@x.com", "ops@x.com"))])
    assert {"sherry", "vince"} <= d.first_names and {"ortiz", "kaminski"} <= d.last_names
    assert {"sherry.ortiz@x.com", "vince.kaminski@x.com", "ops@x.com", "s.o@x.com"} <= d.addresses
    assert "Sherry Ortiz" in d.full_names


def test_names_map_consistently_and_stay_realistic():
    d = build_directory([Email(message_id="m", inbox="sherry.ortiz@x.com")])
    a = Anonymizer(AnonymizerConfig(key="k1"), d)
    full, first, last, address = a.anonymize_texts(["Sherry Ortiz", "Sherry", "Ms. Ortiz", "sherry.ortiz@x.com"])
    new_first, new_last = full.split()
    assert first == new_first and last == f"Ms. {new_last}"
    assert address == f"{new_first.lower()}.{new_last.lower()}@x.com"
    assert {new_first, new_last}.isdisjoint({"Sherry", "Ortiz"})
    other_key = Anonymizer(AnonymizerConfig(key="k2"), d).anonymize_text("Sherry Ortiz")
    assert other_key != full


def test_contact_details_get_surrogates_of_the_same_kind():
    a = Anonymizer(AnonymizerConfig(key="k"))
    text = "Card 4111 1111 1111 1111, call (713) 853-4567, budget $1,250,000 on 2024-03-05, host 192.168.10.7."
    out = a.anonymize_text(text)
    assert "4111 1111 1111 1111" not in out and "853-4567" not in out and "192.168.10.7" not in out
    card = out.split("Card ")[1].split(",")[0]
    assert luhn_valid(card) and len(card) == 19 and card[0] == "4"
    phone = out.split("call ")[1].split(",")[0]
    assert phone[0] == "(" and phone[4:6] == ") " and phone[9] == "-" and phone[1] not in "01"
    assert "$1,250,000" in out and "2024-03-05" in out  # amounts and dates are task answers: kept


def test_person_answers_stay_findable_in_their_source_email(demo_env, anonymized):
    _, emails, scenarios, _ = anonymized
    by_id = {e.message_id: e for e in emails}
    originals = {s.id: s for s in demo_env.scenarios}
    person = [s for s in scenarios if s.category == Category.PERSON]
    assert person
    for scenario in person:
        assert scenario.answer != originals[scenario.id].answer  # the name was replaced...
        sources = [by_id[i] for i in scenario.source_ids]
        # ...and the same surrogate is what the anonymized source email says.
        assert any(scenario.answer in e.body for e in sources), scenario


def test_no_directory_value_leaks_anywhere(demo_env, directory, anonymized):
    _, emails, scenarios, episodes = anonymized
    texts = [t for e in episodes for t in episode_texts(e)]
    texts += [t for e in emails for t in episode_texts(e)]
    texts += [t for s in scenarios for t in episode_texts(s)]
    originals = directory.originals()
    before = [t for e in demo_env.episodes for t in episode_texts(e)]
    assert scan_for_leaks(before, originals)  # the scan does find the real names
    # ids stay as they are (citations and rewards must still match), so they are not scanned for names
    kept = {s for e in episodes for s in e["citations"]} | {e.message_id for e in emails}
    leaks = [leak for leak in scan_for_leaks(texts, originals) if leak.value not in kept]
    leaks = [leak for leak in leaks if not any(leak.value in k for k in kept)]
    assert leaks == []


def test_episodes_keep_their_shape_ids_and_valid_json(demo_env, anonymized):
    _, _, _, episodes = anonymized
    for before, after in zip(demo_env.episodes, episodes):
        assert after["episode_id"] == before["episode_id"] and after["citations"] == before["citations"]
        assert len(after["messages"]) == len(before["messages"])
        for m_before, m_after in zip(before["messages"], after["messages"]):
            if m_after["role"] == "tool" and m_before["content"].startswith(("[", "{")):
                parsed = json.loads(m_after["content"])
                if isinstance(parsed, dict) and "id" in parsed:
                    assert parsed["id"] == json.loads(m_before["content"])["id"]
    assert any(a["question"] != b["question"] or a["context"] != b["context"]
               for a, b in zip(episodes, demo_env.episodes))


def test_an_address_with_a_top_level_domain_no_registry_knows_is_replaced_but_a_message_id_is_not():
    """A garbled reply ("no@enronIs.comro") holds an address by the leak auditor's reading, though Presidio's check
    of the top-level domain turns it down: the anonymizer replaces it all the same (an auditor finding would fail the
    week), and an address inside a message id stays, since ids map the same way everywhere."""
    a = Anonymizer(AnonymizerConfig(key="k"))
    out = a.anonymize_text("lin priHicisfun no@enronIs.comro\ufffders ship, see <1234.JavaMail.qx7@thyme.corp>")
    assert "no@enronIs.comro" not in out and "@enronIs.comro" in out  # the person's part goes, the organisation's stays
    assert "<1234.JavaMail.qx7@thyme.corp>" in out
    assert a.anonymize_text("write to no@enronIs.comro") == a.anonymize_text("write to no@enronIs.comro")


def test_planted_canaries_are_caught_and_report_counts(directory):
    a = Anonymizer(AnonymizerConfig(key="k"), directory)
    canaries = ["5500 0000 0000 0004", "canary.person@example.org", "(415) 555-0132"]
    body = (f"Please charge {canaries[0]} and mail {canaries[1]} or phone {canaries[2]}. "
            "Regards, Sherry")
    outs = a.anonymize_texts([body, body, "no names here"])
    assert scan_for_leaks([body], canaries)
    assert scan_for_leaks(outs, canaries) == []
    report = a.privacy_report()
    assert report["texts_processed"] == 3 and report["cache_hits"] >= 1
    assert report["entities"]["CREDIT_CARD"] >= 1 and report["entities"]["EMAIL_ADDRESS"] >= 1


def test_nothing_touches_the_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    a = Anonymizer(AnonymizerConfig(key="k"))
    out = a.anonymize_text("Write to omar.haddad@mail.northwind-energy.co.uk or visit https://intranet.example.com/x")
    assert "omar.haddad@" not in out


def test_surrogates_are_keyed():
    a, b = Surrogates(b"one"), Surrogates(b"two")
    names = [f"Person{i}" for i in range(20)]
    assert [a.first_name(n) for n in names] == [a.first_name(n) for n in names]
    assert [a.first_name(n) for n in names] != [b.first_name(n) for n in names]


def test_tool_results_keep_the_compact_json_the_tools_emit(demo_env, directory):
    """Serving shows the model compact JSON (`[{"id":"...","date":...`); a training row that re-serialized it with
    spaces taught the model a format it never sees. Bodies full of ", " must not change the layout."""
    anonymizer = Anonymizer(AnonymizerConfig(key="test-key"), directory)
    body = "Hi Anna, the figures: 12, 14, 19. Regards, Bob"
    compact = json.dumps([{"id": "<a@b>", "subject": "Q3, final", "body": body}], separators=(",", ":"))
    spaced = json.dumps({"id": "<a@b>", "note": "x"})
    episode = {**demo_env.episodes[0], "messages": [
        {"role": "tool", "content": compact}, {"role": "tool", "content": spaced}]}
    out = anonymizer.anonymize_episode(episode)["messages"]
    assert out[0]["content"].startswith('[{"id":"<a@b>","subject":"Q3, final","body":"')
    assert json.dumps(json.loads(out[0]["content"]), ensure_ascii=False, separators=(",", ":")) == out[0]["content"]
    assert out[1]["content"] == spaced


def test_an_address_cut_short_in_a_search_snippet_does_not_keep_its_owners_name(demo_env, directory):
    """A snippet window ends inside an address ("To: sherry.ortiz@northwind-energy…"): no longer a known address,
    it still names its owner, so its name parts go like a whole address's."""
    anonymizer = Anonymizer(AnonymizerConfig(key="test-key"), directory)
    address = sorted(a for a in directory.addresses if "." in a.split("@")[0])[0]
    local, domain = address.split("@")
    cut = f"{local}@{domain.split('.')[0]}"
    snippet = json.dumps([{"id": "<1@x>", "snippet": f"…Subject: budget To: {cut}…"}], separators=(",", ":"))
    out = anonymizer.anonymize_episode({**demo_env.episodes[0], "messages": [{"role": "tool", "content": snippet}]})
    text = out["messages"][0]["content"].lower()
    for part in local.replace("-", ".").split("."):
        if len(part) > 2:
            assert part not in text, (part, text)


def test_an_address_cut_before_its_at_sign_does_not_keep_its_owners_name(demo_env, directory):
    anonymizer = Anonymizer(AnonymizerConfig(key="test-key"), directory)
    local = sorted(a.split("@")[0] for a in directory.addresses if "." in a.split("@")[0])[0]
    snippet = json.dumps([{"id": "<1@x>", "snippet": f"…Subject: report deadline To: {local}…"}], separators=(",", ":"))
    out = anonymizer.anonymize_episode({**demo_env.episodes[0], "messages": [{"role": "tool", "content": snippet}]})
    text = out["messages"][0]["content"].lower()
    assert "report deadline" in text
    for part in local.replace("-", ".").split("."):
        if len(part) > 2:
            assert part not in text, (part, text)


def test_a_name_ends_at_its_possessive_and_public_words_at_its_edge_stay():
    a = Anonymizer(AnonymizerConfig(key="k", public_terms=("Engineering", "Treasury", "Charlotte")))
    team, howard, offsite, person = a.anonymize_texts([
        "Where is Bridget's Engineering team relocating to?", "Howard's Treasury team moves to Boise.",
        "Which city is the Treasury offsite in?", "Charlotte Pemberton approved it."])
    assert "Bridget" not in team and team.endswith("'s Engineering team relocating to?")
    assert "Howard" not in howard and howard.endswith("'s Treasury team moves to Boise.")
    assert offsite == "Which city is the Treasury offsite in?"  # never learned as a surname from "Howard's Treasury"
    # A public word that is also a first name stays part of the person's name: leaving it would leak it.
    assert "Charlotte" not in person and "Pemberton" not in person


def test_a_first_name_that_is_also_a_site_word_stays_part_of_the_persons_name():
    """A census first name that is also a word of a site's name ("Maple" of "Maple Grove") was trimmed off the
    person's name as a place word, so "Maple Cannizzaro" became "Maple Henry": the leak check's own canary caught
    it. The site itself, and public terms side by side, stay."""
    a = Anonymizer(AnonymizerConfig(key="k", public_terms=("Maple Grove", "Treasury", "Cedar Ridge")))
    person, site, both = a.anonymize_texts([
        "Please call Maple Cannizzaro about the lease.", "The Maple Grove site opens in May.",
        "Maple Grove Treasury moved the Cedar Ridge budget."])
    assert "Maple" not in person and "Cannizzaro" not in person
    assert site == "The Maple Grove site opens in May."
    assert both == "Maple Grove Treasury moved the Cedar Ridge budget."


def test_a_capitalised_particle_that_is_a_first_name_opens_a_name():
    """ "Della" is a first name and a surname particle ("della Rovere"): taken for the particle, "Della Canny"
    (with "canny" an English word) was no one, and the leak check's canary survived whole."""
    a = Anonymizer(AnonymizerConfig(key="k"))
    out, = a.anonymize_texts(["Please call Della Canny at (894) 380-0782 about the lease."])
    assert "Della" not in out and "Canny" not in out and out.endswith("about the lease.")
    signed, = a.anonymize_texts(["See you there.\n\nThanks,\nRandee Della"])  # the particle as a surname
    assert "Randee" not in signed and "Della" not in signed


@pytest.mark.parametrize("seed", ["t264", "t738", "t1108", "w463", *(f"sweep-{i}" for i in range(12))])
def test_the_privacy_pass_catches_its_own_canaries_in_the_demo_world(demo_env, seed, monkeypatch):
    """The canaries a privacy pass plants depend on its input: these draws once leaked (1 in 300, 2 in 1,200 and
    1 in 600 of sweeps over seeds), and a leaked canary fails the pass's gate, so the weekly job registers nothing."""
    from agent_rl.curation import leak_check
    from agent_rl.environments.email import privacy
    from agent_rl.environments.email.inbox.demo_world import public_terms_of

    planted = leak_check.plant_canaries
    monkeypatch.setattr(privacy, "plant_canaries", lambda _seed, avoid=(): planted(seed, avoid=avoid))
    config = AnonymizerConfig(key="k", public_terms=public_terms_of(e.inbox for e in demo_env.emails))
    result = privacy.anonymize_partition([], [], [], config=config, directory_emails=demo_env.emails)
    assert result.report["planted_canaries"] == 7
    assert [str(leak) for leak in result.leaks] == []


def test_the_demo_worlds_places_departments_and_sites_survive_while_its_people_do_not(demo_env, directory):
    """Location answers are cities and questions name departments and sites: anonymizing them into people's names
    ("Where is the Compliance summit?" "Julian") made the demo's task answers wrong and its questions strange."""
    from agent_rl.environments.email.inbox.demo_corpus import public_terms
    from agent_rl.environments.email.inbox.demo_world import public_terms_of

    terms = public_terms_of({e.inbox for e in demo_env.emails})
    assert terms == public_terms() and public_terms_of(["jeff.skilling@enron.com"]) == ()
    a = Anonymizer(AnonymizerConfig(key="test-key", public_terms=terms), directory)
    _, scenarios = anonymize_world(a, demo_env.emails, demo_env.scenarios)
    pairs = list(zip(demo_env.scenarios, scenarios))  # ids lose the names inside them: pair by position
    locations = [(o, s) for o, s in pairs if s.category == Category.LOCATION]
    assert locations and all(s.answer == o.answer for o, s in locations)
    for original, s in pairs:
        named = [t for t in terms if t in original.question]
        assert all(t in s.question for t in named), (original.question, s.question)
    people = [(o, s) for o, s in pairs if s.category == Category.PERSON]
    assert people and all(s.answer != o.answer for o, s in people)
