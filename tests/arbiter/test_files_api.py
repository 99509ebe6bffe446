"""OpenAI's Files API on the arbiter, driven by the official `openai` client against a real arbiter on loopback.

One arbiter serves the module (two tenants, a small upload limit); each test uses its own files. What is checked:
the round trip (upload, list, retrieve, content, delete) in OpenAI's shapes, the first bad line of a training file
named without echoing its content, tenants kept apart (another tenant's id reads like a missing one), the upload
limit (413, nothing left behind) and crash safety (nothing half-written is ever visible).
"""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from agent_rl.arbiter.config import ArbiterConfig
from agent_rl.arbiter.files import ORPHAN_GRACE_S, STALE_PART_S, FilesConfig, FileStore
from agent_rl.arbiter.server import running_arbiter
from tests.arbiter.arbiter_fixtures import api_key, bearer

TOKEN_A = "files-api-key-a-31c7"
TOKEN_B = "files-api-key-b-9e04"
LIMIT = 64 * 1024  # the module's upload limit
SECRET = "Jane-Roe-555-0142"  # stands for personal data in a training file: no error or log line may show it

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
SUPERVISED = {"messages": [
    {"role": "system", "content": "You answer weather questions."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "4 C, rain"},
    {"role": "assistant", "content": [{"type": "text", "text": "4 C and rain."}], "weight": 1},
], "tools": TOOLS, "parallel_tool_calls": False}
REINFORCEMENT = {"messages": [{"role": "developer", "content": "Answer with a number."},
                              {"role": "user", "content": "What is 6 times 7?"}],
                 "reference_answer": "42", "tools": TOOLS}


def jsonl(*rows: object) -> bytes:
    return b"".join((row if isinstance(row, bytes) else json.dumps(row).encode()) + b"\n" for row in rows)


@dataclass
class Served:
    url: str
    files: Path  # the store's root

    def client(self, token: str = TOKEN_A) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=token, max_retries=0)

    def rows(self) -> int:
        with sqlite3.connect(self.files / "index.db") as db:
            return db.execute("SELECT count(*) FROM files").fetchone()[0]

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in (self.files / "tmp").iterdir())

    def stored(self) -> set[str]:
        return {p.name for p in (self.files / "content").iterdir()}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    root = tmp_path_factory.mktemp("files-api")
    keys = (api_key(TOKEN_A, "files-a", "tenant-a"), api_key(TOKEN_B, "files-b", "tenant-b"))
    config = ArbiterConfig(pool_url=f"sqlite:///{root / 'pool.db'}", api_keys=keys,
                           files=FilesConfig(root=root / "files", max_upload_bytes=LIMIT))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENT_RL_HOME", str(root / "home"))
        with running_arbiter(config, log_level="warning") as url:
            served = Served(url, root / "files")
            assert served.client().files.list().data == []  # the store opens on first use
            yield served


def refused(call) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    error = caught.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}  # OpenAI's error shape
    return caught.value


def test_upload_list_retrieve_content_delete_round_trip(served):
    client = served.client()
    stored_before = served.stored()
    supervised = client.files.create(file=("train.jsonl", jsonl(SUPERVISED, SUPERVISED)), purpose="fine-tune")
    rft = client.files.create(file=("rft.jsonl", jsonl(REINFORCEMENT, b"", REINFORCEMENT)), purpose="fine-tune")
    batch = client.files.create(file=("../../notes.txt", b"not JSON at all"), purpose="batch",
                                expires_after={"anchor": "created_at", "seconds": 3600})
    assert batch.expires_at == batch.created_at + 3600

    raw = httpx.get(f"{served.url}/v1/files/{supervised.id}", headers=bearer(TOKEN_A)).json()
    assert raw == {"object": "file", "id": supervised.id, "bytes": len(jsonl(SUPERVISED, SUPERVISED)),
                   "created_at": supervised.created_at, "filename": "train.jsonl", "purpose": "fine-tune",
                   "status": "processed", "expires_at": None, "status_details": None}
    assert supervised.id.startswith("file-") and abs(supervised.created_at - time.time()) < 60
    assert batch.filename == "notes.txt"  # a name, never a path
    assert client.files.retrieve(rft.id) == rft

    listing = httpx.get(f"{served.url}/v1/files", headers=bearer(TOKEN_A)).json()
    assert listing == {"object": "list", "data": [batch.model_dump(), rft.model_dump(), supervised.model_dump()],
                       "has_more": False, "first_id": batch.id, "last_id": supervised.id}  # newest first
    assert [f.id for f in client.files.list(purpose="fine-tune")] == [rft.id, supervised.id]
    assert [f.id for f in client.files.list(order="asc")] == [supervised.id, rft.id, batch.id]
    first = client.files.list(limit=2)
    assert [f.id for f in first.data] == [batch.id, rft.id] and first.has_more
    assert [f.id for f in client.files.list(limit=2, after=rft.id).data] == [supervised.id]

    assert client.files.content(supervised.id).read() == jsonl(SUPERVISED, SUPERVISED)
    assert client.files.content(batch.id).read() == b"not JSON at all"

    # Deleting while paging (the SDK pages `after` the last id seen, which was just deleted) still reaches every file.
    seen = []
    for file in client.files.list(limit=1):
        seen.append(file.id)
        assert client.files.delete(file.id).model_dump() == {"id": file.id, "object": "file", "deleted": True}
    assert seen == [batch.id, rft.id, supervised.id]
    assert client.files.list().data == []
    assert refused(lambda: client.files.retrieve(batch.id)).status_code == 404
    assert refused(lambda: client.files.delete(batch.id)).status_code == 404
    assert served.stored() == stored_before and served.leftovers() == []


def test_uploads_that_are_not_files_of_a_known_purpose_are_refused(served):
    client = served.client()
    error = refused(lambda: client.files.create(file=("a.jsonl", jsonl(SUPERVISED)), purpose="fine-tune-results"))
    assert (error.status_code, error.body["param"]) == (400, "purpose")
    error = refused(lambda: client.files.create(file=("a.jsonl", b""), purpose="batch"))
    assert (error.status_code, error.body["param"], error.body["message"]) == (400, "file", "the file is empty")
    reply = httpx.post(f"{served.url}/v1/files", headers=bearer(TOKEN_A), json={"purpose": "batch"})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_content_type"
    reply = httpx.post(f"{served.url}/v1/files", headers=bearer(TOKEN_A), data={"purpose": "batch"},
                       files={"other": ("a.txt", b"x")})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "file"
    reply = httpx.get(f"{served.url}/v1/files", headers=bearer(TOKEN_A), params={"limit": "0"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "limit"
    reply = httpx.get(f"{served.url}/v1/files", headers={"Authorization": "Bearer wrong"})
    assert reply.status_code == 401 and reply.json()["error"]["type"] == "authentication_error"
    assert served.leftovers() == []


GOOD = json.dumps(SUPERVISED).encode()
ASSISTANT_CALL = {"role": "assistant", "content": None,
                  "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


def with_call(arguments: object) -> dict:
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return {"messages": [{"role": "user", "content": SECRET}, {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c", "content": "x"}, {"role": "assistant", "content": "ok"}]}


BAD_FILES = {
    "not JSON": (jsonl(GOOD, GOOD, f'{{"messages": [{{"role": "user", "content": "{SECRET}"'.encode()),
                 "line 3 is not valid JSON"),
    "not an object": (jsonl(GOOD, [SECRET]), "line 2: is not a JSON object"),
    "no messages": (jsonl({"prompt": SECRET, "completion": "x"}), "line 1: has no `messages` list"),
    "messages not a list": (jsonl(GOOD, {"messages": SECRET}), "line 2: `messages` is not a list"),
    "bad role": (jsonl(GOOD, b"", {"messages": [{"role": "user", "content": "q"}, {"role": SECRET, "content": "a"}]}),
                 "line 3: messages[1].role is missing or not one of system, developer, user, assistant, tool"),
    "no role": (jsonl({"messages": [{"content": SECRET}]}), "line 1: messages[0].role is missing"),
    "nothing to learn": (jsonl(GOOD, {"messages": [{"role": "user", "content": SECRET},
                                                   {"role": "assistant", "content": "a", "weight": 0}]}),
                         "line 2: has no assistant message to learn from"),
    "arguments an object": (jsonl(GOOD, with_call({"city": SECRET})),
                            "line 2: messages[1].tool_calls[0].function.arguments is not a JSON string"),
    "arguments not JSON": (jsonl(with_call(SECRET + "{")),
                           "line 1: messages[1].tool_calls[0].function.arguments is not a JSON string"),
    "tools not a list": (jsonl({**SUPERVISED, "tools": {"type": "function", "name": SECRET}}),
                         "line 1: `tools` is not a list of function schemas"),
    "tool not a function schema": (jsonl(GOOD, {**SUPERVISED, "tools": [{"name": SECRET}]}),
                                   "line 2: tools[0] is not a function schema"),
    "preference row": (jsonl({"input": {"messages": [{"role": "user", "content": SECRET}]},
                              "preferred_output": [{"role": "assistant", "content": "a"}],
                              "non_preferred_output": [{"role": "assistant", "content": "b"}]}),
                       "line 1: is a preference row (preferred_output / non_preferred_output): preference "
                       "fine-tuning is not supported"),
    "not UTF-8": (jsonl(GOOD, GOOD, SECRET.encode() + b"\xff\xfe"), "line 3 is not valid UTF-8 text"),
    "kinds mixed": (jsonl(GOOD, REINFORCEMENT), "line 2 is a reinforcement row"),
    "only blank lines": (b"\n  \n\r\n", "the file has no rows (it is empty or only blank lines)"),
    "lone surrogate": (jsonl(GOOD, b'{"messages": [{"role": "user", "content": "\\ud800"}]}'),
                       "line 2: `messages[0].content` holds invalid unicode"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_the_first_bad_line_is_named_without_its_content(served, case, caplog):
    content, expected = BAD_FILES[case]
    rows_before = served.rows()
    error = refused(lambda: served.client().files.create(file=("train.jsonl", content), purpose="fine-tune"))
    assert error.status_code == 400
    assert error.body["type"] == "invalid_request_error" and error.body["param"] == "file"
    assert error.body["code"] == "invalid_file_format"
    assert error.body["message"].startswith("invalid training file: " + expected), error.body["message"]
    assert SECRET not in error.body["message"] and SECRET not in caplog.text
    assert served.rows() == rows_before and served.leftovers() == []


def test_another_tenant_sees_nothing_and_reads_like_a_missing_file(served):
    owner, other = served.client(TOKEN_A), served.client(TOKEN_B)
    file = owner.files.create(file=("mine.jsonl", jsonl(SUPERVISED)), purpose="fine-tune")
    missing = "file-" + "x" * 24

    def answer(token: str, method: str, path: str) -> tuple[int, dict]:
        reply = httpx.request(method, f"{served.url}/v1/files/{path}", headers=bearer(token))
        body = reply.json()
        body["error"]["message"] = body["error"]["message"].replace(file.id, "ID").replace(missing, "ID")
        return reply.status_code, body

    for method, path in (("GET", "{}"), ("GET", "{}/content"), ("DELETE", "{}")):
        foreign = answer(TOKEN_B, method, path.format(file.id))
        assert foreign[0] == 404
        assert foreign == answer(TOKEN_B, method, path.format(missing))  # byte for byte the same answer
    for call in (other.files.retrieve, other.files.content, other.files.delete):
        assert isinstance(refused(lambda: call(file.id)), openai.NotFoundError)
    assert file.id not in [f.id for f in other.files.list()]
    foreign_after = httpx.get(f"{served.url}/v1/files", params={"after": file.id}, headers=bearer(TOKEN_B))
    missing_after = httpx.get(f"{served.url}/v1/files", params={"after": missing}, headers=bearer(TOKEN_B))
    assert foreign_after.status_code == 400 and foreign_after.json() == missing_after.json()
    # The owner still has it, untouched by the other tenant's delete.
    assert owner.files.content(file.id).read() == jsonl(SUPERVISED)
    owner.files.delete(file.id)


def test_an_upload_over_the_limit_is_413_and_leaves_nothing(served):
    client = served.client()
    rows_before, stored_before = served.rows(), served.stored()
    # Just over: the body passes the guard, the file part is cut off as it streams in.
    error = refused(lambda: client.files.create(file=("big.jsonl", b"x" * (LIMIT + 1)), purpose="batch"))
    assert (error.status_code, error.body["code"], error.body["param"]) == (413, "file_too_large", "file")
    # Far over: refused on its Content-Length before any byte is read.
    error = refused(lambda: client.files.create(file=("big.jsonl", b"x" * (4 * LIMIT)), purpose="batch"))
    assert error.status_code == 413
    # No Content-Length (chunked): cut off as it streams in.
    boundary = "b0undary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n"
            f"Content-Disposition: form-data; name=\"file\"; filename=\"big.jsonl\"\r\n\r\n").encode()

    def chunked():
        yield head
        for _ in range(2 * LIMIT // 4096):
            yield b"y" * 4096
        yield f"\r\n--{boundary}--\r\n".encode()

    reply = httpx.post(f"{served.url}/v1/files", content=chunked(),
                       headers={**bearer(TOKEN_A), "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert reply.status_code == 413 and reply.json()["error"]["type"] == "invalid_request_error"
    assert served.rows() == rows_before and served.leftovers() == []
    assert served.stored() == stored_before
    exactly = client.files.create(file=("edge.jsonl", b"z" * LIMIT), purpose="batch")  # the limit itself is allowed
    assert exactly.bytes == LIMIT
    client.files.delete(exactly.id)


def test_an_upload_cut_off_midway_leaves_nothing(served, caplog):
    rows_before = served.rows()
    boundary = "cut0ff"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n"
            f"Content-Disposition: form-data; name=\"file\"; filename=\"half.jsonl\"\r\n\r\n").encode()
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:  # promises 10 kB, sends 4 kB, hangs up
        sock.sendall(f"POST /v1/files HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN_A}\r\n"
                     f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: 10000\r\n\r\n".encode()
                     + head + b"h" * 4000)
        time.sleep(0.3)
    deadline = time.monotonic() + 10
    while "the upload was cut off" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "the upload was cut off" in caplog.text
    assert served.leftovers() == [] and served.rows() == rows_before
    # A body that ends (Content-Length honoured) without the multipart's closing boundary is no file either.
    reply = httpx.post(f"{served.url}/v1/files", content=head + b"h" * 100,
                       headers={**bearer(TOKEN_A), "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "upload_incomplete"
    assert served.leftovers() == [] and served.rows() == rows_before
    assert "half.jsonl" not in [f.filename for f in served.client().files.list()]


CRASHING_WRITER = """
import os, sys
from agent_rl.arbiter.files import FileStore
store = FileStore(sys.argv[1])
staged = store.stage()
staged.write(b'{"n": 1}\\n' * 5000)
if sys.argv[2] == "while writing":
    staged._file.flush()
    os._exit(9)
store._insert = lambda record: os._exit(9)  # dies after the rename, before the index row
store.commit(staged, "tenant-a", "crash.jsonl", "batch")
"""


def test_an_expired_file_is_gone(tmp_path):
    now = [1_800_000_000.0]
    store = FileStore(tmp_path / "files", clock=lambda: now[0])
    with store.stage() as staged:
        staged.write(b"{}\n")
        record = store.commit(staged, "tenant-a", "soon.jsonl", "batch", expires_at=int(now[0]) + 3600)
    assert store.get("tenant-a", record.id) == record
    now[0] += 3600
    assert store.get("tenant-a", record.id) is None and store.list("tenant-a").records == []
    assert store.open("tenant-a", record.id) is None and not store.delete("tenant-a", record.id)
    store.sweep()
    assert list((tmp_path / "files" / "content").iterdir()) == []


@pytest.mark.parametrize("moment", ["while writing", "between rename and index row"])
def test_a_crash_leaves_nothing_half_written_visible(tmp_path, moment):
    root = tmp_path / "files"
    FileStore(root).add("tenant-a", "kept.jsonl", "batch", b"{}\n")
    died = subprocess.run([sys.executable, "-c", CRASHING_WRITER, str(root), moment], capture_output=True, timeout=60)
    assert died.returncode == 9, died.stderr.decode()[-2000:]
    leftover = [*(root / "tmp").iterdir(), *(p for p in (root / "content").iterdir())]
    assert len(leftover) == 2  # the kept file and the crashed upload's bytes, somewhere on disk

    store = FileStore(root)  # a restarted arbiter: sees only the complete file
    page = store.list("tenant-a")
    assert [r.filename for r in page.records] == ["kept.jsonl"]
    assert all(store.get("tenant-a", p.name) is None for p in leftover if p.name != page.records[0].id)

    later = max(STALE_PART_S, ORPHAN_GRACE_S) + 60
    FileStore(root, clock=lambda: time.time() + later)  # the sweep removes what the crash left
    assert [p.name for p in (root / "content").iterdir()] == [page.records[0].id]
    assert list((root / "tmp").iterdir()) == []
    found = FileStore(root).open("tenant-a", page.records[0].id)
    assert found is not None
    with found[1] as content:
        assert content.read() == b"{}\n"
