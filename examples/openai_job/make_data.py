"""Writes this example's fine-tuning files from the email world's demo corpus (ours, generated, no real people):
each row hands the model one email and asks a question the email answers, in OpenAI's reinforcement format, the
golden answer in `reference_answer` for the grader. Run from the repository root: python examples/openai_job/make_data.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.environments.email.scenarios.generate import generate_scenarios

HERE = Path(__file__).resolve().parent
INSTRUCTIONS = "Answer the question from the email. Reply with the answer only, as it is written in the email."


def rows(wanted: int = 80) -> list[dict]:
    out: list[dict] = []
    seed = 0
    while len(out) < wanted:
        seed += 1
        out += _rows(seed, wanted - len(out))
    return out


def _rows(seed: int, wanted: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        store = open_inbox_store(f"sqlite:///{folder}/inbox.db")
        corpus = build_demo_corpus(store, seed=seed, n_inboxes=2, n_emails=300)
        out: list[dict] = []
        for scenario in generate_scenarios(corpus, seed=seed):
            if not scenario.answerable or len(scenario.source_ids) != 1:
                continue
            email = store.read(scenario.inbox_id, scenario.source_ids[0])
            if email is None or scenario.answer.lower() not in email.body.lower():
                continue  # keep the questions one email answers in its own words
            prompt = f"Subject: {email.subject}\n\n{email.body}\n\nQuestion: {scenario.question}"
            out.append({"messages": [{"role": "developer", "content": INSTRUCTIONS},
                                     {"role": "user", "content": prompt}],
                        "reference_answer": scenario.answer, "category": scenario.category.value})
            if len(out) == wanted:
                break
        store.close()
    return out


def main() -> None:
    found = rows()
    split = len(found) * 3 // 4
    for name, part in (("train.jsonl", found[:split]), ("validation.jsonl", found[split:])):
        (HERE / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part))
    print(f"{split} training rows, {len(found) - split} validation rows")


if __name__ == "__main__":
    main()
