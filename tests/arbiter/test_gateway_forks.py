"""A streamed call that forks names its own episode in the `X-Agent-RL-Episode` header, on several workers.

A fork (a call sent a conversation state another call already extended) is decided before the upstream is
asked, so the header a streamed reply sends first names the episode its last chunk and the pool name. Two
arbiters in this process on one pool stand for two workers (each has its own cache, as a worker process has);
the official `openai` client talks to them over HTTP and the OpenAI stub upstream streams the replies.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import openai
import pytest

from tests.arbiter.test_gateway import (
    TOKEN_A,
    TOOLS,
    StreamedMessage,
    all_episodes,
    canonical,
    end,
    gateway,
    stub_responder,
    stub_spec,
    upstream_key,  # noqa: F401 (fixture)
)
from tests.openai_stub import delay, fail, openai_stub  # noqa: F401 (fixture)


def streamed(client: openai.OpenAI, messages: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any]]:
    """A streamed call: the header's episode id, the last chunk's, and the reply the chunks add up to."""
    raw = client.chat.completions.with_raw_response.create(model="x", messages=messages, tools=TOOLS[:1], stream=True)
    header = raw.headers["x-agent-rl-episode"]
    reply, last = StreamedMessage(), None
    for chunk in raw.parse():
        last = (chunk.model_extra or {}).get("agent_rl", {}).get("episode_id", last)
        reply.add(chunk)
    return header, last, reply.message()


@contextmanager
def two_workers(store_url: str, spec: str) -> Iterator[tuple[str, str, openai.OpenAI, openai.OpenAI]]:
    """Two arbiters on one pool (two workers) routing everything to `spec`, and a client of each."""
    with gateway(store_url, {"stub": 1.0}, {"stub": spec}) as url_a, \
            gateway(store_url, {"stub": 1.0}, {"stub": spec}) as url_b:
        yield (url_a, url_b, openai.OpenAI(base_url=f"{url_a}/v1", api_key=TOKEN_A, max_retries=0),
               openai.OpenAI(base_url=f"{url_b}/v1", api_key=TOKEN_A, max_retries=0))


def started(client: openai.OpenAI) -> tuple[str, list[dict[str, Any]]]:
    """A conversation's first call: its episode, and the state its next call sends (the reply, a tool result)."""
    start = [{"role": "user", "content": "What is 6 * 7?"}]
    first = client.chat.completions.with_raw_response.create(model="x", messages=start, tools=TOOLS[:1])
    message = first.parse().choices[0].message
    follow = [*start, message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "42"}]
    return first.headers["x-agent-rl-episode"], follow


def test_a_streamed_fork_on_a_stale_worker_names_the_fork_in_its_header(store_url, openai_stub, upstream_key):
    openai_stub.script(stub_responder)
    openai_stub.streams = True
    spec = stub_spec(openai_stub)
    with two_workers(store_url, spec) as (url_a, url_b, a, b):
        parent, follow = started(a)
        # Worker B continues the episode; worker A, which recorded the reply before, is sent the same state again.
        second = b.chat.completions.with_raw_response.create(model="x", messages=follow, tools=TOOLS[:1])
        assert second.headers["x-agent-rl-episode"] == parent
        header, last, reply = streamed(a, follow)
        assert header == last != parent
        assert end(url_a, TOKEN_A, header).status_code == 200
        assert end(url_b, TOKEN_A, parent).status_code == 200
    stored = all_episodes(store_url)
    assert set(stored) == {parent, header}
    assert stored[parent].turns == 2 and stored[header].turns == 1
    assert canonical(stored[header].messages) == canonical([*follow, reply])
    assert stored[header].policy_version == stored[parent].policy_version  # a fork stays on its version


def test_the_first_of_two_racing_calls_keeps_the_episode_its_streamed_header_named(store_url, openai_stub,
                                                                                     upstream_key):  # fmt: skip
    # The streamed call's upstream answers late; meanwhile worker B is sent the same state.
    openai_stub.script(lambda request: delay(1.0, stub_responder(request)) if request.get("stream")
                       else stub_responder(request))
    openai_stub.streams = True
    spec = stub_spec(openai_stub)
    with two_workers(store_url, spec) as (url_a, url_b, a, b):
        parent, follow = started(a)
        asked = len(openai_stub.requests)
        got: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: got.update(zip(("header", "last", "reply"), streamed(a, follow))))
        thread.start()
        deadline = time.monotonic() + 30
        while len(openai_stub.requests) == asked and time.monotonic() < deadline:
            time.sleep(0.01)  # the streamed call has reached the upstream
        other = b.chat.completions.with_raw_response.create(model="x", messages=follow, tools=TOOLS[:1])
        thread.join(30)
        assert got["header"] == got["last"] == parent  # the first call took the episode before the upstream answered
        branch = other.headers["x-agent-rl-episode"]
        assert branch != parent and other.parse().model_extra["agent_rl"]["episode_id"] == branch
        for episode in (parent, branch):
            assert end(url_b, TOKEN_A, episode).status_code == 200
    stored = all_episodes(store_url)
    assert set(stored) == {parent, branch}
    assert stored[parent].turns == 2 and canonical(stored[parent].messages) == canonical([*follow, got["reply"]])
    assert stored[branch].turns == 1


def test_a_call_that_got_no_reply_leaves_its_conversation_to_continue_on_any_worker(store_url, openai_stub,
                                                                                      upstream_key):  # fmt: skip
    openai_stub.script(stub_responder)
    openai_stub.streams = True
    spec = stub_spec(openai_stub)
    with two_workers(store_url, spec) as (url_a, url_b, a, b):
        parent, follow = started(a)
        openai_stub.queue(fail(400), fail(400))
        for stream in (True, False):  # worker B claimed the transcript, the upstream refused: B gives it back
            with pytest.raises(openai.APIStatusError):
                b.chat.completions.create(model="x", messages=follow, tools=TOOLS[:1], stream=stream)
        header, last, reply = streamed(a, follow)
        assert header == last == parent
        assert end(url_b, TOKEN_A, parent).status_code == 200
    stored = all_episodes(store_url)
    assert set(stored) == {parent} and stored[parent].turns == 2
    assert canonical(stored[parent].messages) == canonical([*follow, reply])
