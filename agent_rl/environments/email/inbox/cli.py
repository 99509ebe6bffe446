"""`agent-rl inbox ...`: build the demo inbox, ingest a real mailbox export, search an inbox."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer

from agent_rl.environments.email.inbox.ingest import IngestError, ingest
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.environments.email.inbox.store_interface import MAX_RESULTS

app = typer.Typer(help="The email inbox: build, ingest, search.", no_args_is_help=True)

DbOption = Annotated[
    Optional[str], typer.Option("--db", help="Store URL (sqlite:///PATH or postgresql://...); default AGENT_RL_STORE_URL or SQLite under AGENT_RL_HOME")
]


@app.command("build-demo")
def build_demo(db: DbOption = None, seed: Annotated[int, typer.Option(help="Generator seed")] = 0) -> None:
    """Generate the demo corpus (emails with known facts) into the store, and its scenarios."""
    from agent_rl.environments.email.scenarios.demo import build_demo_environment  # heavy imports stay lazy

    store = open_inbox_store(db)
    try:
        env = build_demo_environment(store, seed=seed)
        typer.echo(f"demo corpus (seed {seed}): {len(env.corpus.emails)} emails, {len(env.corpus.facts)} facts")
        typer.echo(f"store now holds {store.count()} emails in {len(store.inboxes())} inboxes")
        typer.echo(f"{len(env.scenarios)} scenarios written to {env.path}")
    finally:
        store.close()


@app.command("ingest")
def ingest_command(
    path: Annotated[Path, typer.Argument(help="Enron maildir folder, a .tar.gz of one, or the Kaggle CSV")],
    db: DbOption = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar")] = True,
) -> None:
    """Ingest a mailbox export; files that cannot be read or parsed, links and other non-regular files are
    listed with the reason and skipped."""
    store = open_inbox_store(db)
    try:
        report = ingest(path, store, progress=progress)
    except IngestError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    finally:
        store.close()
    typer.echo(
        f"seen {report.seen}, inserted {report.inserted}, duplicates {report.duplicates}, "
        f"skipped {len(report.skipped)}, inboxes {len(report.owners)}"
    )
    for file, reason in report.skipped:
        typer.echo(f"skipped {_printable(file)}: {_printable(reason)}")


def _printable(text: str) -> str:
    """Names come from the export (archive members, CSV cells): escape control characters so a name
    cannot rewrite the terminal or forge report lines."""
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)


@app.command("search")
def search_command(
    keywords: Annotated[list[str], typer.Argument(help="Words that must all appear")],
    inbox: Annotated[str, typer.Option("--inbox", help="Inbox address to search")],
    db: DbOption = None,
    sender: Annotated[Optional[str], typer.Option(help="Only emails from this address")] = None,
    sent_after: Annotated[Optional[datetime], typer.Option(help="Only emails sent at or after this date")] = None,
    sent_before: Annotated[Optional[datetime], typer.Option(help="Only emails sent before this date")] = None,
    max_results: Annotated[int, typer.Option(help=f"1..{MAX_RESULTS}")] = MAX_RESULTS,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of hits")] = False,
) -> None:
    """Search one inbox; best match first."""
    store = open_inbox_store(db)
    try:
        hits = store.search(inbox, keywords, sender, sent_after, sent_before, max_results)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps([hit.model_dump(mode="json") for hit in hits], ensure_ascii=False))
        return
    if not hits:
        typer.echo("no matching emails")
    for hit in hits:
        date = hit.date.isoformat() if hit.date else "undated"
        typer.echo(f"{hit.message_id}  {date}  {hit.sender}\n  {hit.subject}\n  {hit.snippet}")
