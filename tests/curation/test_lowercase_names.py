"""Users who type in lower case (issue 47): a person, or a place taken for one, that the corpus names capitalised
somewhere is replaced in lower case too, with the same pseudonym; an ordinary word that spells a name stays; and the
independent leak check, run as curation runs it on gateway episodes, finds nothing left. Real Presidio."""

from __future__ import annotations

from agent_rl.privacy.anonymize import Anonymizer, AnonymizerConfig
from agent_rl.privacy.leak_check import LeakAuditor
from agent_rl.curation.plugin_privacy import anonymize_plugin_partition

QUESTION = "Who did Harold put in charge of the Willow Bend battery storage pilot?"
SIGNATURE = "Thanks,\nHarold Simmons\nDirector, Field Operations"


def _episode(episode_id: str, *user_texts: str, tool: str | None = None) -> dict:
    """A gateway episode as the pool stores it: the client's messages, nothing judged."""
    messages = [{"role": "system", "content": "You are MailPal, the assistant in our mail app."}]
    for i, text in enumerate(user_texts):
        messages.append({"role": "user", "content": text})
        if tool and i == 0:
            messages.append({"role": "tool", "tool_call_id": "call_0", "content": tool})
        messages.append({"role": "assistant", "content": "I don't know."})
    return {"episode_id": episode_id, "environment": "gateway", "context": "mail-app", "messages": messages,
            "final_answer": "I don't know.", "outcome": "unjudged"}


def _users(episode: dict) -> list[str]:
    return [m["content"] for m in episode["messages"] if m["role"] == "user"]


def test_a_name_known_capitalised_in_one_episode_gets_the_same_pseudonym_typed_in_lower_case_in_another():
    """One user asks with capitals; another re-asks all in lower case. "Willow Bend" is a site no one declared
    public, so it is taken for a person: whatever the capitalised form becomes, the lower-case form becomes too,
    and the leak check, which reads both, finds nothing."""
    episodes = [
        _episode("e1", QUESTION, tool=SIGNATURE),
        _episode("e2", "Where is the Treasury offsite?", QUESTION.lower(), "ok. ask harold simmons then, or simmons"),
    ]
    result = anonymize_plugin_partition(None, episodes, [], config=AnonymizerConfig(key="test-key"))
    capitalised = _users(result.episodes[0])[0]
    _, lowered, asked = _users(result.episodes[1])
    assert "Harold" not in capitalised and "Willow" not in capitalised and "Bend" not in capitalised
    assert lowered == capitalised.lower()  # same pseudonyms, word for word
    signed = next(m["content"] for m in result.episodes[0]["messages"] if m["role"] == "tool")
    full = signed.split("\n")[1]  # "Harold Simmons" as the anonymizer rendered it
    assert asked == f"ok. ask {full.lower()} then, or {full.split()[1].lower()}"
    assert [str(leak) for leak in result.leaks] == []


def test_a_declared_public_place_stays_in_lower_case_while_the_person_beside_it_goes():
    """With "Willow Bend" declared public (as the gateway demo's operators do) the site stays, capitalised or not."""
    config = AnonymizerConfig(key="test-key", public_terms=("Willow Bend",))
    episodes = [_episode("e1", QUESTION, tool=SIGNATURE), _episode("e2", QUESTION.lower(), "ask willow bend's manager")]
    result = anonymize_plugin_partition(None, episodes, [], config=config)
    capitalised = _users(result.episodes[0])[0]
    lowered, site = _users(result.episodes[1])
    assert "Willow Bend" in capitalised and "Harold" not in capitalised
    assert lowered == capitalised.lower() and "harold" not in lowered
    assert site == "ask willow bend's manager"
    assert [str(leak) for leak in result.leaks] == []


def test_ordinary_lower_case_words_that_spell_a_name_stay():
    """The rule: a name word found as a person elsewhere is replaced in lower case only if the corpus never writes
    it in lower case in text that capitalises something. "grace" of "grace period" and the verb "reading" are
    written so, and "will" is a common word: they stay, while the people named Grace Nakamura, Trevor Reading and
    Will Tran lose their other name words. A whole name typed in lower case is replaced as a whole when its last
    word is no ordinary word ("grace nakamura"), so "irene sent me the file" keeps "sent" where a signature ran
    "Irene" into "Sent from my iPhone"."""
    a = Anonymizer(AnonymizerConfig(key="test-key"))
    people = ["Grace Nakamura approved it. The grace period ends Friday.", "Please call Trevor Reading about the lease.",
              "I am reading the memo now.", "Will Tran signed it.", "Thanks,\nIrene\nSent from my iPhone",
              "I sent it to Irene Novak."]
    typed = ["is the grace period over? ask grace nakamura", "i am reading it. ask trevor reading",
             "i will ask will tran", "irene sent me the file"]
    out = a.anonymize_texts(people + typed)
    grace, trevor, _, will, _, irene = (o.split("\n")[-1] for o in out[:len(people)])
    grace_full, trevor_first = " ".join(grace.split()[:2]).lower(), trevor.split()[2].lower()
    assert out[len(people):] == [
        f"is the grace period over? ask {grace_full}",
        f"i am reading it. ask {trevor_first} reading",
        f"i will ask will {will.split()[1].lower()}",
        f"{irene.split()[-2].lower()} sent me the file",
    ]
    assert out[2] == "I am reading the memo now." and "Grace" not in grace and "Irene" not in irene


def test_the_leak_check_and_the_anonymizer_agree_on_names_typed_in_lower_case():
    """The auditor takes a lower-case full name it knows capitalised ("grace nakamura") for a person, and an
    ordinary word ("grace" of "grace period") for none: the anonymizer replaces the one and keeps the other, so the
    check finds the names in the raw messages and nothing in what curation writes."""
    raw = ["Grace Nakamura approved the Willow Bend budget. The grace period ends Friday.",
           "is the grace period over? ask grace nakamura about willow bend"]
    auditor = LeakAuditor(b"salt")
    for text in raw:
        auditor.learn_text(text)
    assert {f.masked for f in auditor.scan("raw", "1", {"content": raw[1]})} == {"g**** n*******", "w***** b***"}
    assert auditor.scan("raw", "1", {"content": "is the grace period over?"}) == []

    result = anonymize_plugin_partition(None, [_episode("e1", raw[0]), _episode("e2", raw[1])], [],
                                        config=AnonymizerConfig(key="test-key"))
    approved, typed = _users(result.episodes[0])[0], _users(result.episodes[1])[0]
    person, site = approved.split(" approved the ")[0], approved.split(" approved the ")[1].split(" budget")[0]
    assert typed == f"is the grace period over? ask {person.lower()} about {site.lower()}"
    assert [str(leak) for leak in result.leaks] == []


def test_the_leak_check_does_not_take_an_address_for_evidence_that_a_name_is_an_ordinary_word():
    """A first name the corpus writes in lower case only inside an address ("jaime.gualy@...") is still a name:
    the check finds "jaime" signed in lower case. A surname that is only a company's domain ("...@williams.com")
    is no finding, while the same word in prose is."""
    auditor = LeakAuditor(b"salt")
    auditor.learn_headers([{"message_id": "<1@x>", "sender": "Jaime Gualy <jaime.gualy@enron.com>",
                            "to": ["Eliza Williams <eliza.williams@enron.com>"]}])
    auditor.learn_text("The model is ready. Write to jaime.gualy@enron.com or see http://www.jaime.example/model")
    assert [f.masked for f in auditor.scan("out", "1", {"content": "Regards,\tjaime____"})] == ["j****"]
    assert auditor.scan("out", "1", {"to": ["lydia.graves@williams.com"]}) == []
    assert [f.masked for f in auditor.scan("out", "1", {"content": "ask williams"})] == ["w*******"]


def test_a_name_signed_in_lower_case_and_a_second_name_after_a_slash_are_replaced():
    """Two shapes the Enron sample holds: "Regards,\tjaime____" (a signature typed small, underlined) and a calendar
    entry "Donna/Sheila--Call Irene" (two people joined by a slash, which Notes paths use for org codes). Both
    names go; the org codes of a Notes path stay."""
    a = Anonymizer(AnonymizerConfig(key="test-key"))
    out = a.anonymize_texts(["So far, it looks promising.\n\tRegards,\tjaime____\n", "Donna/Sheila--Call Irene",
                             "Joseph P Hirl/HOU/ECT@ECT wrote", "thanks, will"])
    assert "jaime" not in out[0].lower() and out[0].endswith("____\n") and "Regards," in out[0]
    assert "Sheila" not in out[1] and "Donna" not in out[1] and out[1].count("/") == 1 and "--Call" in out[1]
    assert "/HOU/ECT@ECT wrote" in out[2] and "Hirl" not in out[2]
    assert out[3] == "thanks, will"  # an ordinary word after a closing stays


def test_a_message_id_a_model_garbled_is_no_address_and_the_names_in_an_id_are_still_found():
    """Our own model in production once wrote "<000022.9c9aa1\ufffdea@mail.northwind-energy.com>": the replacement
    character cut the id, and the check took "ea@mail.northwind-energy.com" for someone's address, which stopped
    the week at the privacy gate. Inside an id it is no address; a person's name inside an id still is a finding."""
    auditor = LeakAuditor(b"salt")
    auditor.learn_headers([{"message_id": "<1@x>", "sender": "Phillip Allen <phillip.allen@enron.com>"}])
    garbled = '{"message_id": "<000022.9c9aa1\ufffdea@mail.northwind-energy.com>"}'
    auditor.learn_text(garbled)
    assert auditor.scan("out", "1", {"arguments": garbled}) == []
    assert [f.masked for f in auditor.scan("out", "1", {"id": "<8069939.1075855675628.JavaMail.phillip@enron.com>"})
            ] == ["p******"]
    auditor.learn_text("write to ea@example.com")  # the same local part as a real address stays one
    assert [f.kind for f in auditor.scan("out", "1", {"content": "ea@example.com"})] == ["address"]


def test_a_name_a_tool_echoes_from_the_users_lower_case_search_is_still_replaced():
    """An agent searches with the words a careless user typed, and the tool echoes them in a sentence that
    capitalises ('No emails match ... "harold"'): that echo does not make the name an ordinary word, so it goes
    from the user's re-ask like from the first question."""
    echo = 'No emails match all of the keywords ["willow", "harold"].'
    episodes = [_episode("e1", QUESTION, tool=SIGNATURE),
                _episode("e2", QUESTION.lower(), "who did harold put in charge? i still need to know", tool=echo)]
    result = anonymize_plugin_partition(None, episodes, [], config=AnonymizerConfig(key="test-key"))
    texts = [m["content"] for m in result.episodes[1]["messages"] if m["role"] in ("user", "tool")]
    assert not any("harold" in text.lower() for text in texts), texts
    assert [str(leak) for leak in result.leaks] == []
