"""A reinforcement fine-tuning job as a team ran it at OpenAI, pointed at an arbiter: only the official openai SDK.

Uploads this folder's training and validation files, creates the job with its multi grader (grader.json), waits
for it, prints its events and asks the fine-tuned model one validation question through the gateway. Nothing but
`base_url` and `api_key` differs from the same script against OpenAI (and `model`: a base model we serve).

    python examples/openai_job/run_job.py --base-url http://127.0.0.1:8000/v1 --api-key ark_...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from openai import OpenAI

HERE = Path(__file__).resolve().parent
FINISHED = ("succeeded", "failed", "cancelled")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    parser.add_argument("--model", default="tiny", help="the base model to fine-tune (one the arbiter serves)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the job")
    args = parser.parse_args(argv)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)

    with open(HERE / "train.jsonl", "rb") as handle:
        training = client.files.create(file=handle, purpose="fine-tune")
    with open(HERE / "validation.jsonl", "rb") as handle:
        validation = client.files.create(file=handle, purpose="fine-tune")
    grader = json.loads((HERE / "grader.json").read_text())
    job = client.fine_tuning.jobs.create(
        model=args.model, training_file=training.id, validation_file=validation.id, suffix="email-answers",
        method={"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": {"n_epochs": 1}}},
    )
    print(f"created {job.id} ({job.status})", flush=True)

    deadline = time.monotonic() + args.timeout
    while job.status not in FINISHED and time.monotonic() < deadline:
        time.sleep(2)
        job = client.fine_tuning.jobs.retrieve(job.id)
    for event in reversed(list(client.fine_tuning.jobs.list_events(job.id, limit=100))):
        print(f"event: {event.message}", flush=True)
    if job.status != "succeeded":
        print(f"job {job.id} ended {job.status}: {job.error}", flush=True)
        return 1
    for checkpoint in client.fine_tuning.jobs.checkpoints.list(job.id):
        print(f"checkpoint at step {checkpoint.step_number}: {checkpoint.metrics}", flush=True)

    row = json.loads((HERE / "validation.jsonl").read_text().splitlines()[0])
    reply = client.chat.completions.create(model=job.fine_tuned_model, messages=row["messages"], max_tokens=32)
    print(f"{job.fine_tuned_model} answers: {reply.choices[0].message.content!r} "
          f"(reference: {row['reference_answer']!r})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
