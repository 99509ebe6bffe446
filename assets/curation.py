"""Curation: gate the exported episodes on quality, anonymize them with the environment, balance, and
write the SFT and GRPO datasets. Failing gates are blocking checks, so training never sees bad data."""


import json
from collections import Counter
from dataclasses import asdict

import dagster as dg

from agent_rl.curation.balance import balance_episodes
from agent_rl.curation.datasets import load_jsonl, quality, save_jsonl, sft_rows
from agent_rl.curation.live import (
    FEEDBACK,
    GRPO_SKIPPED,
    LABELER,
    NO_WORLD_TO_ANONYMIZE,
    judge_by_feedback,
    label_unrated,
    live_validation_config,
    split_live,
)
from agent_rl.curation.plugin_privacy import anonymize_plugin_partition, merged_privacy_reports
from agent_rl.curation.tenant_agreement import check_week, summary
from agent_rl.curation.tenants import cap_tenant_share, share_table
from agent_rl.curation.week_labeler import freeze_week_labeler
from agent_rl.environments import worlds
from agent_rl.records import Split
from agent_rl.train.plugin_rollouts import training_rows
from agent_rl.curation.validate import config_for, gate_results, validate_episodes
from assets.environment import tasks, world
from assets.partitions import weekly
from assets.pool import pool_episodes
from assets.stages import (
    AnonymizedEnvironment,
    AnonymizedEpisodes,
    BalancedEpisodes,
    GrpoDataset,
    PoolExport,
    SftDataset,
    ValidatedEpisodes,
    stage_dir,  # noqa: F401 - pipelines/demo_gateway.py reads a stage's folder through assets.curation
)
from resources.curation import CurationResource
from resources.environment import EnvironmentResource
from resources.stores import PoolResource, WorldStoreResource


def _table(rows: list[dict], columns: list[str]) -> dg.MetadataValue:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    return dg.MetadataValue.md("\n".join(lines))


# -- validated_episodes -------------------------------------------------------------------------

@dg.asset(group_name="curation", partitions_def=weekly, deps=[pool_episodes],
          description="Episodes that pass the Great Expectations suite; the rest go to quarantine with reasons.")
def validated_episodes(context: dg.AssetExecutionContext, pool: PoolResource, environment: EnvironmentResource,
                       curation: CurationResource):
    partition = context.partition_key
    rows = load_jsonl(PoolExport(partition).episodes)
    # The email assistant keeps its rubric's expectations; a plug-in is checked against what it declares; the
    # gateway's live episodes against what their clients declared, judged by their users' feedback. The export
    # holds this run's environments only: other agents' episodes in the pool wait for their own runs.
    labeler, labeler_config, agreement = None, curation.labeler(), None
    # What the diversity gate may ask of this run (gate_results); users' traffic has whatever categories clients send.
    if environment.capabilities.judged_by_users:
        rows = [judge_by_feedback(row) for row in rows]
        # A tenant whose ratings disagree with the evidence it does not control loses them before any labeler fits
        # (curation/tenant_agreement.py); the other tenants' week goes on.
        rows, agreement = check_week(rows, curation.tenant_agreement(),
                                     distrust_flagged=curation.distrust_disagreeing_tenants)
        if labeler_config is not None:
            unlabeled = rows
            rows, labeler = label_unrated(rows, labeler_config)
            _keep_labeler_for_ab_test(context, unlabeled, labeler_config, labeler, partition)
        config, declared = live_validation_config(rows, max_episode_chars=curation.max_episode_chars), None
    else:
        config = config_for(environment.loads(), max_episode_chars=curation.max_episode_chars)
        declared = len(config.categories)
    result = validate_episodes(rows, config)
    if result.quarantined:
        pool.open().quarantine(result.quarantined, partition=partition)
    out = ValidatedEpisodes(partition)
    digest = save_jsonl(result.clean, out.episodes)
    report = {k: v for k, v in result.report.items() if isinstance(v, (int, float, str, dict, list))}
    report.update(count_in=len(rows), clean=len(result.clean), declared_categories=declared,
                  category_names=sorted({r["task_category"] for r in result.clean if r.get("task_category")}))
    if labeler is not None:
        report["labeler"] = asdict(labeler)
    if agreement is not None:
        report["tenant_agreement"] = agreement
    out.report.write_text(json.dumps(report, default=str, indent=1))
    reasons = Counter(reason.split(":")[0] for _, rs in result.quarantined for reason in rs)
    per_environment = Counter((str(r.get("environment")), str(r.get("task_category"))) for r in result.clean)
    return dg.MaterializeResult(metadata={
        "per_environment": _table([{"environment": e, "category": c, "clean": n}
                                   for (e, c), n in sorted(per_environment.items())],
                                  ["environment", "category", "clean"]),
        "count_in": len(rows), "clean": len(result.clean), "quarantined": len(result.quarantined),
        "clean_ratio": round(len(result.clean) / len(rows), 4) if rows else 0.0,
        "quarantine_reasons": dg.MetadataValue.json(dict(reasons)),
        "content_hash": digest,
        **_labeler_metadata(labeler, result.clean),
        **({"tenant_agreement": _table(agreement["table"], AGREEMENT_COLUMNS)} if agreement else {}),
    })


AGREEMENT_COLUMNS = ["tenant", "rated", "up", "up_elsewhere", "status", "effect", "p", "evidence", "reason"]


def _keep_labeler_for_ab_test(context: dg.AssetExecutionContext, rows: list[dict], config, report,
                              partition: str) -> None:
    """The week's labeler, kept for the A/B test of the challenger this week trains (agent_rl/feedback/frozen.py);
    curation's rows and report stay as label_unrated left them."""
    frozen = freeze_week_labeler(rows, config, report, week=partition)
    if frozen is None:
        context.log.info("labeler not kept for the A/B test: a model judge's labeler is not frozen (ratings alone)")
        return
    folder = frozen.save(ValidatedEpisodes(partition).labeler_copy)
    context.log.info(f"labeler kept for the A/B test in {folder} "
                     f"({'passed its check' if frozen.passed else 'failed its check: ' + frozen.reason})")


def _labeler_metadata(labeler, clean: list[dict]) -> dict:
    """What the labeler did to a gateway week: where its training rows come from, and how far to trust the labels."""
    if labeler is None:
        return {}
    labeled = sum(1 for r in clean if LABELER in (r.get("reward_components") or {}))
    rated = sum(1 for r in clean if FEEDBACK in (r.get("reward_components") or {}))
    return {"rated_episodes": rated, "labeled_episodes": labeled,
            "labeler_auc": round(labeler.auc, 4) if labeler.auc is not None else "n/a",
            "labeler_ece": round(labeler.ece, 4) if labeler.ece is not None else "n/a",
            "labeler": "labels used" if labeler.passed else f"ratings alone: {labeler.reason}"}


def _gate_check(context: dg.AssetCheckExecutionContext, curation: CurationResource, name: str):
    report = json.loads(ValidatedEpisodes(context.partition_key).report.read_text())
    declared = report.get("declared_categories")
    gates = gate_results(report["count_in"], report["clean"], set(report["category_names"]), curation.gates(),
                         declared_categories=declared)
    gate = next(g for g in gates if g.name == name)
    return dg.AssetCheckResult(passed=gate.passed, description=gate.message,
                               metadata={"observed": gate.observed, "required": gate.required,
                                         "declared_categories": declared if declared is not None else "n/a"})


@dg.asset_check(asset=validated_episodes, blocking=True, description="At least `min_points` clean episodes.")
def enough_points(context: dg.AssetCheckExecutionContext, curation: CurationResource):
    return _gate_check(context, curation, "volume")


@dg.asset_check(asset=validated_episodes, blocking=True, description="At least `min_clean_ratio` of the export is clean.")
def clean_ratio(context: dg.AssetCheckExecutionContext, curation: CurationResource):
    return _gate_check(context, curation, "clean_ratio")


@dg.asset_check(asset=validated_episodes, blocking=True,
                description="At least `min_categories` task categories (all of them when the environment declares fewer).")
def category_diversity(context: dg.AssetCheckExecutionContext, curation: CurationResource):
    return _gate_check(context, curation, "diversity")


@dg.asset_check(asset=validated_episodes, blocking=True,
                description="Labels of gateway episodes nobody rated reach training only from a labeler whose "
                            "out-of-fold AUC and calibration error on the rated ones meet the profile's bars; below "
                            "them the week trains on ratings alone and says so.")
def labeler_agreement(context: dg.AssetCheckExecutionContext):
    out = ValidatedEpisodes(context.partition_key)
    labeler = json.loads(out.report.read_text()).get("labeler")
    if labeler is None:
        return dg.AssetCheckResult(passed=True, description="no labeler ran: every episode is judged by its "
                                   "environment or by its users' feedback")
    labeled = sum(1 for row in load_jsonl(out.episodes) if LABELER in (row.get("reward_components") or {}))
    passed = labeler["passed"] or labeled == 0
    description = (f"labels used: {labeled} episodes labeled (AUC {labeler['auc']:.3f}, ECE {labeler['ece']:.3f})"
                   if labeler["passed"] else f"ratings alone: {labeler['reason']}" if passed else
                   f"{labeled} labeled episodes from a labeler that failed its check ({labeler['reason']})")
    return dg.AssetCheckResult(passed=passed, description=description, metadata={
        key: value if value is not None else "n/a"
        for key, value in labeler.items() if key in ("auc", "ece", "ece_floor", "ece_excess", "n_rated", "n_unrated",
                                                     "n_labeled", "min_auc", "max_ece", "reason",
                                                     "judge_calls")})


@dg.asset_check(asset=validated_episodes, blocking=False,
                description="Each tenant's 'up' ratings of gateway episodes agree with the evidence it does not "
                            "control (a labeler fitted on the other tenants' ratings, or the implicit signals); a "
                            "tenant that disagrees is named, and by default loses its ratings for the week. A "
                            "warning: it never stops the other tenants' week.")
def tenant_ratings_agree(context: dg.AssetCheckExecutionContext):
    report = json.loads(ValidatedEpisodes(context.partition_key).report.read_text())
    agreement = report.get("tenant_agreement")
    if agreement is None:
        return dg.AssetCheckResult(passed=True, description="no users' ratings: episodes are judged by their "
                                   "environment")
    return dg.AssetCheckResult(
        passed=not agreement["flagged"], severity=dg.AssetCheckSeverity.WARN, description=summary(agreement),
        metadata={"flagged": dg.MetadataValue.json(agreement["flagged"]),
                  "ratings_dropped": agreement["ratings_dropped"],
                  "per_tenant": _table(agreement["table"], AGREEMENT_COLUMNS)})


# -- anonymized_episodes + anonymized_environment ----------------------------------------------

@dg.multi_asset(
    group_name="curation", partitions_def=weekly,
    specs=[
        dg.AssetSpec("anonymized_episodes", group_name="curation", deps=[validated_episodes],
                     description="Clean episodes with every name, address, phone and card pseudonymized."),
        dg.AssetSpec("anonymized_environment", group_name="curation", deps=[world, tasks],
                     description="The world and its tasks under the same pseudonyms, for GRPO rollouts and evaluation."),
    ],
)
def anonymization(context: dg.AssetExecutionContext, world_store: WorldStoreResource, curation: CurationResource,
                  environment: EnvironmentResource):
    partition = context.partition_key
    episodes = load_jsonl(ValidatedEpisodes(partition).episodes)
    if environment.capabilities.judged_by_users:  # no world to anonymize; rated-good episodes held out
        yield from _anonymize_live(partition, environment.name, episodes, curation)
        return
    envs = environment.loads(store_url=world_store.resolved_url())
    try:
        # An environment whose world the loop cannot copy whole runs the pass itself and writes its world here (the
        # email assistant's mail store); it trains alone. Any other goes through the loop's pass below.
        own = (envs[0].world().anonymize(episodes, AnonymizedEnvironment(partition).folder, curation.canaries,
                                         curation.anonymizer()) if len(envs) == 1 else None)
        if own is None:
            yield from _anonymize_plugin(partition, episodes, envs, curation)
            return
        yield _anonymized_episodes(partition, own.episodes, own.report, own.leaks)
        yield dg.MaterializeResult(asset_key="anonymized_environment",
                                   metadata={"environment": envs[0].name, **own.world})
    finally:
        for env in envs:
            env.close()


def _anonymized_episodes(partition: str, episodes: list[dict], report: dict, leaks: list,
                         **extra) -> dg.MaterializeResult:
    """Write the anonymized episodes and the privacy report (leak examples masked) of a partition; their
    materialization, for the caller to yield once its environment files are written too."""
    out = AnonymizedEpisodes(partition)
    episodes_hash = save_jsonl(episodes, out.episodes)
    out.privacy_report.write_text(json.dumps(
        {**report, "leak_examples": [str(leak) for leak in leaks[:20]]}, default=str))
    summary = {k: v for k, v in report.items() if isinstance(v, (int, float))}
    return dg.MaterializeResult(asset_key="anonymized_episodes", metadata={
        "episodes": len(episodes), "content_hash": episodes_hash, **summary,
        "entities_by_type": dg.MetadataValue.json(report.get("entities", {})), **extra,
    })


def _anonymize_plugin(partition: str, episodes: list[dict], envs: list, curation: CurationResource):
    """Each plug-in's episodes, tasks and world under one set of pseudonyms (curation/plugin_privacy.py); with
    several plug-ins, one pass per environment, its world saved under its name."""
    results = []
    for env in envs:
        mine = [e for e in episodes if str(e.get("environment")) == env.name]
        tasks = env.tasks(Split.TRAIN) + env.tasks(Split.TEST)
        results.append(anonymize_plugin_partition(env, mine, tasks, canaries=curation.canaries,
                                                  config=curation.anonymizer()))
    episodes_result = _anonymized_episodes(
        partition, [e for r in results for e in r.episodes], merged_privacy_reports([r.report for r in results]),
        [leak for r in results for leak in r.leaks],
        per_environment=dg.MetadataValue.json({r.environment.name: len(r.episodes) for r in results}))
    anonymized = AnonymizedEnvironment(partition)
    tasks = [t for r in results for t in r.tasks]
    tasks_hash = save_jsonl([t.model_dump(mode="json") for t in tasks], anonymized.tasks)
    for r in results:
        worlds.save(r.environment, anonymized.world(r.environment.name))
    worlds.save_index([r.environment.name for r in results], anonymized.folder)
    yield episodes_result
    yield dg.MaterializeResult(asset_key="anonymized_environment", metadata={
        "environment": ", ".join(r.environment.name for r in results), "tasks": len(tasks), "tasks_hash": tasks_hash,
        "saved_environments": dg.MetadataValue.json([str(anonymized.world(r.environment.name))
                                                     for r in results]),
    })


SFT_SKIPPED = "no episode reaches quality {quality}: SFT is skipped, GRPO starts from the base model"


def _anonymize_live(partition: str, name: str, episodes: list[dict], curation: CurationResource):
    """The gateway's live episodes: no tasks and no world, the same Anonymizer and auditor over the episodes; the
    rated-good episodes held out for validation are written apart (curation/live.py)."""
    result = anonymize_plugin_partition(None, episodes, [], canaries=curation.canaries, config=curation.anonymizer(),
                                        name=name)
    episodes_result = _anonymized_episodes(partition, result.episodes, result.report, result.leaks)
    _, held_out = split_live(result.episodes)
    held_out, shares = cap_tenant_share(held_out, curation.max_tenant_share)  # no tenant sets most of the replay set
    held_out_hash = save_jsonl(held_out, AnonymizedEnvironment(partition).held_out)
    yield episodes_result
    per_tenant = {"per_tenant": _table(share_table(shares), ["tenant", "before", "after", "share"])} \
        if len(shares) > 1 else {}
    yield dg.MaterializeResult(asset_key="anonymized_environment", metadata={
        "environment": name, "held_out_episodes": len(held_out), "held_out_hash": held_out_hash,
        "note": NO_WORLD_TO_ANONYMIZE, **per_tenant,
    })


def held_out_live(partition: str) -> list[dict]:
    """The anonymized gateway episodes rated good that this partition keeps for validation."""
    return load_jsonl(AnonymizedEnvironment(partition).held_out)


@dg.asset_check(asset="anonymized_episodes", blocking=True,
                description="An auditor independent of the anonymizer finds no original name, address, phone, card or "
                            "canary (curation plants its own each run) in any field of any record curation writes.")
def no_pii_leak(context: dg.AssetCheckExecutionContext):
    report = json.loads(AnonymizedEpisodes(context.partition_key).privacy_report.read_text())
    leaks = int(report.get("leaks", -1))
    # The examples name file, record and field, and show values masked with a salted hash: never the value.
    return dg.AssetCheckResult(
        passed=leaks == 0,
        description="no leak" if leaks == 0 else f"{leaks} original values survived anonymization",
        metadata={"leaks": leaks, "records_scanned": report.get("records_scanned", 0),
                  "planted_canaries": report.get("planted_canaries", 0),
                  "leaks_by_kind": dg.MetadataValue.json(report.get("leaks_by_kind", {})),
                  "examples": dg.MetadataValue.json(report.get("leak_examples", []))},
    )


# -- balanced_episodes, sft_dataset, grpo_dataset -----------------------------------------------

@dg.asset(group_name="curation", partitions_def=weekly, deps=["anonymized_episodes"],
          description="Anonymized episodes with each task category capped and weighted.")
def balanced_episodes(context: dg.AssetExecutionContext, curation: CurationResource):
    partition = context.partition_key
    rows = load_jsonl(AnonymizedEpisodes(partition).episodes)
    balanced, table = balance_episodes(rows, curation.balance())
    digest = save_jsonl(balanced, BalancedEpisodes(partition).episodes)
    return dg.MaterializeResult(metadata={
        "episodes": len(balanced), "content_hash": digest,
        "per_category": _table(table, ["category", "before", "after", "weight", "target"]),
    })


@dg.asset(group_name="curation", partitions_def=weekly, deps=[balanced_episodes],
          description="Successful episodes (quality ≥ min_quality) as TRL conversational rows with tool calls.")
def sft_dataset(context: dg.AssetExecutionContext, curation: CurationResource, environment: EnvironmentResource):
    partition = context.partition_key
    episodes = load_jsonl(BalancedEpisodes(partition).episodes)
    options = {"min_quality": curation.min_quality, "max_idk_share": curation.max_idk_share}
    tenant_shares: list = []
    if environment.capabilities.judged_by_users:
        # Held-out episodes are for validation only; each row trains with the tools its client declared; no tenant
        # holds more than its share of the rows (curation/tenants.py).
        trainable = [e for e in split_live(episodes)[0] if quality(e) >= curation.min_quality]
        trainable, tenant_shares = cap_tenant_share(trainable, curation.max_tenant_share)
        rows = sft_rows(trainable, tools=[], **options)
    else:  # each environment's episodes train with its own tools
        rows = [row for env in environment.loads() for row in sft_rows(
            [e for e in episodes if str(e.get("environment")) == env.name], tools=env.tool_schemas(), **options)]
    if not rows and not curation.allow_empty_sft:
        raise dg.Failure(f"no episode of partition {partition} reaches quality {curation.min_quality}: nothing to learn from")
    dataset = SftDataset(partition)
    digest = save_jsonl(rows, dataset.rows)
    if not rows:  # a reinforcement job whose base model passes nothing yet: GRPO starts from the base model
        return dg.MaterializeResult(metadata={"rows": 0, "from_episodes": len(episodes), "content_hash": digest,
                                              "skipped": SFT_SKIPPED.format(quality=curation.min_quality)})
    extra = {"per_tenant": _table(share_table(tenant_shares), ["tenant", "before", "after", "share"]),
             "max_tenant_share": curation.max_tenant_share} if len(tenant_shares) > 1 else {}
    return dg.MaterializeResult(metadata={"rows": len(rows), "from_episodes": len(episodes), "content_hash": digest,
                                          "path": str(dataset.rows), **extra})


@dg.asset(group_name="curation", partitions_def=weekly, deps=["anonymized_environment", "anonymized_episodes"],
          description="Training tasks (anonymized) as GRPO prompts with what the reward needs.")
def grpo_dataset(context: dg.AssetExecutionContext, environment: EnvironmentResource):
    partition = context.partition_key
    dataset = GrpoDataset(partition)
    if not environment.capabilities.world:  # nothing of ours to roll out in
        context.log.warning(GRPO_SKIPPED)
        digest = save_jsonl([], dataset.rows)
        return dg.MaterializeResult(metadata={"rows": 0, "content_hash": digest, "skipped": GRPO_SKIPPED})
    per_environment = {}
    for world in worlds.reopen(environment.loads(), AnonymizedEnvironment(partition).folder):
        per_environment[world.environment.name] = training_rows(world.environment, world.tasks)
        world.environment.close()
    rows = [row for mine in per_environment.values() for row in mine]
    digest = save_jsonl(rows, dataset.rows)
    return dg.MaterializeResult(metadata={
        "rows": len(rows), "content_hash": digest,
        "per_category": dg.MetadataValue.json(dict(Counter(r["category"] for r in rows))),
        "per_environment": dg.MetadataValue.json({name: len(mine) for name, mine in per_environment.items() if mine}),
        "path": str(dataset.rows),
    })
