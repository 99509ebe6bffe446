"""GRPO on a plug-in environment (examples/timetable.py): the rollout objects TRL gets expose the environment's
tools with the schemas serving shows, each row gets a fresh session, the environment's own judge scores the
rollout, and a real TRL step on the tiny model trains through them."""

from __future__ import annotations

import json

import pytest
from transformers.utils import get_json_schema

from agent_rl.curation.datasets import save_jsonl
from agent_rl.records import Outcome, Split
from agent_rl.train.plugin_rollouts import rollout_class, rollout_groups, task_rows
from examples.timetable import TRAINS, TimetableEnvironment


def _call(name: str, **arguments) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def test_rollout_objects_offer_the_environments_tools_in_its_order_with_its_schemas():
    env = TimetableEnvironment()
    rollout = rollout_class(env, max_turns=4)()
    offered = [name for name in dir(type(rollout)) if not name.startswith("_") and callable(getattr(rollout, name))
               and name not in ("reset",)]
    assert sorted(offered) == sorted(env.tool_names())
    # What TRL renders into the prompt (get_json_schema of the bound method) is what serving and SFT show.
    assert [get_json_schema(getattr(rollout, name)) for name in env.tool_names()] == env.tool_schemas()


def test_each_row_gets_a_fresh_session_and_the_environments_judge_scores_it():
    env = TimetableEnvironment()
    train = env.tasks(Split.TRAIN)
    answerable = next(t for t in train if t.category == "departure")
    rows = task_rows(env, [answerable])
    assert rows[0]["prompt"] == env.opening_messages(answerable) and rows[0]["task_id"] == answerable.id
    rollout = rollout_class(env, max_turns=4)()
    rollout.reset(**rows[0])
    train_id = answerable.metadata["trains"][0]
    departs = TRAINS[train_id][2]
    rollout.train_details(train_id=train_id)
    rollout.reply(answer=departs, trains=[train_id])
    completion = [_call("train_details", train_id=train_id), {"role": "tool", "name": "train_details", "content": "{}"},
                  _call("reply", answer=departs, trains=[train_id]), {"role": "tool", "name": "reply", "content": "ok"},
                  {"role": "assistant", "content": "Anything else?"}]  # TRL's turn after the answer: not counted
    observation = rollout._observe(completion)
    assert observation.outcome == Outcome.CORRECT and observation.format_error is None
    assert observation.turns == 2 and observation.tool_calls == 2
    groups, components = rollout_groups(observation)
    assert groups["outcome"] == pytest.approx(1.2) and components["citations"] == pytest.approx(0.2)

    rollout.reset(**rows[0])  # the pooled instance is rebound: nothing of the last rollout remains
    assert env.final_answer(rollout._session) is None
    plain = rollout._observe([{"role": "assistant", "content": "It leaves at noon."}])
    assert plain.outcome == Outcome.FORMAT_ERROR and plain.format_error.value == "no_tool_call"
    assert rollout_groups(plain)[0]["format"] == pytest.approx(-1.0)


def test_a_row_without_its_task_is_refused_naming_the_row():
    rollout = rollout_class(TimetableEnvironment(), max_turns=4)()
    with pytest.raises(ValueError, match="tt-1.*'task'"):
        rollout.reset(prompt=[], task_id="tt-1")


REPLY_CALL = '{"name": "reply", "arguments": {"answer": "I don\'t know", "trains": []}}'


def test_grpo_trains_on_a_plugin_environment_with_its_judge_as_reward(tmp_path):
    from tests.train.test_sft_grpo import _forced_tool_call_bias

    from agent_rl.agent.models import build_tiny_model
    from agent_rl.train.config import GRPOSettings, PromptFilterSettings
    from agent_rl.train.grpo import train_grpo

    tiny = build_tiny_model(tmp_path / "tiny")
    env = TimetableEnvironment()
    tasks = env.tasks(Split.TRAIN)
    picked = [next(t for t in tasks if t.category == "no_connection"), next(t for t in tasks if t.category == "departure")]
    save_jsonl(task_rows(env, picked), tmp_path / "rows.jsonl")
    settings = GRPOSettings(
        max_steps=1, num_generations=2, per_device_train_batch_size=4, gradient_accumulation_steps=1,
        max_completion_length=600, max_tool_calling_iterations=2, prompt_filter=PromptFilterSettings(mode="none"),
        generation_kwargs={"sequence_bias": _forced_tool_call_bias(tiny, REPLY_CALL)},
    )
    result = train_grpo(tiny, None, tmp_path / "rows.jsonl", None, tmp_path / "grpo", settings,
                        environment="examples.timetable:TimetableEnvironment")
    assert (result.adapter_dir / "adapter_model.safetensors").is_file() and result.steps == 1
    rollouts = [json.loads(line) for line in result.rollouts_path.read_text().splitlines()]
    assert len(rollouts) == 4 and result.tool_calls >= 4
    by_task = {r["task_id"]: r for r in rollouts}
    # The timetable judge decided: "I don't know" is right where no train runs, an IDK elsewhere.
    assert by_task[picked[0].id]["outcome"] == "correct" and by_task[picked[1].id]["outcome"] == "idk"
    assert by_task[picked[0].id]["reward"] == pytest.approx(1.2) and by_task[picked[1].id]["reward"] == pytest.approx(0.0)
    assert all(m["name"] == "reply" for r in rollouts for m in r["messages"] if m["role"] == "tool")


def test_the_sampled_prompt_filter_plays_a_plugins_rows_and_refuses_several_environments_at_once(tmp_path,
                                                                                               monkeypatch):
    """Every environment's GRPO rows carry their task, so the sampled pre-pass plays a plug-in's rows as its
    runner plays its tasks (the teacher here stands in for the sampled model); it plays one environment, so a run
    over several refuses it before any work."""
    import agent_rl.agent.local_policy as local_policy
    from agent_rl.train.config import GRPOSettings, PromptFilterSettings
    from agent_rl.train.grpo import train_grpo
    from agent_rl.train.prompt_filter import row_task, sampled_solve_rates

    env = TimetableEnvironment()
    tasks = env.tasks(Split.TRAIN)[:3]
    rows = task_rows(env, tasks)
    assert [row_task(row) for row in rows] == tasks
    monkeypatch.setattr(local_policy, "LocalPolicy", lambda *args, **kwargs: env.teacher())
    rates = sampled_solve_rates("model", None, rows, env, PromptFilterSettings(mode="sampled", samples_per_prompt=2),
                                max_turns=4)
    assert rates == {task.id: 1.0 for task in tasks}  # the teacher answers its own timetable right

    save_jsonl(rows, tmp_path / "rows.jsonl")
    with pytest.raises(ValueError, match="'sampled' plays one environment"):
        train_grpo("unused", None, tmp_path / "rows.jsonl", None, tmp_path / "out",
                   GRPOSettings(prompt_filter=PromptFilterSettings(mode="sampled")),
                   environment=[env, "examples.helpdesk:HelpdeskEnvironment"])
