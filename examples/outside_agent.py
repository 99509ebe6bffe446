"""An outside team's mail assistant, on the official `openai` client, and a week of its simulated users.

This program is what `make demo ENV=gateway` runs as the agent that is not ours: a separate process that talks to
the arbiter's OpenAI-compatible gateway over HTTP with the `openai` package, as any team's agent would after
changing its base URL. The assistant answers questions about its user's mailbox: it declares three tools
(`search_emails`, `read_email`, `return_final_answer`), runs the calls the model sends back against its own
backend (a mailbox database it builds from the demo corpus generator, in its own folder, and queries with the
email tools' search and read functions), and sends the results back. The model behind the gateway is whatever
agent-rl routes to. A share of backend calls fails (`--backend-error-rate`, 5%): services do.

Its users are simulated (agent_rl/simulated_users/users.py): each asks a question about their mailbox whose right
answer only the simulation knows, reacts to the answer with the stated noise, sometimes goes on to ask about
something else in the same mailbox (`follow_up_candidates`), and a few percent rate it through the gateway's
feedback endpoint. Whether each user ended up satisfied (the hidden truth) is written to `--truth`,
keyed by episode id: the demo measures the labeler against it, the loop never sees it.

    python examples/outside_agent.py prepare --dir DIR
    OPENAI_API_KEY=<gateway key> python examples/outside_agent.py run --dir DIR --base-url http://127.0.0.1:8700/v1 \
        --users 2000 --truth truth.jsonl
The last line printed is a JSON summary. No question, answer or mailbox content is printed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

SYSTEM = ("You are MailPal, the assistant in our mail app. Answer the user's question about their mailbox: search "
          "with a few keywords, read the relevant emails, then call return_final_answer with a short answer and the "
          "ids of the emails it comes from. If the emails do not say, answer \"I don't know\".")

# The tools as this team declares them (JSON schemas, OpenAI's function-tool layout).
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "search_emails", "description": "Search the mailbox for emails that contain all the keywords.",
        "parameters": {"type": "object", "properties": {
            "keywords": {"type": "array", "items": {"type": "string"}, "description": "Words the email must contain."},
            "sender": {"type": "string", "description": "Only emails from this address."},
            "sent_after": {"type": "string", "description": "Only emails sent after this date, YYYY-MM-DD."},
            "sent_before": {"type": "string", "description": "Only emails sent before this date, YYYY-MM-DD."},
            "max_results": {"type": "integer", "description": "Most results to return, 1 to 10."}},
            "required": ["keywords"]}}},
    {"type": "function", "function": {
        "name": "read_email", "description": "Read one email in full.",
        "parameters": {"type": "object", "properties": {
            "message_id": {"type": "string", "description": "The id of the email, from search results."}},
            "required": ["message_id"]}}},
    {"type": "function", "function": {
        "name": "return_final_answer", "description": "Give the final answer to the user's question.",
        "parameters": {"type": "object", "properties": {
            "answer": {"type": "string", "description": "The answer, or \"I don't know\"."},
            "sources": {"type": "array", "items": {"type": "string"}, "description": "Ids of the emails used."}},
            "required": ["answer", "sources"]}}},
]
BACKEND_ERRORS = ('{"error": "mailbox service unavailable"}', "Error: search backend timed out",
                  '{"status": "error", "message": "internal error"}')


def intent(question: str) -> str:
    """The app's own tag for a question (sent as the gateway's `category`): by its question words."""
    q = question.lower()
    if any(w in q for w in ("how much", "cost", "price", "amount", "budget", "$")):
        return "amount"
    if q.startswith("when") or any(w in q for w in ("what date", "what day", "which day", "deadline")):
        return "date"
    if q.startswith(("who", "whom")) or "which person" in q:
        return "person"
    if q.startswith("where") or any(w in q for w in ("which city", "what city", "location")):
        return "location"
    if any(w in q for w in ("status", "approved", "cancel", "still", "did ", "has ", "is the ", "was the ")):
        return "status"
    return "other"


def follow_up_candidates(scenarios: list) -> list[list[int]]:
    """Per question, the ones its user may ask next: the same mailbox (the conversation's backend answers them), a
    fact of another category (another topic), asked no later than it (so the mailbox already held its answer on
    the day the conversation happens). Empty when the mailbox has none."""
    by_inbox: dict[str, list[int]] = {}
    for i, s in enumerate(scenarios):
        by_inbox.setdefault(s.inbox_id, []).append(i)
    return [[j for j in by_inbox[s.inbox_id] if scenarios[j].category != s.category
             and (s.query_date is None or scenarios[j].query_date is None or scenarios[j].query_date <= s.query_date)]
            for s in scenarios]


# -- the mailbox -------------------------------------------------------------------------------------

def prepare(folder: Path, seed: int) -> dict[str, Any]:
    """The app's mailbox database and its users' questions (with the right answers: the simulation's, never sent)."""
    from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.environments.email.scenarios.generate import generate_scenarios, save_scenarios

    folder.mkdir(parents=True, exist_ok=True)
    questions = folder / "questions.jsonl"
    if questions.exists() and (folder / "mailbox.db").exists():
        return {"mailbox": str(folder / "mailbox.db"), "questions": sum(1 for _ in questions.open())}
    store = open_inbox_store(f"sqlite:///{folder / 'mailbox.db'}")
    try:
        corpus = build_demo_corpus(store, seed=seed)
    finally:
        store.close()
    save_scenarios(generate_scenarios(corpus, seed=seed), questions)
    return {"mailbox": str(folder / "mailbox.db"), "questions": sum(1 for _ in questions.open())}


def public_terms(folder: Path) -> list[str]:
    """The names in the app's data that are never a person's (its company's sites, departments, cities): what its
    operators list in curation's `public_terms`, so an anonymizer that takes "Willow Bend" for a person leaves it."""
    from agent_rl.environments.email.inbox.demo_world import public_terms_of
    from agent_rl.environments.email.inbox.store import open_inbox_store

    store = open_inbox_store(f"sqlite:///{folder / 'mailbox.db'}")
    try:
        return sorted(public_terms_of(store.inboxes()))
    finally:
        store.close()


def app_id(message_id: str) -> str:
    """The app's own id for an email (its database's, not the Message-ID header, which names people's domains)."""
    return "m-" + hashlib.sha256(message_id.encode()).hexdigest()[:12]


def whole_words(text: str) -> str:
    """A snippet cut at word boundaries: the app shows no half word (a half address would be no address at all)."""
    text = str(text)
    for mark in ("…", "..."):
        if text.startswith(mark):
            rest = text[len(mark):]
            text = "… " + rest.split(" ", 1)[1] if " " in rest else "…"
        if text.endswith(mark):
            rest = text[: -len(mark)]
            text = rest.rsplit(" ", 1)[0] + " …" if " " in rest else "…"
    return text


class Mailbox:
    """The backend: each thread its own connection to the mailbox database; failures at `error_rate`. It shows
    emails under the app's own ids and search snippets cut at word boundaries."""

    def __init__(self, folder: Path, error_rate: float) -> None:
        if not (folder / "mailbox.db").exists():
            raise SystemExit(f"no mailbox in {folder}: run `python examples/outside_agent.py prepare --dir {folder}`")
        self.url = f"sqlite:///{folder / 'mailbox.db'}"
        self.error_rate = error_rate
        self._local = threading.local()
        self._stores: list[Any] = []
        self._lock = threading.Lock()
        self._ids: dict[str, str] = {}  # app id -> the mailbox's message id

    def _store(self):
        from agent_rl.environments.email.inbox.store import open_inbox_store

        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = open_inbox_store(self.url)
            with self._lock:
                self._stores.append(store)
        return store

    def backend(self, inbox: str, query_date: datetime | None, rng: random.Random):
        from agent_rl.environments.email.tools import call_tool, make_tools

        tools = make_tools(self._store(), inbox, query_date)

        def run(name: str, arguments: Any) -> str:
            if rng.random() < self.error_rate:
                return rng.choice(BACKEND_ERRORS)
            if name == "read_email" and isinstance(arguments, dict) and isinstance(arguments.get("message_id"), str):
                arguments = {**arguments, "message_id": self._ids.get(arguments["message_id"].strip(),
                                                                      arguments["message_id"])}
            return self._shown(call_tool(tools, name, arguments))
        return run

    def _shown(self, result: str) -> str:
        """A tool result with the app's ids (and whole-word snippets)."""
        try:
            value = json.loads(result)
        except ValueError:
            return result  # an error or "no emails match" text
        for item in value if isinstance(value, list) else [value] if isinstance(value, dict) else []:
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                shown = app_id(item["id"])
                with self._lock:
                    self._ids[shown] = item["id"]
                item["id"] = shown
            if isinstance(item, dict) and isinstance(item.get("snippet"), str):
                item["snippet"] = whole_words(item["snippet"])
            if isinstance(item, dict) and isinstance(item.get("body"), str) and item["body"].endswith(" [...]"):
                item["body"] = item["body"][: -len(" [...]")].rsplit(" ", 1)[0] + " [...]"
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    def close(self) -> None:
        for store in self._stores:
            store.close()


# -- a week of users ---------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> dict[str, Any]:
    from openai import OpenAI

    from agent_rl.environments.email.scenarios.generate import load_scenarios
    from agent_rl.simulated_users.outside_agent import ToolLoopAgent
    from agent_rl.simulated_users.population import NOISE_PRESETS
    from agent_rl.simulated_users.users import Question, UsersConfig, run_users
    from agent_rl.reward.judge import DeterministicJudge

    if args.noise not in NOISE_PRESETS:
        raise SystemExit(f"--noise {args.noise!r}: expected one of {', '.join(NOISE_PRESETS)}")
    if not os.environ.get("OPENAI_API_KEY"):
        raise SystemExit("OPENAI_API_KEY must hold the gateway's API key for this agent")
    folder = Path(args.dir)
    scenarios = [s for s in load_scenarios(folder / "questions.jsonl") if args.split in (None, s.split.value)]
    random.Random(args.seed).shuffle(scenarios)
    judge = DeterministicJudge()
    questions = [Question(s.question, (lambda s: lambda answer: judge.judge(s.question, s.answer, answer).correct)(s),
                          category=intent(s.question)) for s in scenarios]
    by_text = {id(q): s for q, s in zip(questions, scenarios)}
    candidates = follow_up_candidates(scenarios)
    mailbox = Mailbox(folder, args.backend_error_rate)
    client = OpenAI(base_url=args.base_url, max_retries=2, timeout=600)
    agent = ToolLoopAgent(client, TOOLS, final_tool="return_final_answer", max_tokens=args.max_tokens,
                          metadata={"context": args.context})
    config = UsersConfig(noise=NOISE_PRESETS[args.noise], rated_share=args.rated_share, seed=args.seed,
                         lowercase_share=args.lowercase_share)

    def opening(index: int, question) -> list[dict[str, Any]]:
        s = by_text[id(question)]
        day = (s.query_date or datetime.now(timezone.utc)).strftime("%A, %Y-%m-%d")
        return [{"role": "system", "content": SYSTEM},
                {"role": "system", "content": f"The user's mailbox is {s.inbox_id}. Today is {day}."},
                {"role": "user", "content": s.question}]

    def backend(index: int, question):
        s = by_text[id(question)]
        return mailbox.backend(s.inbox_id, s.query_date, random.Random(f"backend:{args.seed}:{index}"))

    def follow_up(index: int, question):
        others = candidates[index % len(questions)]  # run_users: user `index` asks questions[index % len]
        return questions[random.Random(f"follow-up:{args.seed}:{index}").choice(others)] if others else None

    step = max(1, args.users // 10)

    def progress(done: int) -> None:
        if done % step == 0 or done == args.users:
            print(f"  {done}/{args.users} users done", flush=True)

    try:
        week = run_users(agent, questions, opening, backend, config, args.users, concurrency=args.concurrency,
                         first_index=args.first_index, progress=progress, follow_ups=follow_up)
    finally:
        agent.close_http()
        client.close()
        mailbox.close()
    truth = Path(args.truth)
    truth.parent.mkdir(parents=True, exist_ok=True)
    with truth.open("w") as out:  # episode ids and the simulation's verdicts only: no text of the conversations
        for outcome in week.outcomes:
            out.write(json.dumps(outcome.to_json()) + "\n")
    return {**week.summary(), "users_config": config.describe(), "backend_error_rate": args.backend_error_rate,
            "truth": str(truth)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="build the app's mailbox and its users' questions")
    p.add_argument("--dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run", help="a week of simulated users talking to the agent through the gateway")
    r.add_argument("--dir", required=True)
    r.add_argument("--base-url", required=True, help="the gateway, e.g. http://127.0.0.1:8700/v1")
    r.add_argument("--users", type=int, required=True)
    r.add_argument("--truth", required=True, help="where to write each user's hidden satisfaction (JSONL)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--first-index", type=int, default=0, help="index of the first user (later rounds go on)")
    r.add_argument("--rated-share", type=float, default=0.05)
    r.add_argument("--noise", default="default", help="users' noise preset (agent_rl/simulated_users/population.py)")
    r.add_argument("--backend-error-rate", type=float, default=0.05)
    r.add_argument("--lowercase-share", type=float, default=0.3, help="share of re-asks users type in lower case")
    r.add_argument("--concurrency", type=int, default=8)
    r.add_argument("--max-tokens", type=int, default=256)
    r.add_argument("--split", default="train", help="which questions users ask: train, test, or all")
    r.add_argument("--context", default="mail-app", help="the gateway context the app declares")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        print(json.dumps({**prepare(Path(args.dir), args.seed), "public_terms": public_terms(Path(args.dir))}))
        return 0
    if args.split == "all":
        args.split = None
    if args.users < 0 or not all(0 <= v <= 1 for v in (args.rated_share, args.backend_error_rate,
                                                         args.lowercase_share)):
        parser.error("--users must be >= 0; --rated-share, --backend-error-rate and --lowercase-share in [0, 1]")
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
