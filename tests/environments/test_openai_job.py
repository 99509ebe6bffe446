"""An OpenAI fine-tuning job's files as an environment: rows checked line by line, tasks by split, replies in words
graded by the job's grader through the episode runner and GRPO's rollouts, the same as any plug-in."""

from __future__ import annotations

import json

import pytest

from agent_rl.agent.policy import PolicyTurn, ToolCall
from agent_rl.environments.runner import Play, play_episodes
from agent_rl.environments.core import EnvironmentError
from agent_rl.environments.openai_jobs import JobFileError, Method, OpenAIJobEnvironment, read_rows
from agent_rl.environments.registry import load_environment
from agent_rl.records import Outcome, Split
from agent_rl.train.plugin_rollouts import rollout_class

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


def rft_line(country: str, capital: str) -> str:
    return json.dumps({"messages": [{"role": "developer", "content": "Answer with the city only."},
                                    {"role": "user", "content": f"What is the capital of {country}?"}],
                       "capital": capital})


def sft_line(country: str, capital: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": f"What is the capital of {country}?"},
                                    {"role": "assistant", "content": capital}]})


class Atlas:
    """Answers in words from a table (wrong for Peru), or with a tool call when asked to."""

    version = "atlas"

    def __init__(self, call_tools: bool = False) -> None:
        self.call_tools = call_tools

    def act(self, conversations, tools, max_new_tokens):
        turns = []
        for messages in conversations:
            country = messages[-1]["content"].rsplit(" ", 1)[-1].rstrip("?")
            if self.call_tools:
                turns.append(PolicyTurn(tool_calls=[ToolCall(name="lookup", arguments={"country": country})]))
            else:
                turns.append(PolicyTurn(content="Lim" if country == "Peru" else CAPITALS[country].lower()))
        return turns


def job(tmp_path, method="reinforcement", grader=MULTI, lines=None, validation=None):
    (tmp_path / "job.json").write_text(json.dumps({"method": method, "grader": grader}))
    (tmp_path / "train.jsonl").write_text("\n".join(lines or [rft_line(c, k) for c, k in CAPITALS.items()]) + "\n")
    if validation:
        (tmp_path / "validation.jsonl").write_text("\n".join(validation) + "\n")
    return tmp_path


def test_a_reinforcement_job_grades_replies_in_words_with_its_multi_grader(tmp_path):
    env = load_environment("openai_job", job_dir=str(job(tmp_path, validation=[rft_line("Peru", "Lima")])))
    assert env.tool_names() == () and env.tool_schemas() == []
    assert len(env.tasks(Split.TRAIN)) == 5 and [t.prompt for t in env.tasks(Split.TEST)] == [
        "What is the capital of Peru?"]
    tasks = env.tasks(Split.TRAIN)
    assert env.opening_messages(tasks[0])[0] == {"role": "system", "content": "Answer with the city only."}
    episodes = play_episodes(Atlas(), env, [Play(t) for t in [*tasks, *env.tasks(Split.TEST)]])
    by_question = {e.question.rsplit(" ", 1)[-1].rstrip("?"): e for e in episodes}
    paris = by_question["France"]
    assert paris.outcome == Outcome.CORRECT and paris.final_answer == "paris"
    # ilike ignores case; the fuzzy ratio does not ("paris" vs "Paris": 0.8): 0.75 * 1 + 0.25 * 0.8.
    assert paris.reward == pytest.approx(0.95) and paris.reward_components["grader.exact"] == 1.0
    # "Lim" vs "Lima": not equal, fuzzy ratio 6/7 -> 0.25 * 0.857; below the pass threshold.
    lima = by_question["Peru"]
    assert lima.outcome == Outcome.WRONG and lima.reward == pytest.approx(0.25 * 6 / 7, abs=1e-3)
    assert lima.messages[-1] == {"role": "assistant", "content": "Lim"}


def test_a_tool_call_in_a_job_without_tools_breaks_the_format(tmp_path):
    env = OpenAIJobEnvironment(job_dir=str(job(tmp_path)))
    episode, = play_episodes(Atlas(call_tools=True), env, [Play(env.tasks(Split.TRAIN)[0])])
    assert episode.outcome == Outcome.FORMAT_ERROR and episode.reward == 0.0


def test_a_supervised_job_is_judged_against_each_rows_reply_and_holds_out_a_stable_tenth(tmp_path):
    countries = {f"Land{i}": f"City{i}" for i in range(40)}
    lines = [sft_line(c, k) for c, k in countries.items()]
    env = OpenAIJobEnvironment(job_dir=str(job(tmp_path, method="supervised", grader=None, lines=lines)))
    train, test = env.tasks(Split.TRAIN), env.tasks(Split.TEST)
    assert len(train) + len(test) == 40 and 1 <= len(test) < 10
    assert {t.id for t in test} == {t.id for t in OpenAIJobEnvironment(job_dir=str(tmp_path)).tasks(Split.TEST)}
    task = test[0]
    assert task.metadata["messages"] == [{"role": "user", "content": task.prompt}]  # the reply is the target
    assert task.reference == countries[task.prompt.rsplit(" ", 1)[-1].rstrip("?")]


@pytest.mark.parametrize(("line", "problem"), [
    ("{not json", "line 2: not valid JSON"),
    ('["a list"]', "line 2: is not a JSON object"),
    ('{"messages": []}', "line 2: `messages` is empty"),
    ('{"messages": [{"role": "robot", "content": "hi"}]}', "line 2: messages[0].role is missing or not one of"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}',
     "line 2: a reinforcement row's last message must be from the user"),
    ('{"messages": [{"role": "user", "content": "q"}], "tools": "search"}', "line 2: `tools` is not a list"),
    ('{"input": {}, "preferred_output": [], "non_preferred_output": []}', "line 2: is a preference row"),
])
def test_a_bad_line_is_named_by_its_number_without_its_content(line, problem):
    with pytest.raises(JobFileError) as error:
        read_rows([rft_line("France", "Paris"), line], Method.REINFORCEMENT)
    assert str(error.value).startswith(problem) and error.value.line == 2
    assert "hi" not in str(error.value).replace("messages", "").replace("which", "")


def test_supervised_rows_need_a_reply_in_words_and_calls_with_json_arguments():
    call = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                  "function": {"name": "f", "arguments": "{oops"}}]}
    bad = [
        ({"messages": [{"role": "user", "content": "q"}]}, "needs an assistant message"),
        ({"messages": [{"role": "user", "content": "q"}, call]}, "arguments must be a JSON object"),
        ({"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]},
         "no user message before it"),
    ]
    for row, problem in bad:
        with pytest.raises(JobFileError, match=problem):
            read_rows([json.dumps(row)], Method.SUPERVISED)
    with pytest.raises(JobFileError, match="holds no rows"):
        read_rows(["", "  "], Method.SUPERVISED)
    with pytest.raises(JobFileError, match="line 1: not UTF-8"):
        read_rows([b"\xff\xfe{}"], Method.SUPERVISED)


def test_a_grader_naming_a_field_the_rows_lack_is_refused_when_the_job_is_built(tmp_path):
    grader = {**MULTI["graders"]["exact"], "reference": "{{ item.answer }}"}
    with pytest.raises(ValueError, match="answer"):
        OpenAIJobEnvironment(job_dir=str(job(tmp_path, grader=grader)))
    with pytest.raises(EnvironmentError, match="needs a grader"):
        OpenAIJobEnvironment(method="reinforcement", train_rows=read_rows([rft_line("Peru", "Lima")],
                                                                          Method.REINFORCEMENT))
    (tmp_path / "train.jsonl").write_text(rft_line("Peru", "Lima") + "\n{broken\n")
    with pytest.raises(EnvironmentError, match="train.jsonl: line 2: not valid JSON"):
        OpenAIJobEnvironment(job_dir=str(tmp_path))


def test_grpo_rollouts_of_a_job_take_the_reply_in_words_as_the_answer(tmp_path):
    env = OpenAIJobEnvironment(job_dir=str(job(tmp_path)))
    task = next(t for t in env.tasks(Split.TRAIN) + env.tasks(Split.TEST) if "France" in t.prompt)
    rollout = rollout_class(env, max_turns=2)()
    rollout.reset(prompt=env.opening_messages(task), task=task.model_dump(mode="json"))
    right = rollout._observe([{"role": "assistant", "content": CAPITALS["France"]}])
    assert right.outcome == Outcome.CORRECT and right.format_error is None and right.judgement.reward == 1.0
    rollout.reset(prompt=env.opening_messages(task), task=task.model_dump(mode="json"))
    garbled = rollout._observe([{"role": "assistant", "content": '<tool_call>{"name": "x"'}])
    assert garbled.outcome == Outcome.FORMAT_ERROR and garbled.judgement.reward == 0.0


def test_the_anonymized_copy_rewrites_rows_and_grades_against_the_rewritten_item(tmp_path):
    env = OpenAIJobEnvironment(job_dir=str(job(tmp_path)))
    copy = env.world().anonymized(lambda text: text.replace("Paris", "Lutetia"))
    task = next(t for t in copy.tasks(Split.TRAIN) + copy.tasks(Split.TEST) if "France" in t.prompt)
    assert task.metadata["item"]["capital"] == "Lutetia"
    episode, = play_episodes(Atlas(), copy, [Play(task)])
    assert episode.outcome == Outcome.WRONG  # "paris" no longer matches the rewritten reference


def test_a_job_survives_the_pickle_curation_saves_its_anonymized_world_with(tmp_path):
    import pickle

    env = OpenAIJobEnvironment(job_dir=str(job(tmp_path)))
    again = pickle.loads(pickle.dumps(env.world().anonymized(lambda text: text.replace("Paris", "PARIS"))))
    task = next(t for t in again.tasks(Split.TRAIN) + again.tasks(Split.TEST) if "France" in t.prompt)
    episode, = play_episodes(Atlas(), again, [Play(task)])
    assert episode.outcome == Outcome.CORRECT  # ilike: "paris" matches the rewritten "PARIS"
