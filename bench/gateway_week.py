"""The gateway demo's week of traffic alone: its simulated users talk to the outside agent through the arbiter's
gateway, and the episodes the gateway recorded come back with the hidden truth. No training.

`make demo ENV=gateway` spends most of its time training; to measure its labeler only the traffic is needed. This
runs exactly the demo's traffic step (demos/gateway.py: the outside program `examples/outside_agent.py`, its
mailbox, the arbiter as its own process serving the full profile's production, `api-sim:o3`, at the demo's gateway
rate), in a home of its own, and reads the week's episodes back from the pool as the export writes them
(`Episode.model_dump(mode="json")`). bench/labels.py `--world gateway` labels them as curation does.
6,000 users took ~140 s on 2 AMD EPYC cores shared with another job.
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def gateway_week(users: int, seed: int, noise: str = "default", rated_share: float = 0.05,
                 production: str = "api-sim:o3", home: Path | None = None,
                 concurrency: int = 8) -> tuple[list[dict[str, Any]], dict[str, bool], dict[str, Any]]:
    """(episode rows, episode id -> satisfied, the outside program's summary) of one week of the demo's users.
    The demo's defaults otherwise: backend error rate 0.05, no lower-cased re-asks, 128 tokens a reply. Without
    `home` the week runs in a temporary one, removed afterwards."""
    if home is None:
        with tempfile.TemporaryDirectory(prefix="labels-gateway-") as temporary:
            return gateway_week(users, seed, noise, rated_share, production, Path(temporary), concurrency)
    home = Path(home)
    os.environ.update(AGENT_RL_HOME=str(home), AGENT_RL_PROFILE="demo", AGENT_RL_ENV="gateway",
                      DAGSTER_HOME=str(home / "dagster"), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                      MLFLOW_TRACKING_URI="", AGENT_RL_POOL_URL="")
    (home / "dagster").mkdir(parents=True, exist_ok=True)
    from agent_rl import settings
    from agent_rl.arbiter.keys import ApiKey
    from agent_rl.arbiter.server import free_port
    from agent_rl.pool.repository import PoolRepository
    from demos import run as demo_run
    from demos.gateway import GATEWAY_RATE, OutsideAgent, read_truth, wait_for_episodes

    args = argparse.Namespace(seed=seed, rated_share=rated_share, noise=noise, backend_error_rate=0.05,
                              concurrency=concurrency, lowercase_share=0.0)
    token, key = ApiKey.create("mail-app", "mailpal", ["*"])
    outside = OutsideAgent(home / "outside-agent", token)
    outside.prepare()
    admin = secrets.token_urlsafe(16)
    serve = ("--env", "email", "--gateway-rate-per-s", str(GATEWAY_RATE))
    with demo_run.arbiter_process(free_port(), None, admin, extra_keys=(key,), extra_args=serve) as url:
        outside.url = url
        version = demo_run.production_version(production)
        demo_run.put_routing(url, admin, {version: 1.0}, {version: production}, reason="bench/labels.py")
        summary = outside.users(args, users, "week", progress=False)
        truth = read_truth(Path(summary["truth"]))
        pool = PoolRepository(settings.pool_url())
        missing = wait_for_episodes(pool, list(truth))
        if missing:
            raise RuntimeError(f"{missing} episodes not written by the gateway after 120 s")
        rows = [pool.get(episode_id).model_dump(mode="json") for episode_id in truth]
    return rows, {k: bool(v["satisfied"]) for k, v in truth.items()}, summary
