"""Crash and resume: a training process killed with SIGKILL resumes from its last checkpoint and ends at
the same step count; a killed export or anonymization leaves the previous output whole, never half a file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
from agent_rl.agent.models import build_tiny_model
from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
from agent_rl.curation.datasets import load_jsonl, save_jsonl, sft_rows
from agent_rl.environments.email.inbox.store import open_inbox_store
from reliability_support import ROOT, build_world

MAX_STEPS = 12


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    world = build_world(tmp_path_factory.mktemp("crash-world"))
    store = open_inbox_store(world.inbox_url)
    teacher = HeuristicPolicy(HeuristicConfig(scenarios=world.scenarios), store=store)
    played = run_episodes(teacher, [EpisodeTask.from_scenario(s) for s in world.scenarios[:16]], store)
    store.close()
    return world, [e.model_dump(mode="json") for e in played]


def _checkpoints(out: Path) -> list[int]:
    """Steps of the checkpoints that are complete (the trainer state is written last)."""
    return sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if (p / "trainer_state.json").is_file())


@pytest.mark.slow
def test_sigkilled_training_resumes_from_its_last_checkpoint_and_reaches_the_same_step(episodes, tmp_path):
    _, played = episodes
    rows = sft_rows(played, min_quality=0.0)
    assert rows
    save_jsonl(rows, tmp_path / "sft.jsonl")
    out = tmp_path / "sft"
    config = {"model_path": str(build_tiny_model(tmp_path / "tiny")), "rows_jsonl": str(tmp_path / "sft.jsonl"),
              "out_dir": str(out), "settings": {"max_steps": MAX_STEPS, "save_steps": 1, "save_total_limit": 2,
                                                "per_device_train_batch_size": 1, "max_length": 8192}}
    config_path = tmp_path / "sft.json"
    config_path.write_text(json.dumps(config))
    command = [sys.executable, "-m", "agent_rl.train", "sft", "--config", str(config_path)]

    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 300
        while len(_checkpoints(out)) < 2:
            assert first.poll() is None, f"training ended before it could be killed:\n{(tmp_path / 'first.log').read_text()[-2000:]}"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)  # no clean-up, no final save: as an OOM kill or a lost node
        first.wait(60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == -signal.SIGKILL
    killed_at = _checkpoints(out)[-1]
    assert killed_at < MAX_STEPS and not (out / "adapter").exists()

    second = subprocess.run(command, capture_output=True, text=True, timeout=600, env=_env(), cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    summary = json.loads(second.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] is not None
    resumed_step = int(summary["resumed_from"].split("-")[1])
    assert resumed_step >= killed_at  # the newest complete checkpoint (a later one may have finished while dying)
    assert summary["steps"] == MAX_STEPS
    assert len(summary["losses"]) == MAX_STEPS - resumed_step  # only the missing steps ran again
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_a_checkpoint_cut_short_by_the_kill_is_skipped_on_resume(episodes, tmp_path):
    from agent_rl.train.config import SFTSettings
    from agent_rl.train.sft import train_sft

    _, played = episodes
    save_jsonl(sft_rows(played, min_quality=0.0), tmp_path / "sft.jsonl")
    tiny = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "sft"
    settings = dict(save_steps=1, per_device_train_batch_size=1, max_length=8192)
    train_sft(tiny, tmp_path / "sft.jsonl", out, SFTSettings(max_steps=2, **settings))
    # What SIGKILL during the save of step 3 leaves: the folder and part of the weights, no trainer state.
    partial = out / "checkpoint-3"
    partial.mkdir()
    (partial / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    resumed = train_sft(tiny, tmp_path / "sft.jsonl", out, SFTSettings(max_steps=4, **settings))
    assert resumed.resumed_from == "checkpoint-2" and resumed.steps == 4


@pytest.mark.slow
def test_a_rerun_on_new_rows_trains_afresh_instead_of_resuming_the_earlier_run(episodes, tmp_path):
    """The next week of a partition writes to the same out_dir: its checkpoints come from other rows, and resuming
    them would hand back last week's adapter as this week's."""
    from agent_rl.train.config import SFTSettings
    from agent_rl.train.sft import train_sft

    _, played = episodes
    rows = sft_rows(played, min_quality=0.0)
    save_jsonl(rows[: len(rows) // 2], tmp_path / "week1.jsonl")
    save_jsonl(rows[len(rows) // 2:], tmp_path / "week2.jsonl")
    tiny = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "sft"
    settings = SFTSettings(max_steps=3, save_steps=1, per_device_train_batch_size=1, max_length=8192)
    first = train_sft(tiny, tmp_path / "week1.jsonl", out, settings)
    assert first.resumed_from is None and first.steps == 3
    second = train_sft(tiny, tmp_path / "week2.jsonl", out, settings)
    assert second.resumed_from is None and second.steps == 3 and len(second.losses) == 3
    again = train_sft(tiny, tmp_path / "week2.jsonl", out, settings.model_copy(update={"max_steps": 4}))
    assert again.resumed_from == "checkpoint-3" and len(again.losses) == 1  # the same rows: it goes on


# -- half-written outputs ----------------------------------------------------------------------------

SLOW_WRITER = textwrap.dedent("""
    import sys, time
    from agent_rl.curation.datasets import save_jsonl

    def rows():
        for i in range(100_000):
            if i == 50:
                print("writing", flush=True)  # rows are on their way to disk now
            time.sleep(0.001)
            yield {"row": i, "text": "new version " * 20}

    save_jsonl(rows(), sys.argv[1])
""")


def _kill_when(process: subprocess.Popen, marker: str, extra_wait_s: float = 0.0, may_finish: bool = False) -> None:
    for line in process.stdout:
        if marker in line:
            break
    else:
        raise AssertionError(f"the process ended before printing {marker!r}")
    time.sleep(extra_wait_s)
    process.send_signal(signal.SIGKILL)
    process.wait(60)
    if may_finish and process.returncode == 0:
        return  # it finished before the kill landed
    assert process.returncode == -signal.SIGKILL


def test_a_killed_export_leaves_the_previous_file_whole(tmp_path):
    target = tmp_path / "sft_dataset" / "train.jsonl"
    previous = [{"row": i, "text": "previous version"} for i in range(10)]
    previous_hash = save_jsonl(previous, target)
    writer = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(target)], stdout=subprocess.PIPE, text=True,
                              env=_env(), cwd=tmp_path)
    _kill_when(writer, "writing", extra_wait_s=0.3)

    assert load_jsonl(target) == previous
    assert save_jsonl(load_jsonl(target), tmp_path / "check.jsonl") == previous_hash
    # The unfinished temp file (if any) is hidden and never read as data.
    assert [p.name for p in target.parent.glob("*.jsonl")] == ["train.jsonl"]

    fresh = tmp_path / "never_written" / "train.jsonl"
    writer = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(fresh)], stdout=subprocess.PIPE, text=True,
                              env=_env(), cwd=tmp_path)
    _kill_when(writer, "writing", extra_wait_s=0.3)
    assert not fresh.exists()  # absent, not a partial file


ANONYMIZER = textwrap.dedent("""
    import json, sys
    from agent_rl.privacy.anonymize import Anonymizer
    from agent_rl.curation.datasets import load_jsonl, save_jsonl

    episodes = load_jsonl(sys.argv[1])
    anonymizer = Anonymizer()
    print("anonymizing", flush=True)
    anonymized = anonymizer.anonymize_episodes(episodes * 20)  # long enough to be killed in the middle
    save_jsonl(anonymized, sys.argv[2])
    print("done", flush=True)
""")


def test_a_killed_anonymization_leaves_the_previous_output_whole(episodes, tmp_path):
    _, played = episodes
    save_jsonl(played, tmp_path / "validated.jsonl")
    target = tmp_path / "anonymized_episodes" / "episodes.jsonl"
    previous = [{"episode_id": "previous", "question": "an earlier, complete anonymized partition"}]
    save_jsonl(previous, target)
    process = subprocess.Popen([sys.executable, "-c", ANONYMIZER, str(tmp_path / "validated.jsonl"), str(target)],
                               stdout=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    _kill_when(process, "anonymizing", extra_wait_s=1.0, may_finish=True)
    # Whole or nothing: the previous partition, or (on a machine fast enough to finish before the kill) the
    # complete new one - never a partial file.
    rows = load_jsonl(target)
    assert rows == previous or (len(rows) == 20 * len(played) and all(r.get("episode_id") for r in rows))
    assert [p.name for p in target.parent.glob("*.jsonl")] == ["episodes.jsonl"]
