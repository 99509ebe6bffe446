"""The agent's tools on a real SQLite store: schemas, scoping to one inbox and one day, errors for bad arguments."""

from __future__ import annotations

import inspect
import json
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.utils import get_json_schema

from agent_rl.environments.email.tools import (
    TOOL_NAMES,
    InboxTools,
    ToolConfig,
    call_tool,
    is_no_results,
    make_tools,
    tool_schemas,
)
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.environments.email.records import Email

ALICE = "alice@example.com"
BOB = "bob@example.com"
QUERY_DATE = datetime(2001, 6, 1, tzinfo=timezone.utc)


def _emails() -> list[Email]:
    return [
        Email(
            message_id="<a1@x>", inbox=ALICE, date=datetime(2001, 5, 3, 9, 30, tzinfo=timezone.utc),
            subject="Budget review", sender="carol@example.com", to=(ALICE,),
            body="The budget review meeting moved to Thursday May 10 at 3 pm in room 4B. " + "Filler text. " * 400,
        ),
        Email(
            message_id="<a2@x>", inbox=ALICE, date=datetime(2001, 5, 20, tzinfo=timezone.utc),
            subject="Lunch", sender="dave@example.com", to=(ALICE,), body="Lunch on Friday? The budget is fine.",
        ),
        Email(  # after the query date: the agent must not see it
            message_id="<a3@x>", inbox=ALICE, date=datetime(2001, 7, 1, tzinfo=timezone.utc),
            subject="Budget final", sender="carol@example.com", to=(ALICE,), body="The final budget is $2 million.",
        ),
        Email(
            message_id="<b1@x>", inbox=BOB, date=datetime(2001, 5, 4, tzinfo=timezone.utc),
            subject="Secret budget", sender="erin@example.com", to=(BOB,), body="Bob's secret budget is $9,999.",
        ),
    ]


@pytest.fixture
def store(sqlite_url):
    store = open_inbox_store(sqlite_url)
    store.add_emails(_emails())
    yield store
    store.close()


@pytest.fixture
def tools(store) -> InboxTools:
    return make_tools(store, ALICE, QUERY_DATE)


def _error(result: str) -> str:
    payload = json.loads(result)
    assert isinstance(payload, dict) and "error" in payload, result
    return payload["error"]


# -- schemas ------------------------------------------------------------------------------------


def test_schemas_come_out_of_get_json_schema_with_names_types_and_descriptions():
    schemas = {s["function"]["name"]: s["function"] for s in tool_schemas()}
    assert list(schemas) == list(TOOL_NAMES)

    search = schemas["search_emails"]["parameters"]
    assert search["required"] == ["keywords"]
    assert search["properties"]["keywords"]["type"] == "array"
    assert search["properties"]["keywords"]["items"] == {"type": "string"}
    for optional in ("sender", "sent_after", "sent_before"):
        assert search["properties"][optional]["type"] == "string"
        assert search["properties"][optional]["nullable"] is True
    assert search["properties"]["max_results"]["type"] == "integer"
    assert schemas["read_email"]["parameters"]["required"] == ["message_id"]
    answer = schemas["return_final_answer"]["parameters"]
    assert answer["required"] == ["answer", "sources"]
    assert answer["properties"]["sources"]["type"] == "array"
    for schema in schemas.values():
        assert schema["description"]
        assert all(prop["description"] for prop in schema["parameters"]["properties"].values())


def test_schemas_of_bound_methods_match_what_trl_would_render(tools):
    # TRL derives tool schemas from an environment's public methods: they must be exactly the tools.
    public = [name for name, _ in inspect.getmembers(InboxTools, predicate=inspect.isfunction) if not name.startswith("_")]
    assert sorted(public) == sorted(TOOL_NAMES)
    assert [get_json_schema(getattr(tools, name)) for name in TOOL_NAMES] == tools.schemas


def test_schemas_stay_short():
    # The schemas are part of every trained prompt.
    assert len(json.dumps(tool_schemas())) < 1600


# -- search -------------------------------------------------------------------------------------


def test_search_finds_own_inbox_emails_and_records_hit_ids(tools):
    hits = json.loads(tools.search_emails(["budget"]))
    ids = {hit["id"] for hit in hits}
    assert ids == {"<a1@x>", "<a2@x>"}  # not Bob's, not the future one
    assert {"id", "date", "from", "subject", "snippet"} <= set(hits[0])
    assert tools.trace.searches[0].keywords == ["budget"]
    assert set(tools.trace.searches[0].hit_ids) == ids
    assert tools.trace.seen_ids == ids


def test_search_needs_all_keywords_and_filters_by_sender_and_dates(tools):
    assert [h["id"] for h in json.loads(tools.search_emails(["budget", "review"]))] == ["<a1@x>"]
    assert [h["id"] for h in json.loads(tools.search_emails(["budget"], sender="dave@example.com"))] == ["<a2@x>"]
    assert [h["id"] for h in json.loads(tools.search_emails(["budget"], sent_after="2001-05-10"))] == ["<a2@x>"]
    assert [h["id"] for h in json.loads(tools.search_emails(["budget"], sent_before="2001-05-10"))] == ["<a1@x>"]
    assert json.loads(tools.search_emails(["budget"], max_results=1)).__len__() == 1


def test_sent_before_never_reaches_past_the_query_date(tools, store):
    late = tools.search_emails(["final"], sent_before="2002-01-01")
    assert late == 'No emails match all of the keywords ["final"].' and is_no_results(late)
    assert tools.trace.searches[-1].sent_before == "2001-06-01"
    # Without a query date the same email is visible.
    unbounded = make_tools(store, ALICE)
    assert [h["id"] for h in json.loads(unbounded.search_emails(["final"]))] == ["<a3@x>"]


def test_an_empty_search_says_so_in_words(tools):
    """A bare "[]" was a cue the small policy ignored (it invented an email id to read): the result names what
    was searched, and the reward-hacking checks still recognise it as no text seen."""
    result = tools.search_emails(["Stony Brook", "invoice"], sender="dave@example.com")
    assert result == 'No emails match all of the keywords ["Stony Brook","invoice"] from dave@example.com.'
    assert tools.trace.searches[-1].hit_ids == []
    assert is_no_results(result) and is_no_results("[]") and not is_no_results(tools.search_emails(["budget"]))


def test_snippets_are_short(store):
    tools = make_tools(store, ALICE, QUERY_DATE, ToolConfig(snippet_chars=40))
    for hit in json.loads(tools.search_emails(["budget"])):
        assert len(hit["snippet"]) <= 40


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"keywords": "budget"}, "list of strings"),
        ({"keywords": []}, "at least one"),
        ({"keywords": ["  "]}, "at least one"),
        ({"keywords": ["budget", 3]}, "must be a string"),
        ({"keywords": ["budget"], "max_results": 11}, "max_results"),
        ({"keywords": ["budget"], "max_results": 0}, "max_results"),
        ({"keywords": ["budget"], "max_results": "5"}, "max_results"),
        ({"keywords": ["budget"], "max_results": True}, "max_results"),
        ({"keywords": ["budget"], "sent_after": "last week"}, "sent_after"),
        ({"keywords": ["budget"], "sent_before": 20010501}, "sent_before"),
        ({"keywords": ["budget"], "sender": ["carol"]}, "sender"),
        ({"keywords": ["x" * 200]}, "characters"),
    ],
)
def test_bad_search_arguments_give_the_model_an_error_naming_the_argument(tools, arguments, expected):
    message = _error(tools.search_emails(**arguments))
    assert expected in message
    assert tools.trace.errors[-1].tool == "search_emails"
    assert tools.trace.searches == []


# -- read ---------------------------------------------------------------------------------------


def test_read_returns_the_email_and_records_the_read(tools):
    email = json.loads(tools.read_email("<a2@x>"))
    assert email["id"] == "<a2@x>"
    assert email["from"] == "dave@example.com"
    assert email["to"] == [ALICE]
    assert email["subject"] == "Lunch"
    assert "Lunch on Friday" in email["body"]
    assert tools.trace.reads == ["<a2@x>"]


def test_long_bodies_are_cut(store):
    tools = make_tools(store, ALICE, QUERY_DATE, ToolConfig(body_chars=300))
    body = json.loads(tools.read_email("<a1@x>"))["body"]
    assert body.startswith("The budget review meeting") and len(body) <= 310


@pytest.mark.parametrize("message_id", ["<b1@x>", "<a3@x>", "<nope@x>"], ids=["other-inbox", "future", "unknown"])
def test_other_inbox_future_and_unknown_emails_are_not_found(tools, message_id):
    result = tools.read_email(message_id)
    assert "not found" in _error(result)
    assert "secret" not in result.lower() and "million" not in result
    assert tools.trace.reads == []


def test_read_rejects_non_string_ids(tools):
    assert "message_id" in _error(tools.read_email(42))  # type: ignore[arg-type]


# -- answer and dispatch ------------------------------------------------------------------------


def test_final_answer_is_recorded_once(tools):
    assert tools.return_final_answer("Thursday May 10 at 3 pm", ["<a1@x>", "<a1@x>"]) == "Answer recorded."
    assert tools.trace.final_answer == "Thursday May 10 at 3 pm"
    assert tools.trace.sources == ["<a1@x>"]
    assert "already" in _error(tools.return_final_answer("again", []))
    assert tools.trace.final_answer == "Thursday May 10 at 3 pm"


@pytest.mark.parametrize(
    ("answer", "sources", "expected"),
    [("", [], "answer"), (None, [], "answer"), ("x", "<a1@x>", "sources"), ("x", [1], "sources")],
)
def test_bad_final_answers_are_errors_and_not_recorded(tools, answer, sources, expected):
    assert expected in _error(tools.return_final_answer(answer, sources))
    assert not tools.trace.answered


def test_call_tool_checks_names_and_arguments(tools):
    assert "unknown tool" in _error(call_tool(tools, "delete_emails", {}))
    assert "JSON object" in _error(call_tool(tools, "read_email", ["<a1@x>"]))
    assert "unknown argument" in _error(call_tool(tools, "read_email", {"id": "<a1@x>"}))
    assert "missing" in _error(call_tool(tools, "return_final_answer", {"answer": "x"}))
    assert json.loads(call_tool(tools, "read_email", {"message_id": "<a1@x>"}))["id"] == "<a1@x>"
    assert len(tools.trace.errors) == 4


# -- no exception escapes -----------------------------------------------------------------------

anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
keywordish = st.lists(st.text(max_size=20), max_size=10) | anything
dateish = st.none() | st.dates().map(str) | st.datetimes().map(lambda d: d.isoformat()) | anything


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keywords=keywordish, sender=anything, after=dateish, before=dateish, max_results=anything, message_id=anything,
       answer=anything, sources=anything)
def test_no_argument_makes_a_tool_raise(tools, keywords, sender, after, before, max_results, message_id, answer, sources):
    for result in (
        tools.search_emails(keywords, sender, after, before, max_results),
        tools.read_email(message_id),
        call_tool(tools, "search_emails", {"keywords": keywords, "max_results": max_results}),
        call_tool(tools, str(message_id), {"message_id": message_id}),
        tools.return_final_answer(answer, sources),
    ):
        assert isinstance(result, str)
        assert result == "Answer recorded." or is_no_results(result) or isinstance(json.loads(result), (list, dict))


def test_search_shows_five_hits_unless_asked_for_more(store):
    from agent_rl.environments.email.tools import DEFAULT_RESULTS

    for i in range(8):
        store.add_emails([Email(message_id=f"<many{i}@x>", inbox=ALICE, date=datetime(2001, 5, 1, i, tzinfo=timezone.utc),
                                subject=f"Widget note {i}", sender="pat@example.com", to=(ALICE,), body="widget widget")])
    tools = make_tools(store, ALICE, QUERY_DATE)
    assert DEFAULT_RESULTS == 5
    assert len(json.loads(tools.search_emails(["widget"]))) == 5
    assert len(json.loads(tools.search_emails(["widget"], max_results=8))) == 8
