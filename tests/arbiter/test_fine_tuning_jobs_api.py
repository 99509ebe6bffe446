"""OpenAI's fine-tuning jobs API on the arbiter, driven by the official `openai` client against a real arbiter on
loopback, and the job store the runner shares with it.

One arbiter serves the module (three tenants); each test uses its own files and jobs. What is checked: jobs created
from uploaded files in OpenAI's shapes (supervised, and reinforcement with a multi grader), their folders as the
job's environment reads them, listing with pagination, events, checkpoints, cancel; every bad request refused with
its 4xx naming the parameter before anything is written (no row, no folder) and without echoing the files; tenants
kept apart; and the store's runner side: claim_next exclusive across processes, finish and cancel semantics.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.fine_tuning import FineTuningJob as SdkJob

from agent_rl.arbiter.config import ArbiterConfig
from agent_rl.arbiter.files import FilesConfig
from agent_rl.arbiter.server import running_arbiter
from agent_rl.environments.openai_jobs import OpenAIJobEnvironment
from agent_rl.finetuning import (
    JobInputMissing,
    JobsConfig,
    JobStateError,
    JobStatus,
    JobStore,
    JobStoreUnavailable,
    fine_tuned_model_name,
)
from agent_rl.records import Split
from tests.arbiter.arbiter_fixtures import api_key, bearer

TOKEN_A = "jobs-api-key-a-5d21"
TOKEN_B = "jobs-api-key-b-77c0"
TOKEN_C = "jobs-api-key-c-0e9a"
SECRET = "Jane-Roe-555-0142"  # stands for personal data in a training file: no error or log line may show it
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Chile": "Santiago"}
MULTI = {
    "type": "multi", "name": "capital", "calculate_output": "0.75 * exact + 0.25 * close",
    "graders": {
        "exact": {"type": "string_check", "name": "exact", "operation": "ilike",
                  "input": "{{ sample.output_text }}", "reference": "{{ item.capital }}"},
        "close": {"type": "text_similarity", "name": "close", "evaluation_metric": "fuzzy_match",
                  "input": "{{ sample.output_text }}", "reference": "{{ item.capital }}"},
    },
}
SDK_FIELDS = set(SdkJob.model_fields)


def sft_rows() -> bytes:
    return b"".join(json.dumps({"messages": [
        {"role": "system", "content": f"You help {SECRET}."},
        {"role": "user", "content": f"What is the capital of {country}?"},
        {"role": "assistant", "content": capital}]}).encode() + b"\n" for country, capital in CAPITALS.items())


def rft_rows() -> bytes:
    return b"".join(json.dumps({"messages": [
        {"role": "developer", "content": f"Answer with the city only, {SECRET}."},
        {"role": "user", "content": f"What is the capital of {country}?"}], "capital": capital}).encode() + b"\n"
        for country, capital in CAPITALS.items())


def with_tools() -> bytes:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    return json.dumps({"messages": [{"role": "user", "content": SECRET}, {"role": "assistant", "content": "ok"}],
                       "tools": tools}).encode() + b"\n"


@dataclass
class Served:
    url: str
    jobs: Path  # the job store's root

    def client(self, token: str = TOKEN_A) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=token, max_retries=0)

    def upload(self, content: bytes, token: str = TOKEN_A, purpose: str = "fine-tune") -> str:
        return self.client(token).files.create(file=("data.jsonl", content), purpose=purpose).id  # type: ignore[arg-type]

    def rows(self) -> int:
        with sqlite3.connect(self.jobs / "jobs.db") as db:
            return db.execute("SELECT count(*) FROM jobs").fetchone()[0]

    def folders(self) -> set[str]:
        return {p.name for p in self.jobs.iterdir() if p.name.startswith("ftjob-")} | {
            p.name for p in (self.jobs / "tmp").iterdir()}

    def raw(self, path: str, token: str = TOKEN_A, method: str = "GET") -> httpx.Response:
        return httpx.request(method, f"{self.url}/v1/fine_tuning/jobs{path}", headers=bearer(token))


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    root = tmp_path_factory.mktemp("jobs-api")
    keys = (api_key(TOKEN_A, "jobs-a", "tenant-a"), api_key(TOKEN_B, "jobs-b", "tenant-b"),
            api_key(TOKEN_C, "jobs-c", "tenant-c"))
    config = ArbiterConfig(pool_url=f"sqlite:///{root / 'pool.db'}", api_keys=keys,
                           files=FilesConfig(root=root / "files"), jobs=JobsConfig(root=root / "jobs"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENT_RL_HOME", str(root / "home"))
        with running_arbiter(config, log_level="warning") as url:
            served = Served(url, root / "jobs")
            assert served.client().fine_tuning.jobs.list().data == []  # the store opens on first use
            yield served


@pytest.fixture(scope="module")
def files(served) -> dict[str, str]:
    """Tenant A's uploads by what they hold, and tenant B's training file."""
    return {"sft": served.upload(sft_rows()), "rft": served.upload(rft_rows()), "tools": served.upload(with_tools()),
            "batch": served.upload(b"not JSON at all", purpose="batch"), "other": served.upload(sft_rows(), TOKEN_B)}


def refused(call) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    error = caught.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}  # OpenAI's error shape
    return caught.value


def test_a_supervised_job_is_created_in_openai_shape_with_the_folder_its_environment_reads(served, files):
    client = served.client()
    validation = served.upload(sft_rows())
    job = client.fine_tuning.jobs.create(
        model="tiny", training_file=files["sft"], validation_file=validation, seed=7, suffix="capitals v1",
        metadata={"team": "geo"}, method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}})
    raw = served.raw(f"/{job.id}").json()
    assert set(raw) == SDK_FIELDS  # exactly OpenAI's FineTuningJob object
    hyperparameters = {"batch_size": "auto", "learning_rate_multiplier": "auto", "n_epochs": 2}
    assert raw == {**raw, "object": "fine_tuning.job", "model": "tiny", "status": "queued", "seed": 7,
                   "organization_id": "tenant-a", "training_file": files["sft"], "validation_file": validation,
                   "hyperparameters": hyperparameters, "fine_tuned_model": None, "finished_at": None, "error": None,
                   "result_files": [], "trained_tokens": None, "metadata": {"team": "geo"},
                   "method": {"type": "supervised", "supervised": {"hyperparameters": hyperparameters}}}
    assert job.id.startswith("ftjob-") and abs(job.created_at - time.time()) < 60
    assert client.fine_tuning.jobs.retrieve(job.id) == job

    folder = served.jobs / job.id
    assert sorted(p.name for p in folder.iterdir()) == ["job.json", "train.jsonl", "validation.jsonl"]
    assert json.loads((folder / "job.json").read_text()) == {
        "id": job.id, "method": "supervised", "grader": None, "hyperparameters": hyperparameters, "model": "tiny",
        "seed": 7}
    assert (folder / "train.jsonl").read_bytes() == sft_rows() == (folder / "validation.jsonl").read_bytes()
    env = OpenAIJobEnvironment(job_dir=str(folder))
    assert len(env.tasks(Split.TRAIN)) == len(env.tasks(Split.TEST)) == len(CAPITALS)

    events = client.fine_tuning.jobs.list_events(job.id)
    assert [e.message for e in events.data] == ["Created fine-tuning job"] and not events.has_more
    assert events.data[0].object == "fine_tuning.job.event" and events.data[0].level == "info"
    checkpoints = served.raw(f"/{job.id}/checkpoints").json()
    assert checkpoints == {"object": "list", "data": [], "has_more": False, "first_id": None, "last_id": None}
    assert client.fine_tuning.jobs.checkpoints.list(job.id).data == []

    # OpenAI's deprecated top-level hyperparameters, without a method: a supervised job.
    legacy = client.fine_tuning.jobs.create(model="base", training_file=files["sft"], hyperparameters={"n_epochs": 3})
    assert legacy.method is not None and legacy.method.type == "supervised" and legacy.hyperparameters.n_epochs == 3
    assert legacy.validation_file is None and not (served.jobs / legacy.id / "validation.jsonl").exists()


def test_a_reinforcement_job_keeps_its_multi_grader_and_hyperparameters(served, files):
    extras = {"compute_multiplier": 1.5, "eval_interval": 5, "eval_samples": 2, "reasoning_effort": "low"}
    job = served.client().fine_tuning.jobs.create(
        model="tiny", training_file=files["rft"],
        method={"type": "reinforcement", "reinforcement": {"grader": MULTI, "hyperparameters": {"n_epochs": 1, **extras}}})
    raw = served.raw(f"/{job.id}").json()
    assert set(raw) == SDK_FIELDS and raw["status"] == "queued"
    recorded = {"n_epochs": 1, "batch_size": "auto", "learning_rate_multiplier": "auto", **extras}
    assert raw["method"] == {"type": "reinforcement", "reinforcement": {"grader": MULTI, "hyperparameters": recorded}}
    assert raw["hyperparameters"] == {"n_epochs": 1, "batch_size": "auto", "learning_rate_multiplier": "auto"}
    assert job.method is not None and job.method.reinforcement is not None
    assert job.method.reinforcement.grader.type == "multi"
    spec = json.loads((served.jobs / job.id / "job.json").read_text())
    assert (spec["method"], spec["grader"], spec["hyperparameters"]) == ("reinforcement", MULTI, recorded)
    env = OpenAIJobEnvironment(job_dir=str(served.jobs / job.id))
    assert env.grader_json == MULTI and len(env.tasks(Split.TRAIN)) + len(env.tasks(Split.TEST)) == len(CAPITALS)


def test_jobs_page_newest_first_and_a_cancelled_job_cannot_be_cancelled_again(served):
    client = served.client(TOKEN_C)
    training = served.upload(sft_rows(), TOKEN_C)
    made = [client.fine_tuning.jobs.create(model="tiny", training_file=training).id for _ in range(3)]
    newest_first = made[::-1]
    first = client.fine_tuning.jobs.list(limit=2)
    assert [j.id for j in first.data] == newest_first[:2] and first.has_more
    rest = client.fine_tuning.jobs.list(limit=2, after=first.data[-1].id)
    assert [j.id for j in rest.data] == newest_first[2:] and not rest.has_more
    assert [j.id for j in client.fine_tuning.jobs.list(limit=1)] == newest_first  # the SDK pages `after` the last
    listing = served.raw("?limit=1", TOKEN_C).json()
    assert set(listing) == {"object", "data", "has_more", "first_id", "last_id"} and listing["has_more"]
    reply = served.raw("?after=ftjob-" + "x" * 24, TOKEN_C)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "after"

    cancelled = client.fine_tuning.jobs.cancel(made[1])
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    assert client.fine_tuning.jobs.retrieve(made[1]).status == "cancelled"
    events = client.fine_tuning.jobs.list_events(made[1], limit=1)
    assert [e.message for e in events.data] == ["Fine-tuning job cancelled"] and events.has_more
    older = client.fine_tuning.jobs.list_events(made[1], limit=1, after=events.data[0].id)
    assert [e.message for e in older.data] == ["Created fine-tuning job"] and not older.has_more
    again = refused(lambda: client.fine_tuning.jobs.cancel(made[1]))
    assert isinstance(again, openai.BadRequestError) and again.body["code"] == "job_not_cancellable"  # type: ignore[index]
    assert [j.status for j in client.fine_tuning.jobs.list()] == ["queued", "cancelled", "queued"]
    paused = refused(lambda: client.fine_tuning.jobs.pause(made[0]))
    assert (paused.status_code, paused.body["code"]) == (400, "unsupported_operation")  # type: ignore[index]


def test_the_runners_events_checkpoints_and_result_show_through_the_api(served, files):
    client = served.client()
    job = client.fine_tuning.jobs.create(model="tiny", training_file=files["sft"], suffix="geo")
    store = JobStore(served.jobs)  # the runner's own handle on the same store
    stored = store.job(job.id)
    assert stored is not None
    store.add_event(job.id, "Step 1/2: training loss=0.9", data={"step": 1, "train_loss": 0.9}, event_type="metrics")
    for step, loss in ((1, 0.9), (2, 0.4)):
        store.add_checkpoint(job.id, step, {"train_loss": loss}, f"{fine_tuned_model_name(stored)}:ckpt-step-{step}")
    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id)
    assert [c.step_number for c in checkpoints.data] == [2, 1]  # newest first, as OpenAI lists them
    assert checkpoints.data[0].metrics.train_loss == 0.4 and checkpoints.data[0].metrics.step == 2
    assert checkpoints.data[0].fine_tuning_job_id == job.id
    assert [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id, limit=1)] == [2, 1]
    metrics = client.fine_tuning.jobs.list_events(job.id).data[0]
    assert metrics.type == "metrics" and metrics.data == {"step": 1, "train_loss": 0.9}

    finished = store.finish(job.id, JobStatus.SUCCEEDED, trained_tokens=1234)
    shown = client.fine_tuning.jobs.retrieve(job.id)
    assert shown.status == "succeeded" and shown.fine_tuned_model == finished.fine_tuned_model
    assert shown.trained_tokens == 1234 and shown.finished_at is not None
    assert re.fullmatch(rf"ft:tiny:tenant-a:geo:{job.id[6:14]}", shown.fine_tuned_model or "")
    assert [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=2).data] == [
        "The job has successfully completed", f"New fine-tuned model created: {shown.fine_tuned_model}"]
    assert refused(lambda: client.fine_tuning.jobs.cancel(job.id)).status_code == 400


GRADER = "method.reinforcement.grader"


def rl(grader: object = MULTI, **hyperparameters: object) -> dict:
    config: dict = {"grader": grader} if grader is not None else {}
    if hyperparameters:
        config["hyperparameters"] = hyperparameters
    return {"type": "reinforcement", "reinforcement": config}


def sft(**hyperparameters: object) -> dict:
    return {"type": "supervised", "supervised": {"hyperparameters": hyperparameters}}


MISSING = "file-" + "x" * 24
BAD_REQUESTS = {  # case: (create arguments, with file names for ids, param, code)
    "unknown training file": ({"training_file": MISSING}, "training_file", "invalid_training_file"),
    "not a fine-tune file": ({"training_file": "batch"}, "training_file", "invalid_training_file"),
    "unknown validation file": ({"validation_file": MISSING}, "validation_file", "invalid_validation_file"),
    "supervised rows for reinforcement": ({"method": rl()}, "training_file", "invalid_file_format"),
    "reinforcement rows for the legacy form": ({"training_file": "rft", "hyperparameters": {"n_epochs": 1}},
                                               "training_file", "invalid_file_format"),
    "rows the environment cannot take": ({"training_file": "tools"}, "training_file", "invalid_file_format"),
    "reinforcement without a grader": ({"training_file": "rft", "method": rl(None)}, GRADER, "invalid_grader"),
    "unknown grader type": ({"training_file": "rft", "method": rl({"type": "label_model", "name": "x"})}, GRADER,
                            "invalid_grader"),
    "grader field the rows lack": ({"training_file": "rft", "method": rl(
        {**MULTI["graders"]["exact"], "reference": "{{ item.answer }}"})}, GRADER, "invalid_grader"),
    "python grader while off": ({"training_file": "rft", "method": rl(
        {"type": "python", "name": "py", "source": "def grade(sample, item):\n    return 1.0\n"})}, GRADER,
                                "python_grader_disabled"),
    "n_epochs 0": ({"method": sft(n_epochs=0)}, "method.supervised.hyperparameters.n_epochs", "invalid_hyperparameters"),
    "n_epochs a word": ({"method": sft(n_epochs="many")}, "method.supervised.hyperparameters.n_epochs",
                        "invalid_hyperparameters"),
    "batch_size true": ({"method": sft(batch_size=True)}, "method.supervised.hyperparameters.batch_size",
                        "invalid_hyperparameters"),
    "negative learning rate": ({"method": sft(learning_rate_multiplier=-1)},
                               "method.supervised.hyperparameters.learning_rate_multiplier", "invalid_hyperparameters"),
    "legacy hyperparameters": ({"hyperparameters": {"n_epochs": 0}}, "hyperparameters.n_epochs",
                               "invalid_hyperparameters"),
    "reasoning effort": ({"training_file": "rft", "method": rl(reasoning_effort="extreme")},
                         "method.reinforcement.hyperparameters.reasoning_effort", "invalid_hyperparameters"),
    "compute multiplier": ({"training_file": "rft", "method": rl(compute_multiplier="lots")},
                           "method.reinforcement.hyperparameters.compute_multiplier", "invalid_hyperparameters"),
    "a reinforcement hyperparameter on supervised": ({"method": sft(eval_samples=2)},
                                                     "method.supervised.hyperparameters.eval_samples",
                                                     "invalid_hyperparameters"),
    "a model we do not serve": ({"model": "gpt-4o-mini"}, "model", "model_not_available"),
    "dpo": ({"method": {"type": "dpo", "dpo": {}}}, "method.type", "unsupported_method"),
    "unknown parameter": ({"extra_body": {"learning_rate": 1}}, "learning_rate", "unknown_parameter"),
    "integrations": ({"integrations": [{"type": "wandb", "wandb": {"project": "p"}}]}, "integrations",
                     "unsupported_parameter"),
    "seed": ({"seed": -1}, "seed", "invalid_value"),
    "suffix": ({"suffix": "x" * 65}, "suffix", "invalid_value"),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_a_bad_request_is_refused_naming_its_parameter_and_leaves_nothing(served, files, case, caplog):
    arguments, param, code = BAD_REQUESTS[case]
    arguments = {"model": "tiny", "training_file": "sft", **arguments}
    for name in ("training_file", "validation_file"):
        arguments[name] = files.get(arguments.get(name), arguments.get(name))
    rows, folders = served.rows(), served.folders()
    error = refused(lambda: served.client().fine_tuning.jobs.create(**arguments))
    assert error.status_code == 400, error.body
    assert (error.body["param"], error.body["code"]) == (param, code), error.body  # type: ignore[index]
    assert error.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert SECRET not in error.body["message"] and SECRET not in caplog.text  # type: ignore[index]
    if code == "model_not_available":
        assert "base" in error.body["message"] and "tiny" in error.body["message"]  # type: ignore[index]
    if case == "rows the environment cannot take":
        assert "line 1" in error.body["message"]  # type: ignore[index]
    assert served.rows() == rows and served.folders() == folders


def test_another_tenant_sees_nothing_and_reads_like_a_missing_job(served, files):
    owner, other = served.client(TOKEN_A), served.client(TOKEN_B)
    job = owner.fine_tuning.jobs.create(model="tiny", training_file=files["sft"])
    missing = "ftjob-" + "x" * 24

    def answer(path: str, method: str = "GET") -> tuple[int, dict]:
        reply = served.raw(path, TOKEN_B, method)
        body = reply.json()
        body["error"]["message"] = body["error"]["message"].replace(job.id, "ID").replace(missing, "ID")
        return reply.status_code, body

    for path, method in (("/{}", "GET"), ("/{}/cancel", "POST"), ("/{}/events", "GET"), ("/{}/checkpoints", "GET")):
        foreign = answer(path.format(job.id), method)
        assert foreign[0] == 404 and foreign == answer(path.format(missing), method)  # byte for byte the same
    for call in (other.fine_tuning.jobs.retrieve, other.fine_tuning.jobs.cancel, other.fine_tuning.jobs.list_events,
                 other.fine_tuning.jobs.checkpoints.list):
        assert isinstance(refused(lambda: call(job.id)), openai.NotFoundError)
    assert job.id not in [j.id for j in other.fine_tuning.jobs.list()]
    assert served.raw(f"?after={job.id}", TOKEN_B).json() == served.raw(f"?after={missing}", TOKEN_B).json()
    assert owner.fine_tuning.jobs.retrieve(job.id).status == "queued"  # untouched by the other's cancel

    # Another tenant's file is refused exactly like an unknown one.
    mine = refused(lambda: other.fine_tuning.jobs.create(model="tiny", training_file=files["sft"])).body
    unknown = refused(lambda: other.fine_tuning.jobs.create(model="tiny", training_file=MISSING)).body
    assert mine["message"].replace(files["sft"], "ID") == unknown["message"].replace(MISSING, "ID")  # type: ignore[index]
    assert other.fine_tuning.jobs.create(model="tiny", training_file=files["other"]).status == "queued"


# -- the store, as the runner uses it -----------------------------------------------------------


def new_store(tmp_path: Path) -> tuple[JobStore, Path]:
    training = tmp_path / "train.jsonl"
    training.write_bytes(sft_rows())
    return JobStore(tmp_path / "jobs"), training


CLAIMER = """
import sys, time
from agent_rl.finetuning import JobStore
store = JobStore(sys.argv[1])
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
while (job := store.claim_next()) is not None:
    store.add_event(job.id, "working")
    print(job.id, flush=True)
"""


def test_claim_next_gives_each_queued_job_to_one_claimer_across_processes(tmp_path):
    store, training = new_store(tmp_path)
    made = [store.create("tenant-x", model="tiny", training_file_path=training).id for _ in range(16)]
    start = time.time() + 3
    claimers = [subprocess.Popen([sys.executable, "-c", CLAIMER, str(store.root), str(start)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [claimer.communicate(timeout=60) for claimer in claimers]
    assert all(claimer.returncode == 0 for claimer in claimers), [err[-2000:] for _, err in outputs]
    claimed = [line for out, _ in outputs for line in out.split()]
    assert sorted(claimed) == sorted(made)  # every job once, none twice
    for job_id in made:
        job = store.job(job_id)
        assert job is not None and job.status is JobStatus.RUNNING
        events, _ = store.events("tenant-x", job_id)
        assert [e.message for e in events] == ["working", "Fine-tuning job started", "Created fine-tuning job"]
    assert store.claim_next() is None


def test_finish_and_cancel_semantics(tmp_path):
    store, training = new_store(tmp_path)
    first = store.create("Acme Corp/EU", model="tiny", training_file_path=training, suffix="my model!")
    second = store.create("Acme Corp/EU", model="tiny", training_file_path=training)
    third = store.create("Acme Corp/EU", model="tiny", training_file_path=training)
    assert store.claim_next() == first.model_copy(update={"status": JobStatus.RUNNING})  # oldest first
    assert not store.is_cancelled(first.id) and store.tenant_of(first.id) == "Acme Corp/EU"
    assert store.cancel("Acme Corp/EU", first.id).status is JobStatus.CANCELLED and store.is_cancelled(first.id)
    late = store.finish(first.id, "succeeded")  # the runner noticed too late: the job stays cancelled
    assert late.status is JobStatus.CANCELLED and late.fine_tuned_model is None
    with pytest.raises(JobStateError):
        store.cancel("Acme Corp/EU", first.id)

    assert store.claim_next().id == second.id  # type: ignore[union-attr]
    done = store.finish(second.id, JobStatus.SUCCEEDED, trained_tokens=10)
    name = fine_tuned_model_name(second)
    assert done.fine_tuned_model == name == f"ft:tiny:Acme-Corp-EU::{second.id[6:14]}"
    assert urllib.parse.quote(name, safe=":") == name  # safe in a URL path as it is
    assert fine_tuned_model_name(first) == f"ft:tiny:Acme-Corp-EU:my-model:{first.id[6:14]}"
    assert store.find_model("Acme Corp/EU", name) == done and store.find_model("someone-else", name) is None
    assert store.find_model("Acme Corp/EU", fine_tuned_model_name(third)) is None  # not succeeded
    with pytest.raises(JobStateError):
        store.finish(second.id, "failed")
    with pytest.raises(JobStateError):
        store.cancel("Acme Corp/EU", second.id)

    failed = store.finish(third.id, "failed", error={"code": "training_error", "message": "out of memory"})
    assert failed.status is JobStatus.FAILED and failed.fine_tuned_model is None and failed.finished_at is not None
    assert failed.to_openai()["error"] == {"code": "training_error", "message": "out of memory", "param": None}
    assert store.events("Acme Corp/EU", third.id)[0][0].level == "error"
    assert store.claim_next() is None
    assert store.job_dir(second.id) == store.root / second.id and (store.job_dir(second.id) / "job.json").exists()


def test_a_create_that_fails_leaves_no_row_and_no_folder(tmp_path, monkeypatch):
    store, training = new_store(tmp_path)

    def leftovers() -> list[str]:
        return sorted(p.name for p in [*store.root.iterdir(), *store.tmp_dir.iterdir()] if "ftjob-" in p.name)

    with pytest.raises(JobInputMissing) as missing:
        store.create("t", model="tiny", training_file_path=training, validation_file_path=tmp_path / "gone.jsonl")
    assert missing.value.param == "validation_file"

    def broken(*args, **kwargs):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store, "_insert_event", broken)  # fails after the folder is in place, inside the insert
    with pytest.raises(JobStoreUnavailable):
        store.create("t", model="tiny", training_file_path=training)
    monkeypatch.undo()
    assert store.list("t") == ([], False) and leftovers() == []
