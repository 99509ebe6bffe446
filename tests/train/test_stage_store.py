"""The stage store (agent_rl/train/stage_store.py): how a training stage's files cross to a machine that shares
nothing with the host. No model: the stage is played by a function that reads and writes files like one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_rl.train import stage_store
from agent_rl.train.stage_store import (CONFIG_ENV_LIMIT, StagedConfig, StageStore, StageStoreError,
                                        check_store_url, read_stage_config, run_in_scratch)


def _tree(root: Path) -> dict[str, int]:
    """Every file under root with its modification time: what a second upload must leave alone."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def store(tmp_path) -> StageStore:
    return StageStore(f"file://{tmp_path / 'store'}")


def _adapter_dir(path: Path) -> Path:
    (path / "nested").mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"\x00weights" * 100)
    (path / "nested" / "notes.txt").write_text("hello")
    return path


def test_a_file_and_a_directory_round_trip(store, tmp_path):
    rows = tmp_path / "host" / "train.jsonl"
    rows.parent.mkdir()
    rows.write_text('{"messages": []}\n')
    adapter = _adapter_dir(tmp_path / "host" / "adapter")

    file_url, dir_url = store.put(rows), store.put(adapter)

    assert file_url.startswith(store.url + "/objects/") and file_url.endswith("/train.jsonl")
    assert store.get(file_url, tmp_path / "pod" / "rows.jsonl").read_text() == rows.read_text()
    copy = store.get(dir_url, tmp_path / "pod" / "adapter")
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file()) == \
        ["adapter_model.safetensors", "nested/notes.txt"]
    assert (copy / "adapter_model.safetensors").read_bytes() == (adapter / "adapter_model.safetensors").read_bytes()
    assert not list((tmp_path / "pod").glob(".*")), "no temp folder left behind"
    with pytest.raises(FileExistsError):
        store.get(dir_url, copy)  # never over what is there


def test_the_same_content_is_uploaded_once(store, tmp_path, monkeypatch):
    adapter = _adapter_dir(tmp_path / "adapter")
    url = store.put(adapter)
    before = _tree(Path(store.root))

    def no_writes(*args, **kwargs):
        raise AssertionError("a second upload of the same content wrote to the store")

    monkeypatch.setattr(store.fs, "put_file", no_writes)
    monkeypatch.setattr(store.fs, "pipe_file", no_writes)
    assert store.put(adapter) == url
    assert _tree(Path(store.root)) == before
    monkeypatch.undo()
    (adapter / "nested" / "notes.txt").write_text("changed")
    assert store.put(adapter) != url, "new content, new address"


def test_an_interrupted_upload_is_never_read_and_is_redone(store, tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text("{}\n")
    url = store.put(rows)
    marker = Path(store.root) / url[len(store.url) + 1:].rsplit("/", 1)[0] / stage_store.MARKER
    marker.unlink()  # as if the upload died before its last write
    with pytest.raises(StageStoreError, match="not in the stage store"):
        store.get(url, tmp_path / "copy.jsonl")
    assert store.put(rows) == url and marker.is_file()
    assert store.get(url, tmp_path / "copy.jsonl").read_text() == "{}\n"


@pytest.mark.parametrize("url, says", [
    ("nonsense://bucket/dir", "unknown protocol 'nonsense'"),
    ("relative/dir", "expected an fsspec URL with a scheme"),
    ("file://relative/dir", "absolute path"),
    ("s3://AKIAKEY:topsecret@bucket/dir", "credentials in the URL"),
    ("gs://bucket/dir?access_token=topsecret", "credentials in the URL"),
])
def test_a_bad_store_url_is_refused_by_name_without_its_secret(url, says):
    with pytest.raises(ValueError, match=says) as info:
        check_store_url(url)
    assert "stage_store_url" in str(info.value)
    assert "topsecret" not in str(info.value) and "AKIAKEY" not in str(info.value)
    with pytest.raises(ValueError):
        StageStore(url)


def test_a_url_outside_the_store_is_refused(store, tmp_path):
    with pytest.raises(ValueError, match="is not an object of the stage store"):
        store.get(f"file://{tmp_path}/elsewhere/x", tmp_path / "x")


def _play_stage(local: dict, _uploaders: list = ()) -> dict:
    """What a training stage does with its files: read the inputs, write an adapter whose manifest names them."""
    assert Path(local["rows_jsonl"]).read_text() == '{"messages": []}\n'
    assert (Path(local["init_adapter"]) / "adapter_model.safetensors").is_file()
    out = Path(local["out_dir"])
    adapter = out / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"trained")
    manifest = {"base_model": local["model_path"], "adapters": [local["init_adapter"], str(adapter)]}
    (adapter / "agent_rl_adapter.json").write_text(json.dumps(manifest))
    (out / "checkpoint-1").mkdir()
    (out / "checkpoint-1" / "optimizer.pt").write_bytes(b"big")
    return {"adapter_dir": str(adapter), "started_from": local["init_adapter"], "steps": 1}


def test_host_to_pod_and_back_rewrites_every_path(store, tmp_path, monkeypatch):
    host = tmp_path / "host"
    rows = host / "data" / "train.jsonl"
    rows.parent.mkdir(parents=True)
    rows.write_text('{"messages": []}\n')
    init = _adapter_dir(host / "champion")
    out_dir = host / "artifacts" / "sft_adapter" / "2026-01-05"
    (out_dir / "started_from.json").parent.mkdir(parents=True)
    (out_dir / "started_from.json").write_text("{}")  # the host's own file beside the output stays
    config = {"model_path": "/models/smollm2", "rows_jsonl": str(rows), "init_adapter": str(init),
              "out_dir": str(out_dir), "settings": {"max_steps": 1}}

    staged = StagedConfig.prepare("sft", config, store.url, pod_values={"model_path": "/image/models/smollm2"})
    pod_config = read_stage_config(staged.env_value)
    assert str(host) not in staged.env_value, "the pod gets no path of the host"
    assert pod_config["model_path"] == "/image/models/smollm2" and "out_dir" not in pod_config
    monkeypatch.setenv(stage_store.SCRATCH_ENV, str(tmp_path / "pod-scratch"))
    (tmp_path / "pod-scratch").mkdir()
    reported = run_in_scratch(pod_config, _play_stage)
    assert reported["adapter_dir"].startswith(store.url) and not out_dir.joinpath("adapter").exists()
    assert not list((tmp_path / "pod-scratch").iterdir()), "the pod's scratch is removed"

    result = staged.bring_back(reported)

    assert result == {"adapter_dir": str(out_dir / "adapter"), "started_from": str(init), "steps": 1}
    assert (out_dir / "adapter" / "adapter_model.safetensors").read_bytes() == b"trained"
    manifest = json.loads((out_dir / "adapter" / "agent_rl_adapter.json").read_text())
    assert manifest == {"base_model": "/models/smollm2", "adapters": [str(init), str(out_dir / "adapter")]}
    assert (out_dir / "started_from.json").is_file() and not (out_dir / "checkpoint-1").exists()
    assert sorted(p.name for p in out_dir.parent.iterdir()) == ["2026-01-05"], "no temp folder left behind"


def test_an_input_missing_on_the_host_is_named(store, tmp_path):
    config = {"model_path": "HuggingFaceTB/SmolLM2-135M-Instruct", "rows_jsonl": str(tmp_path / "missing.jsonl"),
              "out_dir": str(tmp_path / "out")}
    with pytest.raises(FileNotFoundError, match="rows_jsonl"):
        StagedConfig.prepare("sft", config, store.url)
    config["rows_jsonl"] = str(tmp_path / "rows.jsonl")
    Path(config["rows_jsonl"]).write_text("{}\n")
    staged = StagedConfig.prepare("sft", config, store.url)  # a hub name is the pod's to resolve
    assert staged.config["model_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_sqlite_inbox_and_world_lists_travel_too(store, tmp_path):
    inbox, world = tmp_path / "inbox.db", tmp_path / "worlds" / "support.pkl"
    world.parent.mkdir()
    inbox.write_bytes(b"sqlite"), world.write_bytes(b"pickle")
    config = {"model_path": "m", "store_url": f"sqlite:///{inbox}", "environment_files": [str(world)],
              "out_dir": str(tmp_path / "out")}
    pod_config = StagedConfig.prepare("grpo", config, store.url).config
    assert pod_config["store_url"].startswith("sqlite:///" + store.url)
    assert store.owns(pod_config["environment_files"][0])
    postgres = {**config, "store_url": "postgresql://db/inbox"}  # a server the pod reaches itself
    assert StagedConfig.prepare("grpo", postgres, store.url).config["store_url"] == "postgresql://db/inbox"


def test_a_long_config_travels_as_a_store_object(store, tmp_path):
    config = {"model_path": "m", "out_dir": str(tmp_path / "out"),
              "solve_rates": {f"scenario-{i}": 0.5 for i in range(CONFIG_ENV_LIMIT // 10)}}
    staged = StagedConfig.prepare("grpo", config, store.url)
    assert store.owns(staged.env_value)
    assert read_stage_config(staged.env_value)["solve_rates"] == config["solve_rates"]
    with pytest.raises(ValueError, match="not a JSON object"):
        read_stage_config("{not json")


def test_a_sqlite_database_with_commits_in_its_log_travels_whole(store, tmp_path):
    import sqlite3

    db = tmp_path / "host" / "inbox.db"
    db.parent.mkdir()
    writer = sqlite3.connect(db)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE emails (id TEXT)")
    writer.execute("INSERT INTO emails VALUES ('m1')")
    writer.commit()  # the row sits in inbox.db-wal while this connection stays open
    try:
        assert Path(f"{db}-wal").stat().st_size > 0
        config = {"model_path": "m", "store_url": f"sqlite:///{db}", "out_dir": str(tmp_path / "out")}
        url = StagedConfig.prepare("grpo", config, store.url).config["store_url"].removeprefix("sqlite:///")
        copy = store.get(url, tmp_path / "pod" / "inbox.db")
        assert sqlite3.connect(copy).execute("SELECT id FROM emails").fetchall() == [("m1",)]
    finally:
        writer.close()


def test_a_checkpoint_snapshot_carries_what_the_run_keeps_beside_it(store, tmp_path, monkeypatch):
    """What a restarted pod gets: the newest checkpoint and the run's own files (the prompts a GRPO filter kept,
    rollout records so far), not the older checkpoints; a marker that lets the run adopt it; nothing once done."""
    from agent_rl.train.sft import ADOPT_CHECKPOINTS, INPUTS_FILE, resumable_checkpoint

    config = {"model_path": "m", stage_store.STORE_KEY: store.url, "settings": {"max_steps": 4}}
    key = stage_store.stage_key(config)
    assert key == stage_store.stage_key({**config, stage_store.STORE_KEY: "file:///elsewhere"})
    assert key != stage_store.stage_key({**config, "settings": {"max_steps": 5}})
    # Where it reports is not what it learns: a re-executed Dagster run, or a helper rank that reports nothing.
    assert key == stage_store.stage_key({**config, "tracking": {"uri": "http://mlflow", "dagster_run_id": "r2"}})
    assert key == stage_store.stage_key({**config, "tracking": None})
    first = tmp_path / "first-out"
    for step in (2, 4):
        (first / f"checkpoint-{step}").mkdir(parents=True)
        (first / f"checkpoint-{step}" / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    (first / "grpo_prompts.jsonl").write_text('{"prompt": "kept"}\n')
    (first / INPUTS_FILE).write_text("fingerprint of the first pod's paths\n")
    store.record_checkpoint(key, first, 4)
    assert store.latest_checkpoint(key)["name"] == "checkpoint-4"

    monkeypatch.setenv(stage_store.SCRATCH_ENV, str(tmp_path / "node-b"))
    (tmp_path / "node-b").mkdir()
    seen = {}

    def resumed_stage(local: dict, uploaders: list) -> dict:
        out = Path(local["out_dir"])
        seen["entries"] = sorted(p.name for p in out.iterdir())
        seen["marker"] = (out / INPUTS_FILE).read_text().strip()
        seen["resume"] = resumable_checkpoint(out, "fingerprint of this pod's paths")
        seen["uploaders"] = len(uploaders)
        (out / "adapter").mkdir()
        return {"adapter_dir": str(out / "adapter")}

    stage_store.run_in_scratch(config, resumed_stage)
    assert seen["entries"] == sorted([INPUTS_FILE, "checkpoint-4", "grpo_prompts.jsonl"])
    assert seen["marker"] == ADOPT_CHECKPOINTS and seen["resume"].endswith("checkpoint-4") and seen["uploaders"] == 1
    assert store.latest_checkpoint(key) is None  # the stage finished: nothing left to resume
