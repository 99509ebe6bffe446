"""What the Dagster webserver's GraphQL API says about the code location's assets: latest materialization per
asset (in a given partition for partitioned ones) and the latest execution of every asset check."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

ASSETS_QUERY = """
query AssetState($partitions: [String!]) {
  assetNodes {
    assetKey { path }
    groupName
    isPartitioned
    latest: assetMaterializations(limit: 1) { runId partition }
    inPartition: assetMaterializations(partitions: $partitions, limit: 1) { runId partition }
    assetChecksOrError {
      __typename
      ... on AssetChecks {
        checks {
          name
          blocking
          executionForLatestMaterialization { status evaluation { success description } }
        }
      }
    }
  }
}
"""


@dataclass
class CheckState:
    name: str
    blocking: bool
    status: str | None  # SUCCEEDED, FAILED, IN_PROGRESS, ... or None when it never ran
    passed: bool


@dataclass
class AssetState:
    key: str
    group: str
    partitioned: bool
    materialized: bool
    checks: list[CheckState] = field(default_factory=list)


def query(url: str, text: str, variables: dict | None = None) -> dict:
    response = httpx.post(f"{url}/graphql", json={"query": text, "variables": variables or {}}, timeout=60)
    response.raise_for_status()
    body = response.json()
    if body.get("errors"):
        raise RuntimeError(f"GraphQL errors from {url}: {body['errors']}")
    return body["data"]


def asset_states(url: str, partition: str) -> dict[str, AssetState]:
    """Every asset of the loaded code location, keyed by its user-facing key (`a/b`)."""
    data = query(url, ASSETS_QUERY, {"partitions": [partition]})
    states = {}
    for node in data["assetNodes"]:
        key = "/".join(node["assetKey"]["path"])
        events = node["inPartition"] if node["isPartitioned"] else node["latest"]
        checks = []
        checks_or_error = node["assetChecksOrError"]
        for check in checks_or_error.get("checks", []) if checks_or_error["__typename"] == "AssetChecks" else []:
            execution = check["executionForLatestMaterialization"] or {}
            evaluation = execution.get("evaluation") or {}
            checks.append(CheckState(check["name"], check["blocking"], execution.get("status"),
                                     bool(evaluation.get("success"))))
        states[key] = AssetState(key, node["groupName"], node["isPartitioned"], bool(events), checks)
    return states
