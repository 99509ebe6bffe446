"""Issue 3 end to end: two policy versions at 90/10 behind a live arbiter, scenarios replayed over HTTP."""

from __future__ import annotations

import asyncio
import json

import pytest
import typer
from typer.testing import CliRunner

from agent_rl.arbiter.cli import app as arbiter_app
from agent_rl.arbiter.cli import traffic_app
from agent_rl.arbiter.replay import replay, select_tasks
from arbiter_fixtures import API_TOKEN, arbiter, demo_world, start_arbiter  # noqa: F401  (pytest fixtures)

ADMIN_TOKEN = "s3cret-admin-token-4f1c9a"  # set as AGENT_RL_ADMIN_TOKEN by the tests that need it


def _set_split(arbiter, specs: dict[str, str], weights: dict[str, float]) -> None:
    response = arbiter.client.put(
        "/v1/routing",
        json={"weights": weights, "specs": specs, "reason": "A/B 90/10", "actor": "test"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert response.status_code == 200, response.text


def _check_pool(arbiter, summary, n: int) -> dict[str, int]:
    assert summary.sent == summary.ok == n, summary.as_dict()
    assert arbiter.pool.count() == n  # every answered request is in the pool, nothing more
    for episode_id, version in summary.answered:
        assert arbiter.pool.get(episode_id).policy_version == version
    return arbiter.pool.count_by_version()


def test_ninety_ten_split_over_replayed_traffic(start_arbiter, demo_world, store_url, monkeypatch):
    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    n = 500
    with start_arbiter(pool_url=store_url) as arbiter:
        _set_split(
            arbiter,
            specs={"champion": "heuristic", "challenger": 'heuristic:{"wrong_rate": 0.3, "seed": 1}'},
            weights={"champion": 0.9, "challenger": 0.1},
        )
        scenarios = select_tasks(demo_world.scenarios, "train", n)
        summary = asyncio.run(replay(arbiter.url, scenarios, concurrency=8, api_key=API_TOKEN))
        counts = _check_pool(arbiter, summary, n)
    assert counts == summary.per_version
    assert set(counts) == {"champion", "challenger"}
    assert 0.06 <= counts["challenger"] / n <= 0.14
    # The challenger answers wrong on purpose 30% of the time: the pool shows it.
    judged = arbiter.pool.export(limit=n).episodes
    accuracy = {
        v: sum(e.outcome == "correct" for e in judged if e.policy_version == v) / counts[v] for v in counts
    }
    assert accuracy["challenger"] < accuracy["champion"]


def test_traffic_replay_cli_prints_a_summary(start_arbiter, demo_world, monkeypatch):
    root = typer.Typer()
    root.add_typer(arbiter_app, name="arbiter")
    root.add_typer(traffic_app, name="traffic")
    monkeypatch.delenv("AGENT_RL_API_KEY", raising=False)
    with start_arbiter() as arbiter:
        command = ["traffic", "replay", "--url", arbiter.url, "--split", "test", "--n", "40", "--concurrency", "4",
                   "--tasks", str(demo_world.scenarios_path), "--json"]
        keyless = CliRunner().invoke(root, command)
        assert keyless.exit_code == 2 and "AGENT_RL_API_KEY" in keyless.output
        result = CliRunner().invoke(root, command, env={"AGENT_RL_API_KEY": API_TOKEN})
        assert result.exit_code == 0, result.output
        summary = json.loads(result.output.strip().splitlines()[-1])
        assert summary["sent"] == summary["ok"] == 40
        assert summary["per_version"] == {"heuristic": 40}
        assert arbiter.pool.count() == 40
    bad = CliRunner().invoke(root, ["traffic", "replay", "--url", "http://127.0.0.1:9", "--split", "validation",
                                    "--scenarios", str(demo_world.scenarios_path)])
    assert bad.exit_code != 0 and "train or test" in bad.output


@pytest.mark.slow
def test_tiny_local_policy_takes_ten_percent(start_arbiter, demo_world, monkeypatch):
    from agent_rl.agent.models import build_tiny_model

    monkeypatch.setenv("AGENT_RL_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tiny = build_tiny_model()
    n = 120
    with start_arbiter(batch_window_ms=20, runner={"max_turns": 2, "max_new_tokens": 16}) as arbiter:
        _set_split(
            arbiter,
            specs={"heuristic": "heuristic", "tiny": str(tiny)},
            weights={"heuristic": 0.9, "tiny": 0.1},
        )
        summary = asyncio.run(replay(arbiter.url, select_tasks(demo_world.scenarios, "test", n), concurrency=8,
                                     api_key=API_TOKEN))
        counts = _check_pool(arbiter, summary, n)
    assert set(counts) == {"heuristic", "tiny"}
    assert 0.03 <= counts["tiny"] / n <= 0.2
