"""A real corpus through the environment assets: the shared Enron sample is ingested by `world`, and
`tasks` asks an OpenAI-compatible endpoint (a real local HTTP server) to write ART-E style questions."""

from __future__ import annotations

import json
import re

import dagster as dg

from agent_rl.environments.email.scenarios.demo import load_default_scenarios
from assets.environment import tasks, world
from resources.environment import EnvironmentResource
from resources.stores import WorldStoreResource
from tests.conftest import ENRON_CSV
from tests.openai_stub import openai_stub  # noqa: F401 (fixture)


def _questions(request) -> str:
    ids = re.findall(r"^Message-ID: (\S+)$", request["messages"][-1]["content"], flags=re.M)
    return json.dumps({"questions": [
        {"question": "Who sent the note about the meeting?", "answer": "Phillip Allen", "source_ids": [ids[0]],
         "category": "person", "realism": 0.8},
        {"question": "Which deal was it?", "answer": "unknown", "source_ids": ["not-in-this-batch"],
         "category": "status", "realism": 0.9},
    ]})


def _run(config: dict):
    return dg.materialize([world, tasks], resources={"world_store": WorldStoreResource(), "environment": EnvironmentResource()}, raise_on_error=False,
                          run_config={"ops": {"world": {"config": config}, "tasks": {"config": config}}})


def test_ingested_enron_sample_gets_llm_written_scenarios(openai_stub):
    openai_stub.script(_questions)
    result = _run({"ingest_path": str(ENRON_CSV), "llm_base_url": openai_stub.url, "llm_model": "writer",
                   "llm_api_key_env": "NO_SUCH_KEY"})
    assert result.success
    meta = result.asset_materializations_for_node("world")[0].metadata
    assert meta["inserted"].value == 103 and meta["skipped"].value == 0
    written = load_default_scenarios()
    assert written and all(s.source_ids and s.category.value == "person" for s in written)  # the bad citation was dropped
    report = result.asset_materializations_for_node("tasks")[0].metadata["generation_report"].value
    assert report["accepted"] == len(written) and report["batches"] == len(openai_stub.requests)


def test_ingested_corpus_without_an_endpoint_fails_clearly():
    result = _run({"ingest_path": str(ENRON_CSV)})
    assert not result.success
    failure = result.get_step_failure_events()[0].event_specific_data.error
    assert "needs an LLM endpoint" in failure.message
