"""The environment the agent acts in: the inbox store and the scenarios (questions with golden answers)."""


import hashlib
from collections import Counter

import dagster as dg
from pydantic import Field

from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
from agent_rl.environments.email.scenarios.demo import write_demo_scenarios
from agent_rl.records import Split
from resources.environment import EnvironmentResource
from resources.stores import InboxStoreResource


class CorpusConfig(dg.Config):
    """The demo corpus is generated from a seed, so scenarios can be regenerated without reading it back."""

    seed: int = Field(default=0, description="seed of the generated demo corpus")
    n_inboxes: int = Field(default=8, ge=1)
    n_emails: int = Field(default=4000, ge=10)
    ingest_path: str = Field(default="", description="ingest a real corpus (maildir, .tar.gz, CSV) instead")
    llm_base_url: str = Field(default="", description="OpenAI-compatible endpoint that writes scenarios for a real corpus")
    llm_model: str = Field(default="", description="model name at llm_base_url")
    llm_api_key_env: str = Field(default="OPENAI_API_KEY", description="variable holding the endpoint's API key")


@dg.asset(group_name="environment", description="Email inboxes the agent searches (demo corpus or ingested).")
def inbox(context: dg.AssetExecutionContext, config: CorpusConfig, inbox_store: InboxStoreResource,
          environment: EnvironmentResource):
    if not environment.is_email:
        return dg.MaterializeResult(metadata={"environment": environment.name,
                                              "inboxes": 0, "note": f"the {environment.name} environment has no inbox"})
    store = inbox_store.open()
    if config.ingest_path:
        from agent_rl.environments.email.inbox.ingest import ingest

        report = ingest(config.ingest_path, store, progress=False)
        meta = {"seen": report.seen, "inserted": report.inserted, "duplicates": report.duplicates,
                "skipped": len(report.skipped)}
    else:
        corpus = build_demo_corpus(store, seed=config.seed, n_inboxes=config.n_inboxes, n_emails=config.n_emails)
        meta = {"generated_emails": len(corpus.emails), "facts": len(corpus.facts)}
    per_inbox = {address: store.count(address) for address in store.inboxes()}
    table = "| inbox | emails |\n|---|---|\n" + "\n".join(f"| {a} | {n} |" for a, n in per_inbox.items())
    return dg.MaterializeResult(metadata={
        **meta,
        "store": inbox_store.resolved_url(),
        "inboxes": len(per_inbox),
        "emails": sum(per_inbox.values()),
        "per_inbox": dg.MetadataValue.md(table),
    })


@dg.asset(group_name="environment", deps=[inbox],
          description="Questions with golden answers and source emails, split train/test by fact.")
def scenarios(context: dg.AssetExecutionContext, config: CorpusConfig, inbox_store: InboxStoreResource,
              environment: EnvironmentResource):
    if not environment.is_email:
        return _plugin_tasks(environment)
    if config.ingest_path:
        items, path, digest, extra = _llm_scenarios(config, inbox_store)
    else:
        env = write_demo_scenarios(seed=config.seed, n_inboxes=config.n_inboxes, n_emails=config.n_emails)
        items, path, digest, extra = env.scenarios, env.path, env.content_hash, {}
    by_cat = Counter((s.category.value, s.split.value) for s in items)
    cats = sorted({c for c, _ in by_cat})
    table = "| category | train | test |\n|---|---|---|\n" + "\n".join(
        f"| {c} | {by_cat[(c, 'train')]} | {by_cat[(c, 'test')]} |" for c in cats)
    sample = "\n".join(f"- [{s.category.value}] {s.question} → {s.answer}" for s in items[:8])
    return dg.MaterializeResult(metadata={
        **extra,
        "path": str(path),
        "content_hash": str(digest),
        "scenarios": len(items),
        "train": sum(1 for s in items if s.split.value == "train"),
        "test": sum(1 for s in items if s.split.value == "test"),
        "per_category": dg.MetadataValue.md(table),
        "sample": dg.MetadataValue.md(sample),
    })


def _llm_scenarios(config: CorpusConfig, inbox_store: InboxStoreResource):
    """ART-E style generation for an ingested corpus: the fact-based generator only knows the demo corpus."""
    if not (config.llm_base_url and config.llm_model):
        raise dg.Failure("an ingested corpus needs an LLM endpoint to write scenarios: set llm_base_url and llm_model")
    from agent_rl.agent.chat_client import ChatEndpoint
    from agent_rl.environments.email.scenarios.demo import scenarios_path
    from agent_rl.environments.email.scenarios.generate import save_scenarios
    from agent_rl.environments.email.scenarios.llm_generator import LLMGeneratorConfig, generate_llm_scenarios

    store = inbox_store.open()
    emails = [email for address in store.inboxes() for email in store.iter_emails(address)]
    endpoint = ChatEndpoint(base_url=config.llm_base_url, model=config.llm_model, api_key_env=config.llm_api_key_env)
    items, report = generate_llm_scenarios(emails, LLMGeneratorConfig(endpoint=endpoint, seed=config.seed))
    if not items:
        raise dg.Failure(f"the LLM wrote no usable scenario: {report}")
    path = save_scenarios(items, scenarios_path())
    extra = {"generator": "llm", "llm_model": config.llm_model,
             "generation_report": dg.MetadataValue.json({
                 "batches": report.batches, "accepted": report.accepted, "failed_batches": report.failed_batches,
                 "dropped": {": ".join(map(str, k)) if isinstance(k, tuple) else str(k): n
                             for k, n in report.dropped.items()}})}
    return items, path, hashlib.sha256(path.read_bytes()).hexdigest(), extra


def _plugin_tasks(environment: EnvironmentResource) -> dg.MaterializeResult:
    """A plug-in brings its own tasks: what they are, per category and split (curation reads them from it)."""
    if environment.is_live:
        return dg.MaterializeResult(metadata={
            "environment": environment.name, "scenarios": 0,
            "note": "gateway episodes bring no tasks: validation replays held-out episodes users rated good"})
    envs = environment.loads()
    tasks = {(env.name, split): env.tasks(split) for env in envs for split in (Split.TRAIN, Split.TEST)}
    counts = Counter((env, t.category, split.value) for (env, split), items in tasks.items() for t in items)
    table = "| environment | category | train | test |\n|---|---|---|---|\n" + "\n".join(
        f"| {env.name} | {c} | {counts[(env.name, c, 'train')]} | {counts[(env.name, c, 'test')]} |"
        for env in envs for c in env.categories)
    split_total = {s: sum(len(v) for (_, split), v in tasks.items() if split == s) for s in (Split.TRAIN, Split.TEST)}
    return dg.MaterializeResult(metadata={
        "environment": ", ".join(env.name for env in envs), "scenarios": sum(split_total.values()),
        "train": split_total[Split.TRAIN], "test": split_total[Split.TEST],
        "tools": dg.MetadataValue.json({env.name: list(env.tool_names()) for env in envs} if len(envs) > 1
                                       else list(envs[0].tool_names())),
        "per_category": dg.MetadataValue.md(table),  # no sample prompts: a plug-in's tasks may hold personal data
    })
