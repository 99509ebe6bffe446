"""The closed loop as a user sees it in a browser: after the fast demo, the Dagster UI shows every asset
materialized with its checks passed, and the MLflow UI shows the registered model with its `champion` alias.

From nothing, in temporary directories: the demo driver builds the state through a real arbiter,
then the real Dagster webserver and MLflow server run on loopback and headless Debian chromium reads
their pages. Screenshots and server logs go to test-artifacts/ui/ (kept on failure, FAILED-*.png).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ui_browser import chromium, screenshot, settle, wait_for, wait_for_texts
from ui_graphql import AssetState, asset_states, query
from ui_servers import Server, free_port, start, stop, wait_until

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
BIN = Path(sys.executable).parent
MODEL_NAME = "agent-rl-email"
# The asset graph of docs/architecture.md: the code location may grow, but these must be there.
CONTRACT_ASSETS = {"world", "tasks", "pool_episodes", "validated_episodes", "anonymized_episodes",
                   "anonymized_environment", "balanced_episodes", "sft_dataset", "grpo_dataset", "sft_adapter",
                   "grpo_adapter", "evaluation_report", "registered_model"}

# MLflow UI preferences in localStorage (mlflow 3.17): promo dialog dismissed, assistant panel closed.
MLFLOW_RETURNING_USER = {"_mlflow_model_registry_promo_modal_dismissed_v1": "true",
                         "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true",
                         "mlflow.assistant.panelOpen_v1": "false"}

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(2400)]


@dataclass
class LoopState:
    env: dict[str, str]
    workdir: Path
    home: Path
    partition: str
    champion_version: str
    promoted_by: str


def _loop_env(base: Path) -> dict[str, str]:
    dagster_home, home = base / "dagster_home", base / "agent_rl_home"
    dagster_home.mkdir(parents=True)
    home.mkdir(parents=True)
    shutil.copy(ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
    env = {k: v for k, v in os.environ.items()
           if k not in ("AGENT_RL_POOL_URL", "AGENT_RL_STORE_URL", "AGENT_RL_INBOX_URL", "PYTEST_CURRENT_TEST")}
    env.update(
        DAGSTER_HOME=str(dagster_home),
        AGENT_RL_HOME=str(home),
        AGENT_RL_PROFILE="fast",
        MLFLOW_TRACKING_URI=f"sqlite:///{home / 'mlflow.db'}",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    return env


@pytest.fixture(scope="module")
def artifacts() -> Path:
    shutil.rmtree(ARTIFACTS, ignore_errors=True)  # stale screenshots would mislead
    (ARTIFACTS / "logs").mkdir(parents=True)
    return ARTIFACTS


@pytest.fixture(scope="module")
def loop_state(tmp_path_factory, artifacts) -> LoopState:
    """Run `demos.demo --fast` against fresh stores, then promote its registered model to `champion`."""
    base = tmp_path_factory.mktemp("ui-loop")
    env = _loop_env(base)
    # The demo's cwd is a tmp dir: MLflow's default artifact root (./mlruns) must not land in the checkout.
    workdir = base / "work"
    workdir.mkdir()
    # `--ab-rounds 0`: the challenger sensor starts the A/B test, but no rounds of replayed traffic: the tiny
    # random model can only be rolled back, which tests/ab covers; the UIs need the registry, not the verdict.
    demo = start("demo", [sys.executable, "-m", "demos.demo", "--fast", "--port", str(free_port()),
                          "--ab-rounds", "0"], env=env, cwd=workdir, url="", log_dir=artifacts / "logs")
    try:
        returncode = demo.process.wait(timeout=1800)
    finally:
        stop(demo)  # its own process group: a demo that hangs takes its arbiter with it
    log_path = demo.log_path
    output = log_path.read_text(errors="replace")
    assert returncode == 0, f"the fast demo failed ({returncode}); see {log_path}:\n{output[-4000:]}"
    match = re.search(r"retraining job on partition (\S+)", output)
    assert match, f"the demo never ran the retraining job; see {log_path}"
    # On failure, the lines that say why: the gates that failed (with their flagged examples) and the choice.
    why = "\n".join(line for line in output.splitlines()
                    if line.startswith(("check failed", "    ", "retraining run", "candidate:", "gate ")))
    assert "challenger registered: True" in output, f"the retraining job registered no model; see {log_path}:\n{why}"

    promoted = subprocess.run([sys.executable, str(Path(__file__).with_name("promote_champion.py"))],
                              env=env, cwd=workdir, capture_output=True, text=True, timeout=300)
    assert promoted.returncode == 0, f"promotion failed:\n{promoted.stdout}\n{promoted.stderr}"
    result = json.loads(promoted.stdout.strip().splitlines()[-1])
    (artifacts / "logs" / "promotion.json").write_text(json.dumps(result) + "\n")
    return LoopState(env, workdir, Path(env["AGENT_RL_HOME"]), match.group(1), result["version"],
                     result["promoted_by"])


def _dagster_location_loaded(url: str):
    def ready(client) -> bool:
        body = client.post(f"{url}/graphql", json={"query": """{ workspaceOrError { ... on Workspace {
            locationEntries { loadStatus locationOrLoadError { __typename } } } } }"""}).json()
        entries = (body.get("data") or {}).get("workspaceOrError", {}).get("locationEntries") or []
        if any(e["locationOrLoadError"] and e["locationOrLoadError"]["__typename"] == "PythonError" for e in entries):
            raise RuntimeError(f"the code location failed to load in the Dagster webserver: {body}")
        return bool(entries) and all(e["loadStatus"] == "LOADED" and e["locationOrLoadError"] for e in entries)

    return ready


def _mlflow_artifact_root(state: LoopState) -> str:
    """Where agent_rl puts a local store's artifacts (settings.mlflow_artifact_location), so the server agrees."""
    return (state.home / "mlartifacts").as_uri()


@dataclass
class UIs:
    dagster: str
    mlflow: str


@pytest.fixture(scope="module")
def uis(loop_state, artifacts) -> Iterator[UIs]:
    """The Dagster webserver and the MLflow server on the demo's stores, started together (both take ~20-30 s)."""
    logs = artifacts / "logs"
    servers: list[Server] = []
    try:
        port = free_port()
        dagster = start("dagster-webserver", [str(BIN / "dagster-webserver"), "-w", str(ROOT / "workspace.yaml"),
                                              "-h", "127.0.0.1", "-p", str(port)],
                        env=loop_state.env, cwd=ROOT, url=f"http://127.0.0.1:{port}", log_dir=logs)
        servers.append(dagster)
        port = free_port()
        mlflow = start("mlflow-server", [str(BIN / "mlflow"), "server",
                                         "--backend-store-uri", loop_state.env["MLFLOW_TRACKING_URI"],
                                         "--default-artifact-root", _mlflow_artifact_root(loop_state),
                                         "--no-serve-artifacts", "--host", "127.0.0.1", "--port", str(port),
                                         "--workers", "1"],
                       env={**loop_state.env, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"},
                       cwd=loop_state.workdir, url=f"http://127.0.0.1:{port}", log_dir=logs)
        servers.append(mlflow)
        wait_until(dagster, _dagster_location_loaded(dagster.url), timeout_s=300)
        # A fresh instance opens a "join the community" dialog over the first page; mark it seen.
        query(dagster.url, "mutation { setNuxSeen }")
        wait_until(mlflow, lambda client: client.get(f"{mlflow.url}/health").status_code == 200, timeout_s=300)
        yield UIs(dagster.url, mlflow.url)
    finally:
        stop(*servers)


@pytest.fixture(scope="module")
def driver():
    with chromium() as browser:
        yield browser


@contextmanager
def page(driver, name: str) -> Iterator[None]:
    """One page of the walk-through: a screenshot when it is done, and one named FAILED-... when it is not."""
    try:
        yield
    except BaseException:
        screenshot(driver, ARTIFACTS, f"FAILED-{name}")
        raise
    settle(driver)
    screenshot(driver, ARTIFACTS, name)


def _shown_in_graph(key: str, lines: set[str]) -> bool:
    """Graph nodes shorten long names around an ellipsis (`anony…_environment`)."""
    if key in lines:
        return True
    return any(head and key.startswith(head) and key.endswith(tail)
               for head, _, tail in (line.partition("…") for line in lines if "…" in line))


def _catalog_rows(text: str, keys: list[str]) -> dict[str, str]:
    """The asset catalog's text cut into one piece per asset row (a row starts with the asset's key)."""
    lines = text.splitlines()
    starts = sorted((lines.index(key), key) for key in keys)
    ends = [start for start, _ in starts[1:]] + [len(lines)]
    return {key: "\n".join(lines[start:end]) for (start, key), end in zip(starts, ends)}


def _catalog_status(row: str, partitioned: bool):
    """A catalog row's status once loaded, else None. Partitioned: the counts (materialized, missing, failed,
    in progress) shown before "N partitions"; unpartitioned: the status word."""
    if partitioned:
        counts = re.search(r"(\d+)\n(\d+)\n(\d+)\n(\d+)\n\d+ partitions", row)
        return tuple(int(c) for c in counts.groups()) if counts else None
    return next((word for word in ("Materialized", "Failed", "Never materialized") if word in row), None)


def _latest_materialization(text: str) -> str:
    """The "Latest materialization" part of an asset's overview page."""
    _, _, rest = text.partition("Latest materialization")
    return re.split(r"Latest check results|Asset history|Description", rest, maxsplit=1)[0].strip()


def test_dagster_ui_shows_every_asset_materialized_with_checks_passed(loop_state, uis, driver):
    dagster_url = uis.dagster
    # Cross-check through the webserver's GraphQL API first: a clear message if the state itself is wrong.
    states = asset_states(dagster_url, loop_state.partition)
    assert CONTRACT_ASSETS <= states.keys(), f"assets missing from the code location: {CONTRACT_ASSETS - states.keys()}"
    not_materialized = sorted(k for k, s in states.items() if not s.materialized)
    assert not not_materialized, f"not materialized (partition {loop_state.partition}): {not_materialized}"
    checks = {f"{k}.{c.name}": c for k, s in states.items() for c in s.checks}
    assert {"validated_episodes.enough_points", "anonymized_episodes.no_pii_leak",
            "evaluation_report.beats_champion"} <= checks.keys()
    failing = {name: c.status for name, c in checks.items() if not (c.status == "SUCCEEDED" and c.passed)}
    assert not failing, f"asset checks not passed on the latest materialization: {failing}"
    walk_dagster_ui(driver, dagster_url, states, loop_state.partition)


def walk_dagster_ui(driver, dagster_url: str, states: dict[str, AssetState], partition: str) -> None:
    """Lineage, catalog, every asset's overview and every gated asset's checks tab, as a user would look."""
    keys = sorted(states)
    groups = sorted({s.group for s in states.values()})
    with page(driver, "dagster-asset-lineage"):
        # Groups start collapsed; `expanded` opens them all (ids as the UI builds them without per-location groups).
        driver.get(f"{dagster_url}/asset-groups?expanded=" + ",".join(f"global@global:{g}" for g in groups))
        wait_for(driver, lambda text: all(_shown_in_graph(k, set(text.splitlines())) for k in keys),
                 f"every asset of the code location in the graph: {keys}", timeout_s=120)
    with page(driver, "dagster-asset-catalog"):
        driver.get(f"{dagster_url}/assets")
        # Rows fill their status column one by one ("—" until then): wait for every row's status.
        text = wait_for(driver, lambda t: all(k in t.splitlines() for k in keys) and all(
            _catalog_status(row, states[key].partitioned) is not None for key, row in _catalog_rows(t, keys).items()),
            "every asset with its status", timeout_s=120)
        for key, row in _catalog_rows(text, keys).items():
            status = _catalog_status(row, states[key].partitioned)
            if states[key].partitioned:
                materialized, _missing, failed, in_progress = status
                assert materialized >= 1 and failed == in_progress == 0, \
                    f"catalog row of {key} does not show a materialized partition and none failed: {row!r}"
            else:
                assert status == "Materialized", f"catalog row of {key} shows {status!r}: {row!r}"
    for key in keys:
        with page(driver, f"dagster-asset-{key}"):
            suffix = f"?partition={partition}" if states[key].partitioned else ""
            driver.get(f"{dagster_url}/assets/{key}{suffix}")
            # Wait for the section's content, not just its heading: the data arrives after the layout.
            expected = partition if states[key].partitioned else ""
            text = wait_for(driver, lambda t: "Latest materialization" in t and bool(_latest_materialization(t))
                            and (expected in _latest_materialization(t) or "Failed" in _latest_materialization(t)),
                            f"the latest materialization of {key}", timeout_s=90)
            latest = _latest_materialization(text)
            assert latest and "Failed" not in latest and "Never" not in latest, \
                f"{key}: the overview shows no successful materialization: {latest!r}"
            if states[key].partitioned:
                assert partition in latest, f"{key}: latest materialization is not in {partition}"
    for key in sorted(k for k, s in states.items() if s.checks):
        names = [c.name for c in states[key].checks]
        with page(driver, f"dagster-checks-{key}"):
            driver.get(f"{dagster_url}/assets/{key}?view=checks")
            # The list's statuses arrive after the names: wait for one status per check (or a failure).
            text = wait_for(driver, lambda t: all(n in t for n in names) and "Passed" in t and (
                t.count("Succeeded") >= len(names) or "Failed" in t), f"the status of the checks {names}", timeout_s=90)
            assert "Failed" not in text, f"the checks tab of {key} shows a failed check"


def test_mlflow_ui_shows_registered_model_with_champion_alias(loop_state, uis, driver):
    mlflow_url = uis.mlflow

    alias = httpx.get(f"{mlflow_url}/api/2.0/mlflow/registered-models/alias",
                      params={"name": MODEL_NAME, "alias": "champion"}, timeout=30)
    assert alias.status_code == 200, alias.text
    assert alias.json()["model_version"]["version"] == loop_state.champion_version

    # A returning user's settings, so no first-visit dialog or assistant panel covers the registry.
    driver.get(f"{mlflow_url}/health")
    driver.execute_script("for (const [k, v] of Object.entries(arguments[0])) window.localStorage.setItem(k, v);",
                          MLFLOW_RETURNING_USER)
    with page(driver, "mlflow-models"):
        driver.get(f"{mlflow_url}/#/models")
        text = wait_for_texts(driver, [MODEL_NAME, "champion"], timeout_s=120)
        # The "Aliased versions" column: `@ champion : Version N`.
        assert re.search(rf"champion\s*:\s*Version {loop_state.champion_version}\b", text), text[:2000]
    with page(driver, "mlflow-model-agent-rl-email"):
        driver.get(f"{mlflow_url}/#/models/{MODEL_NAME}")
        text = wait_for_texts(driver, [MODEL_NAME, "champion", f"Version {loop_state.champion_version}"],
                              timeout_s=120)
        # The versions table: the alias sits on the champion's own row (up to the next row or the table's end).
        row = re.search(rf"\nVersion {loop_state.champion_version}\n(.*?)(?:\nVersion \d+\n|\nPrevious\n|$)",
                        text, re.S)
        assert row and re.search(r"@\s*champion", row[1]), \
            f"the champion alias is not on version {loop_state.champion_version}'s row: {text[:3000]!r}"
    with page(driver, "mlflow-model-version-champion"):
        driver.get(f"{mlflow_url}/#/models/{MODEL_NAME}/versions/{loop_state.champion_version}")
        wait_for_texts(driver, [f"Version {loop_state.champion_version}", "champion"], timeout_s=120)
