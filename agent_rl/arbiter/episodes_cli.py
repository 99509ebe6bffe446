"""`agent-rl episodes list|show`: read your own recorded episodes from a running arbiter.

A client of `GET /v1/episodes` (episode_routes.py) with your API key, so it shows exactly what the key may see
(its tenant, its contexts) and needs no access to the pool's database. The token is read from an environment
variable, never from the command line (where shell history and process lists would keep it).
"""

from __future__ import annotations

import json
import os
from urllib.parse import quote
from typing import Annotated, Any, Optional

import httpx
import typer

app = typer.Typer(no_args_is_help=True)

DEFAULT_URL = "http://127.0.0.1:8700"
KEY_ENV = "AGENT_RL_API_KEY"

UrlOption = Annotated[str, typer.Option(help="the arbiter's base URL")]
KeyEnvOption = Annotated[str, typer.Option(help="environment variable holding your API key")]


def _get(url: str, key_env: str, path: str, params: dict[str, Any] | None = None) -> Any:
    token = os.environ.get(key_env, "").strip()
    if not token:
        raise typer.BadParameter(f"set {key_env} to your arbiter API key", param_hint="--key-env")
    try:
        response = httpx.get(url.rstrip("/") + path, params=params, headers={"Authorization": f"Bearer {token}"},
                             timeout=30)
    except httpx.HTTPError as exc:
        typer.echo(f"error: cannot reach the arbiter at {url}: {type(exc).__name__}", err=True)
        raise typer.Exit(1) from exc
    if response.status_code != 200:
        try:
            body = response.json()
            message = (body.get("error") or {}).get("message") if isinstance(body.get("error"), dict) else body.get("detail")
        except ValueError:
            message = None
        typer.echo(f"error: {response.status_code} {message or response.reason_phrase}", err=True)
        raise typer.Exit(1)
    return response.json()


@app.command("list")
def list_command(
    url: UrlOption = DEFAULT_URL,
    key_env: KeyEnvOption = KEY_ENV,
    limit: Annotated[int, typer.Option(min=1, max=200, help="episodes per page")] = 20,
    context: Annotated[Optional[str], typer.Option(help="only this context")] = None,
    cursor: Annotated[Optional[str], typer.Option(help="the next page: the cursor a previous page printed")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the response as JSON")] = False,
) -> None:
    """Your newest episodes first: id, time, version, outcome, feedback, question."""
    params = {"limit": limit, **({"context": context} if context else {}), **({"cursor": cursor} if cursor else {})}
    page = _get(url, key_env, "/v1/episodes", params)
    if as_json:
        typer.echo(json.dumps(page, indent=2, ensure_ascii=False))
        return
    for row in page["data"]:
        question = " ".join(str(row["question"]).split())
        typer.echo(f"{row['episode_id']}  {row['created_at'][:19]}  {row['policy_version']:<20}  "
                   f"{row['outcome']:<9} {row['feedback'] or '-':<6} {question[:60]}")
    if not page["data"]:
        typer.echo("no episodes")
    if page.get("next_cursor"):
        typer.echo(f"more: --cursor '{page['next_cursor']}'")


@app.command("show")
def show_command(
    episode_id: Annotated[str, typer.Argument(help="the episode id (the X-Agent-RL-Episode header)")],
    url: UrlOption = DEFAULT_URL,
    key_env: KeyEnvOption = KEY_ENV,
) -> None:
    """One of your episodes in full, transcript included, as JSON."""
    typer.echo(json.dumps(_get(url, key_env, f"/v1/episodes/{quote(episode_id, safe='')}"), indent=2, ensure_ascii=False))
