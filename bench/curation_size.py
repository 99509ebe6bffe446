"""Benchmark: does curation's privacy pass cost the same per kilobyte on a large episode as on a small one?

One gateway episode of each size (50 KB, 500 KB and 5 MB of text) is built from realistic mixed text: prose with
people's names, addresses, phone numbers, amounts and dates, search results as JSON tool results, tool calls with
JSON arguments, one long document a tool returned (a tenth of the episode, so a single text grows with the episode
too; spaCy takes no text over 1,000,000 characters, which curation's episode budget keeps from it), and an
attachment a mail tool returned as base64url, as Gmail's API does (a twentieth: one unbroken run of letters, digits,
"-" and "_", the input on which the old address pattern read a run again from each of its positions). Each goes
through the leak check alone (the independent auditor learning from the raw episode and scanning it) and through
the whole privacy pass curation runs on a gateway week (anonymize_plugin_partition: anonymizer, auditor, planted
canaries). The models load before anything is timed; the passes are called directly, so the 5 MB episode is read
although validation would quarantine it (over the 1,000,000-character budget).

A pass that is linear in its input costs the same per kilobyte at every size: the last line is a JSON report
with the cost per KB of each size, the ratio of the largest size's cost per KB to the smallest's, and
`meets_target` (that ratio at most TARGET_RATIO for both passes). Before the patterns were made linear
(agent_rl/privacy/patterns.py), a 200 KB episode took 211 s in the leak check's address pattern alone.

    nice -n 19 .venv/bin/python bench/curation_size.py [--sizes 50000,500000,5000000]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_RATIO = 1.2
SIZES = (50_000, 500_000, 5_000_000)
FIRST = ("Marguerite Donna Sherry Phillip Reba Jaime Harold Irene Gilbert Yolanda Tomasz Priya Kenji Amara Olusegun "
         "Ingrid Rafael Siobhan Dmitri Lucia Hamid Beatrix Cormac Elena Wendell Faustina Idris Margery Teodor Ximena")
LAST = ("Lowry Ortiz Allen Ostrowski Heinitz Nakamura Cannizzaro Okonkwo Lindqvist Fairbanks Abernathy Szymanski "
        "Delacroix Ramaswamy Castellanos Whitford Kowalczyk Brannigan Oyelaran Vasquez Haverford Pellegrini Mbeki")
ORGS = ("Northwind Energy", "Contoso Trading", "Fabrikam Logistics", "the Houston desk", "Tailspin Freight")
WORDS = ("the quarterly report forecast shipment contract pipeline capacity review draft figures schedule meeting "
         "invoice budget approval summary market price volume delivery storage terminal region team update").split()


def people(rng: random.Random) -> list[tuple[str, str]]:
    """(full name, address) of the people the texts talk about."""
    out = []
    for first in FIRST.split():
        for last in rng.sample(LAST.split(), 3):
            domain = rng.choice(["northwind-energy.com", "contoso.org", "mail.fabrikam.net"])
            out.append((f"{first} {last}", f"{first.lower()}.{last.lower()}@{domain}"))
    return out


def phone(rng: random.Random) -> str:
    return f"({rng.randrange(201, 990)}) {rng.randrange(201, 990)}-{rng.randrange(10000):04d}"


def sentence(rng: random.Random, crowd: list[tuple[str, str]]) -> str:
    (name, address), (other, _) = rng.choice(crowd), rng.choice(crowd)
    day = f"2001-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    filler = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(6, 14)))
    return rng.choice([
        f"Hi {name.split()[0]}, could you send {filler} to {address} before Friday?",
        f"{name} approved the ${rng.randrange(1, 900)},{rng.randrange(1000):03d} transfer for {rng.choice(ORGS)}.",
        f"Meeting with {name} and {other} about {filler} moved to {day}.",
        f"Please call {name} at {phone(rng)} about {filler}.",
        f"The {filler} from {rng.choice(ORGS)} is attached; invoice #{rng.randrange(10**5, 10**6)} is due next week.",
        f"{filler.capitalize()}, as {other} said on the call.",
    ])


def prose(rng: random.Random, crowd: list[tuple[str, str]], chars: int) -> str:
    lines: list[str] = []
    size = 0
    while size < chars:
        line = " ".join(sentence(rng, crowd) for _ in range(rng.randrange(1, 4)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def search_result(rng: random.Random, crowd: list[tuple[str, str]]) -> str:
    hits = [{"id": f"<{rng.randrange(10**6, 10**7)}.{rng.randrange(10**12, 10**13)}.JavaMail.evans@thyme>",
             "from": rng.choice(crowd)[1], "subject": " ".join(rng.choice(WORDS) for _ in range(4)).title(),
             "date": f"2001-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}", "snippet": sentence(rng, crowd)}
            for _ in range(rng.randrange(2, 6))]
    return json.dumps({"results": hits}, separators=(",", ":"))


def episode(chars: int, seed: int = 7) -> dict[str, Any]:
    """A gateway episode holding about `chars` characters of text: turns of search calls and results, prose
    answers, one long document (a tenth of the text) and one attachment in base64url (a twentieth)."""
    rng = random.Random(seed)
    crowd = people(rng)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are the mailbox assistant."},
                                      {"role": "user", "content": prose(rng, crowd, 300)}]
    size, turn = 0, 0
    document = prose(rng, crowd, chars // 10)
    attachment = json.dumps({"filename": "forecast.xlsx", "data": base64.urlsafe_b64encode(
        rng.randbytes(chars // 20 * 3 // 4)).decode().rstrip("=")})
    while size < chars - len(document) - len(attachment):
        turn += 1
        call = {"id": f"call_{turn}", "type": "function", "function": {
            "name": "search_inbox", "arguments": json.dumps({"query": sentence(rng, crowd)[:60], "limit": 5})}}
        result = search_result(rng, crowd)
        answer = prose(rng, crowd, rng.randrange(300, 1500))
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": result},
                     {"role": "assistant", "content": answer}, {"role": "user", "content": sentence(rng, crowd)}]
        size += len(call["function"]["arguments"]) + len(result) + len(answer) + len(messages[-1]["content"])
    messages += [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_doc", "type": "function",
                  "function": {"name": "read_document", "arguments": "{\"id\":\"doc-1\"}"}}]},
                 {"role": "tool", "tool_call_id": "call_doc", "content": document},
                 {"role": "assistant", "content": None, "tool_calls": [{"id": "call_att", "type": "function",
                  "function": {"name": "get_attachment", "arguments": "{\"id\":\"att-1\"}"}}]},
                 {"role": "tool", "tool_call_id": "call_att", "content": attachment},
                 {"role": "assistant", "content": prose(rng, crowd, 400)}]
    return {"episode_id": f"bench-{chars}", "environment": "gateway", "context": "gateway", "question": "Summarize.",
            "messages": messages, "final_answer": None, "feedback": "up"}


def text_chars(value: Any) -> int:
    from agent_rl.json_walk import strings

    return sum(len(text) for text in strings(value))


def leak_check(item: dict[str, Any]) -> None:
    """The auditor alone: learn what is personal from the raw episode, then scan it."""
    from agent_rl.privacy.leak_scan import episode_texts
    from agent_rl.privacy.audit import leak_auditor

    auditor = leak_auditor(b"bench-key")
    for text in episode_texts(item):
        auditor.learn_text(text)
    auditor.scan("episodes.jsonl", "line 1", item)


def privacy_pass(item: dict[str, Any]) -> None:
    """Curation's pass over a gateway week of one episode: anonymize, audit, with planted canaries."""
    from agent_rl.curation.plugin_privacy import anonymize_plugin_partition

    anonymize_plugin_partition(None, [item], [])


def timed(fn: Any, item: dict[str, Any]) -> float:
    started = time.perf_counter()
    fn(item)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="characters of text per episode")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    os.environ.setdefault("AGENT_RL_PSEUDONYM_KEY", "bench-curation-size")
    warm = episode(5_000, seed=1)  # loads spaCy, Presidio and the name lists before anything is timed
    leak_check(warm)
    privacy_pass(warm)
    rows: dict[str, dict[str, float]] = {}
    for size in sizes:
        item = episode(size)
        chars = text_chars(item)
        check_s, pass_s = timed(leak_check, item), timed(privacy_pass, item)
        rows[f"{size // 1000}KB"] = {"chars": chars, "leak_check_s": round(check_s, 3), "pass_s": round(pass_s, 3),
                                     "leak_check_ms_per_kb": round(1000 * check_s / (chars / 1000), 4),
                                     "pass_ms_per_kb": round(1000 * pass_s / (chars / 1000), 4)}
        print(f"{size // 1000} KB: {chars} chars, leak check {check_s:.2f} s, privacy pass {pass_s:.2f} s", flush=True)
    first, last = rows[next(iter(rows))], rows[list(rows)[-1]]
    ratios = {kind: round(last[f"{kind}_ms_per_kb"] / first[f"{kind}_ms_per_kb"], 3) for kind in ("leak_check", "pass")}
    print(json.dumps({"bench": "curation_size", "machine": f"{platform.machine()} {os.cpu_count()} cores",
                      "per_size": rows, "ratio_largest_smallest": ratios, "target_ratio": TARGET_RATIO,
                      "meets_target": all(r <= TARGET_RATIO for r in ratios.values())}))


if __name__ == "__main__":
    main()
