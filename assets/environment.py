"""The environment the agent acts in: its world (`world`: the email assistant's mail store, nothing for a plug-in
whose world comes with it) and its tasks (`tasks`: questions with golden answers). Both ask the environment
(`World.build`, `World.build_tasks`). Until 2026-12 the two assets were named `inbox` and `scenarios`, the email
assistant's words: a run configuration saved before then names its ops so (`ops: {inbox: ..., scenarios: ...}`)
and reads `ops: {world: ..., tasks: ...}` now, and their `n_inboxes` and `n_emails` are `contexts` and
`documents`; the environment's own store and files kept their places."""


from collections import Counter

import dagster as dg
from pydantic import Field

from agent_rl.curation.live import NO_TASKS, NO_WORLD
from agent_rl.records import Split
from resources.environment import EnvironmentResource
from resources.stores import WorldStoreResource


class CorpusConfig(dg.Config):
    """The world's settings, passed to the environment's world (`World.build`, `World.build_tasks`) (each takes what it uses:
    the email assistant all of them, a plug-in whose world comes with it none). The demo corpus is generated from
    a seed, so its tasks can be regenerated without reading it back."""

    seed: int = Field(default=0, description="seed of the generated demo corpus")
    contexts: int = Field(default=8, ge=1, description="contexts a generated world holds (the email assistant's "
                                                       "mailboxes)")
    documents: int = Field(default=4000, ge=10, description="documents a generated world holds in all (the email "
                                                             "assistant's emails)")
    ingest_path: str = Field(default="", description="ingest a real corpus (maildir, .tar.gz, CSV) instead")
    llm_base_url: str = Field(default="", description="OpenAI-compatible endpoint that writes the tasks for a real corpus")
    llm_model: str = Field(default="", description="model name at llm_base_url")
    llm_api_key_env: str = Field(default="OPENAI_API_KEY", description="variable holding the endpoint's API key")


def _metadata(value):
    """An environment's report value as Dagster metadata: tables (markdown text) and JSON kept apart."""
    if isinstance(value, (dict, list)):
        return dg.MetadataValue.json(value)
    if isinstance(value, str) and "\n" in value:
        return dg.MetadataValue.md(value)
    return value


def _built(environment: EnvironmentResource, world_store: WorldStoreResource, build: str, config: CorpusConfig):
    """Each environment's `build` step with the run's options, merged; the environments, closed."""
    envs = environment.loads(store_url=world_store.resolved_url())
    meta: dict = {}
    try:
        for env in envs:
            try:
                meta.update(getattr(env.world(), build)(**config.model_dump()))
            except ValueError as exc:  # the options cannot build this world: say so, not a stack trace
                raise dg.Failure(f"environment {env.name!r}: {exc}") from exc
    finally:
        for env in envs:
            env.close()
    return envs, {key: _metadata(value) for key, value in meta.items()}


@dg.asset(group_name="environment", description="The world the agent acts in, built by the environment (the email "
                                                 "assistant: its mail store, demo corpus or ingested).")
def world(context: dg.AssetExecutionContext, config: CorpusConfig, world_store: WorldStoreResource,
          environment: EnvironmentResource):
    if not environment.capabilities.world:
        return dg.MaterializeResult(metadata={"environment": environment.name, "note": NO_WORLD})
    envs, meta = _built(environment, world_store, "build", config)
    if not meta:
        return dg.MaterializeResult(metadata={"environment": ", ".join(e.name for e in envs),
                                              "note": "the world comes with the environment: nothing to build"})
    return dg.MaterializeResult(metadata={**meta, "environment": ", ".join(e.name for e in envs),
                                          "store": world_store.resolved_url()})


@dg.asset(group_name="environment", deps=[world],
          description="The environment's tasks: questions with golden answers (the email assistant's split "
                      "train/test by fact), written by the environment from its world.")
def tasks(context: dg.AssetExecutionContext, config: CorpusConfig, world_store: WorldStoreResource,
          environment: EnvironmentResource):
    if not environment.capabilities.world:
        return dg.MaterializeResult(metadata={"environment": environment.name, "tasks": 0, "note": NO_TASKS})
    _, meta = _built(environment, world_store, "build_tasks", config)
    envs = environment.loads(store_url=world_store.resolved_url())  # afresh: the tasks as written
    try:
        return dg.MaterializeResult(metadata={**_task_counts(envs), **meta})
    finally:
        for env in envs:
            env.close()


def _task_counts(envs: list) -> dict:
    """What the tasks are, per environment, category and split (curation reads them from the environment)."""
    tasks = {(env.name, split): env.tasks(split) for env in envs for split in (Split.TRAIN, Split.TEST)}
    counts = Counter((env, t.category, split.value) for (env, split), items in tasks.items() for t in items)
    table = "| environment | category | train | test |\n|---|---|---|---|\n" + "\n".join(
        f"| {env.name} | {c} | {counts[(env.name, c, 'train')]} | {counts[(env.name, c, 'test')]} |"
        for env in envs for c in env.categories)
    split_total = {s: sum(len(v) for (_, split), v in tasks.items() if split == s) for s in (Split.TRAIN, Split.TEST)}
    return {
        "environment": ", ".join(env.name for env in envs), "tasks": sum(split_total.values()),
        "train": split_total[Split.TRAIN], "test": split_total[Split.TEST],
        "tools": dg.MetadataValue.json({env.name: list(env.tool_names()) for env in envs} if len(envs) > 1
                                       else list(envs[0].tool_names())),
        # No sample prompts here: a plug-in's tasks may hold personal data (an environment may add its own).
        "per_category": dg.MetadataValue.md(table),
    }
