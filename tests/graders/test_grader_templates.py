"""Templates read item and sample fields as OpenAI's do; a missing item field is an error when the job is set up."""

from __future__ import annotations

import pytest

from agent_rl.graders import GraderConfigError, TemplateError, grade, make_sample, problems, validate
from agent_rl.graders.templates import render


def check(input_template: str, reference_template: str, operation: str = "eq") -> dict:
    return {"type": "string_check", "name": "check", "input": input_template, "reference": reference_template,
            "operation": operation}  # fmt: skip


ITEM = {"answer": {"city": "Paris", "country": "France"}, "cities": ["Lyon", "Nice"], "count": 42, "flag": None}


def test_nested_item_fields_and_list_elements():
    sample = make_sample("Paris, France")
    grader = check("{{ sample.output_text }}", "{{ item.answer.city }}, {{item.answer.country}}")
    assert grade(grader, sample, ITEM).score == 1.0
    assert render("{{ item.cities[1] }} {{ item.cities.0 }}", sample, ITEM) == ("Nice Lyon", [])
    assert render('{{ item["answer"].city }}', sample, ITEM) == ("Paris", [])


def test_values_that_are_not_strings_render_as_json():
    sample = make_sample("x")
    assert render("{{ item.count }}|{{ item.flag }}|{{ item.cities }}", sample, ITEM) == ('42|null|["Lyon", "Nice"]', [])


def test_output_json_is_the_reply_parsed_when_it_is_an_object():
    sample = make_sample('{"city": "Paris", "facts": {"population": 2102650}}')
    assert sample["output_json"] == {"city": "Paris", "facts": {"population": 2102650}}
    assert grade(check("{{ sample.output_json.city }}", "{{ item.answer.city }}"), sample, ITEM).score == 1.0
    assert render("{{ sample.output_json.facts.population }}", sample, ITEM) == ("2102650", [])
    assert make_sample("Paris")["output_json"] is None
    assert make_sample("[1, 2]")["output_json"] is None  # OpenAI: a JSON object, not any JSON


def test_output_tools_render_as_the_tool_calls_json():
    call = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "Paris"}'}}
    sample = make_sample("", [call])
    assert render("{{ sample.output_tools[0].function.name }}", sample, ITEM) == ("search", [])
    text, _ = render("{{ sample.output_tools }}", sample, ITEM)
    assert text == '[{"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{\\"q\\": \\"Paris\\"}"}}]'
    assert sample["choices"][0]["message"]["tool_calls"] == [call]


def test_a_missing_item_field_is_refused_at_validation_naming_the_field():
    grader = check("{{ sample.output_text }}", "{{ item.answer.capital }}")
    with pytest.raises(ValueError) as raised:
        validate(grader, ITEM)
    message = str(raised.value)
    assert "item.answer.capital" in message and "'capital'" in message
    assert "fields there: city, country" in message
    with pytest.raises(ValueError, match=r"item\.reference_answer"):
        validate(check("{{ sample.output_text }}", "{{ item.reference_answer }}"), ITEM)
    with pytest.raises(ValueError, match=r"item\.cities\.5"):
        validate(check("{{ sample.output_text }}", "{{ item.cities[5] }}"), ITEM)


def test_a_missing_item_field_at_grading_raises_instead_of_scoring_zero():
    grader = check("{{ sample.output_text }}", "{{ item.answer.capital }}", "ne")
    with pytest.raises(TemplateError, match=r"item\.answer\.capital"):
        grade(grader, make_sample("anything"), ITEM)


def test_unknown_namespaces_sample_fields_and_bad_paths_are_refused_at_validation():
    with pytest.raises(GraderConfigError, match="unknown namespace 'items'"):
        validate(check("{{ items.answer }}", "x"), ITEM)
    with pytest.raises(GraderConfigError, match="the sample has no field 'output'"):
        validate(check("{{ sample.output }}", "x"), ITEM)
    with pytest.raises(GraderConfigError, match="name a variable"):
        validate(check("{{ item }}", "x"), ITEM)
    with pytest.raises(GraderConfigError, match="cannot read the path"):
        validate(check("{{ item.answer city }}", "x"), ITEM)
    validate(check("{{ sample.output_json.anything.at.all }}", "{{ item.answer.city }}"), ITEM)  # sample paths: any


def test_a_missing_sample_field_renders_empty_and_says_so():
    grader = check("{{ sample.output_json.city }}", "{{ item.answer.city }}")
    result = grade(grader, make_sample("Paris (not JSON)"), ITEM)
    assert result.score == 0.0
    assert result.reason == "sample.output_json.city is missing from the sample"


def test_validation_lists_every_problem_of_a_multi_grader():
    grader = {
        "type": "multi", "name": "both", "calculate_output": "a + b",
        "graders": {"a": check("{{ sample.output_text }}", "{{ item.missing_one }}"),
                    "b": check("{{ sample.output_text }}", "{{ item.answer.missing_two }}")},
    }  # fmt: skip
    found = problems(grader, ITEM)
    assert len(found) == 2
    assert "graders.a" in found[0] and "item.missing_one" in found[0]
    assert "graders.b" in found[1] and "item.answer.missing_two" in found[1]
    assert problems(check("{{ sample.output_text }}", "{{ item.answer.city }}"), ITEM) == []
