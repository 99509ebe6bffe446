"""The weekly job on the gateway's live episodes: an agent that is no plug-in of ours (a calculator agent on the
official `openai` client, running its own tools) talks to the arbiter over loopback, its users send feedback, and
the Dagster job with the tiny model curates, anonymizes and trains on what they rated good. GRPO is skipped, said
so in the run, and the SFT model is what gets registered; validation replays the held-out rated-good episodes
against production's incumbent (the version the routing table serves)."""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
import httpx
import openai
import pytest

from agent_rl import settings
from agent_rl.curation.datasets import load_jsonl
from agent_rl.curation.live import GRPO_SKIPPED
from assets import curation, training, validation
from assets.partitions import weekly
from resources.compute import TrainingCompute
from resources.curation import CurationResource
from resources.environment import EnvironmentResource
from resources.evaluation import EvaluationResource
from resources.registry import MlflowResource
from resources.stores import PoolResource, WorldStoreResource
from resources.training import TrainingResource
from tests.arbiter.arbiter_fixtures import bearer
from tests.environments.test_plugin_job import JOB_ASSETS
from tests.arbiter.test_gateway import TOKEN_A, TOOLS, calculator, gateway, wait_for_episodes

CUSTOMER, EMAIL = "Maria Gonzalez", "maria.gonzalez@example.com"
OPERATIONS = {"add": "+", "multiply": "*", "subtract": "-"}


def run_calculator_agent(client: openai.OpenAI, question: str, category: str) -> str:
    """A production agent of the user's own: its system prompt names the customer, its tools run here."""
    messages: list[Any] = [{"role": "system", "content": f"You help {CUSTOMER} ({EMAIL}) with arithmetic."},
                           {"role": "user", "content": question}]
    episode = ""
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model="agent-rl", messages=messages, tools=TOOLS, temperature=0, max_tokens=64,
            metadata={"final_tool": "answer", "category": category})
        episode = raw.headers["x-agent-rl-episode"]
        message = raw.parse().choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        calls = message.tool_calls or []
        if not calls or any(call.function.name == "answer" for call in calls):
            break
        for call in calls:
            expression = json.loads(call.function.arguments)["expression"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculator(expression)})
    return episode


def verdict_for(i: int) -> str | None:
    return None if i % 9 == 4 else "down" if i % 9 == 7 else "up"


@pytest.mark.slow
def test_the_weekly_job_on_gateway_episodes_skips_grpo_and_registers_the_sft_model(tmp_path):
    from agent_rl.agent.models import build_tiny_model

    pool_url = settings.pool_url()
    rated: dict[str, str | None] = {}
    with gateway(pool_url, {"calc": 1.0}, {"calc": "calc-bot"}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN_A, max_retries=0)
        for i in range(45):
            category = list(OPERATIONS)[i % 3]
            episode = run_calculator_agent(client, f"What is {i} {OPERATIONS[category]} 7?", category)
            verdict = verdict_for(i)
            if verdict is None:  # nobody rated it: it ends idle or at shutdown, and stays unjudged
                httpx.post(f"{url}/v1/episodes/{episode}/end", headers=bearer(TOKEN_A), timeout=30)
            else:  # feedback ends the episode and records the verdict
                reply = httpx.post(f"{url}/v1/feedback", headers=bearer(TOKEN_A), timeout=30,
                                   json={"episode_id": episode, "verdict": verdict})
                assert reply.status_code == 200, reply.text
            rated[episode] = verdict
        stored = wait_for_episodes(pool_url, 45)
    assert set(stored) == set(rated) and all(e.environment == "gateway" for e in stored.values())
    good = {e for e, v in rated.items() if v == "up"}

    tiny = str(build_tiny_model(tmp_path / "tiny"))
    resources = {
        "environment": EnvironmentResource(name="gateway"),
        "world_store": WorldStoreResource(), "pool": PoolResource(),
        "curation": CurationResource(min_points=30, min_categories=3, min_quality=0.8, cap_per_category=20),
        "training": TrainingResource(base_model=tiny, sft_overrides={"max_steps": 2, "save_steps": 2}),
        "compute": TrainingCompute(),
        "mlflow": MlflowResource(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", model_name="agent-rl-gateway"),
        "evaluation": EvaluationResource(max_tasks=20, gate="open", max_forgetting_drop=1.0),
    }
    checks = [curation.enough_points, curation.clean_ratio, curation.category_diversity, curation.no_pii_leak,
              training.no_reward_hacking, validation.beats_champion, validation.no_forgetting,
              validation.reward_hacking_passed]
    partition = weekly.get_partition_keys()[-1]
    result = dg.materialize(JOB_ASSETS + checks, partition_key=partition, resources=resources, raise_on_error=False)
    failed_checks = {e.check_name: (e.description, {k: v.value for k, v in e.metadata.items()})
                     for e in result.get_asset_check_evaluations() if not e.passed}  # leak examples come masked
    assert result.success, ([e.step_key for e in result.get_step_failure_events()], failed_checks)

    # Every episode is clean; users' feedback is the outcome, and only the rated-good ones train.
    validated = load_jsonl(settings.artifact_dir("validated_episodes", partition) / "episodes.jsonl")
    assert len(validated) == 45
    outcomes = {row["episode_id"]: row["outcome"] for row in validated}
    assert {e for e, o in outcomes.items() if o == "correct"} == good
    assert all(outcomes[e] == "unjudged" for e, v in rated.items() if v is None)
    assert all(outcomes[e] == "wrong" for e, v in rated.items() if v == "down")
    held_out = curation.held_out_live(partition)
    assert held_out and {row["episode_id"] for row in held_out} <= good
    sft_rows = load_jsonl(settings.artifact_dir("sft_dataset", partition) / "train.jsonl")
    assert len(sft_rows) == len(good) - len(held_out)
    assert all(row["tools"] == TOOLS for row in sft_rows)  # the tools the client declared

    # GRPO is skipped, said so in the run, and the SFT model is the one validated and registered.
    grpo_meta = result.asset_materializations_for_node("grpo_adapter")[0].metadata
    assert grpo_meta["skipped"].value == GRPO_SKIPPED
    assert not (settings.artifact_dir("grpo_adapter", partition) / "adapter").exists()
    report = json.loads((settings.artifact_dir("evaluation_report", partition) / "report.json").read_text())
    assert report["choice"]["candidate"] == "sft" and "GRPO skipped" in report["choice"]["reason"]
    assert set(report["metrics"]) == {"candidate", "sft", "incumbent"}
    assert report["incumbent"]["version"] == "calc" and "replay" in report["measure"]
    # The incumbent took every approved action it took in production: replay measures it the same way.
    assert report["metrics"]["incumbent"]["accuracy"] == 1.0
    assert report["metrics"]["sft"]["n"] == len(held_out)
    registered = result.asset_materializations_for_node("registered_model")[0].metadata
    assert registered["trained_with"].value == "SFT alone" and registered["model"].value == "agent-rl-gateway"
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations["no_reward_hacking"].passed and evaluations["no_pii_leak"].passed
    assert "GRPO skipped" in evaluations["no_reward_hacking"].description

    # The customer named in the agent's prompt reaches nothing curation, training or validation wrote.
    written = "\n".join(path.read_text(errors="replace") for stage in (
        "anonymized_episodes", "anonymized_environment", "balanced_episodes", "sft_dataset", "evaluation_report")
        for path in settings.artifact_dir(stage, partition).rglob("*.json*"))
    assert written and CUSTOMER not in written and EMAIL not in written and "Gonzalez" not in written
