"""Jobs: the weekly retraining (curation → training → validation → registry) on one pool partition."""

import dagster as dg

retraining_job = dg.define_asset_job(
    "retraining_job",
    selection=dg.AssetSelection.groups("pool", "curation", "training", "validation"),
    description="Export a week of episodes, curate, train SFT + GRPO, validate and register a challenger.",
)

environment_job = dg.define_asset_job(
    "environment_job", selection=dg.AssetSelection.groups("environment"),
    description="Build the environment's world and its tasks.",
)
