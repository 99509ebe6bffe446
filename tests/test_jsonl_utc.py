"""The one JSONL reader and the one UTC rule the library shares."""

from datetime import datetime, timedelta, timezone

import pytest

from agent_rl.curation.datasets import load_jsonl
from agent_rl.jsonl import read_jsonl
from agent_rl.train.sft import read_jsonl as sft_read_jsonl
from agent_rl.utc import as_utc


def test_every_jsonl_reader_is_the_one(tmp_path):
    assert load_jsonl is read_jsonl and sft_read_jsonl is read_jsonl
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"b": [2]}\n', encoding="utf-8")
    assert read_jsonl(path) == [{"a": 1}, {"b": [2]}]


@pytest.mark.parametrize("text, expected", [
    ('{"a": 1}\n{"a": \n', r"rows.jsonl:2: not a JSON object"),
    ('{"a": 1}\n[1, 2]\n', r"rows.jsonl:2: expected a JSON object, got list"),
])
def test_a_bad_line_is_named_with_its_file_and_number(tmp_path, text, expected):
    path = tmp_path / "rows.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=expected):
        read_jsonl(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_naive_dates_are_utc_and_others_are_converted():
    assert as_utc(datetime(2001, 5, 31, 9)) == datetime(2001, 5, 31, 9, tzinfo=timezone.utc)
    eastern = datetime(2001, 5, 31, 9, tzinfo=timezone(timedelta(hours=-4)))
    converted = as_utc(eastern)
    assert converted == eastern and converted.tzinfo == timezone.utc and converted.hour == 13
