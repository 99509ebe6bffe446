"""The GRPO environment judges rollouts like the episode runner, and the reward functions add up to the rubric."""

from __future__ import annotations

import json

import pytest

from agent_rl.records import Outcome
from agent_rl.reward.rubric import FormatErrorKind, RubricWeights, score
from agent_rl.train.config import GRPOSettings, RewardWeights
from agent_rl.environments.email.rollouts import InboxEnvironment, observe
from agent_rl.environments.rollouts import ANSWER_ACK
from agent_rl.train.rewards import REWARD_GROUPS, make_reward_funcs


@pytest.fixture(scope="module")
def env_row(train_data):
    from agent_rl.environments.email.inbox.store import open_inbox_store
    from agent_rl.train.sft import read_jsonl

    store = open_inbox_store(train_data["store_url"])
    rows = [r for r in read_jsonl(train_data["grpo"]) if r["category"] != "unanswerable"]
    yield store, rows[0]
    store.close()


def _play(env: InboxEnvironment, calls: list[tuple[str, dict] | str]) -> list[dict]:
    """A completion as TRL builds it: each call executed on the environment, its result appended."""
    completion = []
    for call in calls:
        if isinstance(call, str):
            completion.append({"role": "assistant", "content": call})
            continue
        name, arguments = call
        completion.append({"role": "assistant", "content": "",
                           "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]})
        result = getattr(env, name)(**arguments) if hasattr(env, name) else json.dumps({"error": "no such tool"})
        completion.append({"role": "tool", "name": name, "content": result})
    return completion


def test_tools_are_the_environment_public_methods():
    import inspect

    public = [n for n, _ in inspect.getmembers(InboxEnvironment, predicate=inspect.isfunction) if not n.startswith("_")]
    assert sorted(public) == ["read_email", "reset", "return_final_answer", "search_emails"]


def test_correct_answer_with_source_scores_the_correct_tier(env_row):
    store, row = env_row
    env = InboxEnvironment(store, max_turns=5)
    env.reset(**row)
    gold = row["source_ids"][0]
    completion = _play(env, [("read_email", {"message_id": gold}),
                             ("return_final_answer", {"answer": row["answer"], "sources": [gold]}), ""])
    obs = observe(env, completion)
    assert obs.outcome == Outcome.CORRECT and obs.turns == 2 and obs.rubric.read_gold
    assert completion[-2]["content"] == ANSWER_ACK
    funcs = make_reward_funcs()
    values = {f.__name__: f(completions=[completion], environments=[env])[0] for f in funcs}
    assert set(values) == {f"reward_{g}" for g in REWARD_GROUPS}
    assert sum(values.values()) == pytest.approx(score(obs.rubric, RubricWeights()).total)
    assert values["reward_outcome"] == 1.0 and values["reward_sources"] > 0


def test_idk_beats_wrong_and_format_errors_are_worst(env_row):
    store, row = env_row
    totals = {}
    for label, calls in {
        "wrong": [("return_final_answer", {"answer": "Ontario", "sources": []})],
        "idk": [("return_final_answer", {"answer": "I don't know", "sources": []})],
        "plain_text": ["The answer is probably Tuesday."],
        "unknown_tool": [("delete_emails", {"all": True})],
        "malformed": ['<tool_call>\n{"name": "search_emails", "arguments": \n</tool_call>'],
        "ran_out": [("search_emails", {"keywords": ["zzzz"]})] * 2,
    }.items():
        env = InboxEnvironment(store, max_turns=5)
        env.reset(**row)
        obs = observe(env, _play(env, calls))
        totals[label] = score(obs.rubric).total
        expected = {"wrong": Outcome.WRONG, "idk": Outcome.IDK, "ran_out": Outcome.RAN_OUT}.get(label, Outcome.FORMAT_ERROR)
        assert obs.outcome == expected, label
    assert totals["idk"] > totals["wrong"] > totals["plain_text"]
    assert observe_kind(store, row, ["text"]) == FormatErrorKind.NO_TOOL_CALL
    assert totals["ran_out"] == totals["idk"]


def observe_kind(store, row, calls):
    env = InboxEnvironment(store)
    env.reset(**row)
    return observe(env, _play(env, calls)).format_error


def test_reset_rejects_a_row_without_its_inbox(env_row):
    store, row = env_row
    env = InboxEnvironment(store)
    with pytest.raises(ValueError, match="inbox"):
        env.reset(**{k: v for k, v in row.items() if k != "inbox"})


def test_settings_validate_group_size_and_expose_trl_knobs():
    with pytest.raises(ValueError, match="multiple of num_generations"):
        GRPOSettings(num_generations=3, per_device_train_batch_size=8)
    gpu = GRPOSettings.gpu()
    assert gpu.use_vllm and gpu.vllm_mode == "colocate" and gpu.compute.bf16 and not gpu.compute.use_cpu
    cpu = GRPOSettings()
    assert cpu.compute.use_cpu and not cpu.compute.bf16 and not cpu.compute.gradient_checkpointing
    assert RewardWeights().as_list(list(REWARD_GROUPS)) == [1.0] * len(REWARD_GROUPS)


def test_research_knobs_live_under_experimental_and_removed_ones_are_refused():
    """The research knobs are off by default under `experimental`; a settings dict that names a removed knob, or a
    research knob at the top level, is refused with a pointer instead of being silently ignored."""
    from agent_rl.train.config import SFTSettings

    off = GRPOSettings().experimental
    assert (off.extra_prompts_per_step, off.fresh_adapter, off.top_entropy_quantile) == (0, False, 1.0)
    on = GRPOSettings.model_validate({"experimental": {"fresh_adapter": True}})
    assert on.experimental.fresh_adapter and GRPOSettings.model_validate_json(on.model_dump_json()) == on
    with pytest.raises(ValueError, match="moved to experimental"):
        GRPOSettings.model_validate({"fresh_adapter": True})
    with pytest.raises(ValueError, match="docs/experiments.md"):
        GRPOSettings.model_validate({"negative_advantage_scale": 0.0})
    with pytest.raises(ValueError, match="docs/experiments.md"):
        SFTSettings.model_validate({"close_after_answer": True})


def test_grpo_trains_to_answer_only_when_two_answers_in_three_would_be_right(env_row):
    """GRPO's rubric charges 2 for a wrong answer, so guessing pays only above 2/3 certainty (1 - 2(1-p) > 0),
    where the evaluation's rubric (wrong -1) pays it above 1/2; its tiers keep their order, and overriding one
    number of it keeps the others."""
    store, row = env_row
    settings = GRPOSettings()
    totals = {}
    for label, answer in {"right": row["answer"], "wrong": "Ontario", "idk": "I don't know"}.items():
        env = InboxEnvironment(store, max_turns=5)
        env.reset(**row)
        obs = observe(env, _play(env, [("return_final_answer", {"answer": answer, "sources": []})]))
        totals[label] = (score(obs.rubric, settings.rubric).total, score(obs.rubric, RubricWeights()).total)

    def guessing_pays(p: float, rubric: int) -> bool:
        return p * totals["right"][rubric] + (1 - p) * totals["wrong"][rubric] > totals["idk"][rubric]

    assert guessing_pays(0.55, rubric=1) and not guessing_pays(0.55, rubric=0)
    assert guessing_pays(0.75, rubric=0)
    assert totals["idk"][0] == totals["idk"][1] and totals["right"][0] == totals["right"][1]

    changed = GRPOSettings.model_validate({"rubric": {"correct": 1.5}}).rubric
    assert (changed.correct, changed.wrong) == (1.5, settings.rubric.wrong)
    with pytest.raises(ValueError, match="rubric tiers out of order"):
        GRPOSettings.model_validate({"rubric": {"wrong": -2.7}})  # below GRPO's format errors + partial credit


def test_the_email_environment_offers_its_rubric_rollouts_through_the_contract(env_row, train_data):
    """GRPO asks the environment for its TRL factory: the email assistant's rollouts carry the rubric's inputs, so
    the reward functions score them by the rubric's groups, as the InboxEnvironment built by hand is scored."""
    from agent_rl.environments.email.environment import EmailEnvironment
    from agent_rl.train.plugin_rollouts import rollout_factory
    from agent_rl.train.rewards import grouped, rollout_scores

    _, row = env_row
    env = EmailEnvironment(store_url=train_data["store_url"])
    try:
        rollout = rollout_factory(env, max_turns=5)()
        assert isinstance(rollout, InboxEnvironment) and rollout._max_turns == 5
        rollout.reset(**row)
        gold = row["source_ids"][0]
        completion = _play(rollout, [("read_email", {"message_id": gold}),
                                     ("return_final_answer", {"answer": row["answer"], "sources": [gold]}), ""])
        weights = RubricWeights(correct=2.0)
        groups, components = rollout_scores(rollout, completion, weights)
        expected = score(observe(rollout, completion).rubric, weights)
        assert groups == grouped(expected) and components == expected.components and groups["outcome"] == 2.0
    finally:
        env.close()


def test_a_rollout_without_the_rubric_hook_is_scored_by_its_judge():
    """The hook is the observation's `rubric`: None sends the judge's one number to the outcome group (format
    errors to the format group), whatever class the rollout is."""
    from agent_rl.environments.core import Judgement
    from agent_rl.train.plugin_rollouts import PluginObservation, PluginTrace
    from agent_rl.train.rewards import rollout_reward, rollout_scores

    class Judged:
        def __init__(self, format_error):
            self.observation = PluginObservation(
                question="q", outcome=Outcome.CORRECT if format_error is None else Outcome.FORMAT_ERROR,
                format_error=format_error, turns=1, trace=PluginTrace(),
                judgement=Judgement(Outcome.CORRECT, 0.75, {"solved": 0.75}))

        def _observe(self, completion):
            return self.observation

    groups, components = rollout_scores(Judged(None), [], RubricWeights())
    assert groups == {**dict.fromkeys(REWARD_GROUPS, 0.0), "outcome": 0.75} and components == {"solved": 0.75}
    groups, _ = rollout_scores(Judged(FormatErrorKind.NO_TOOL_CALL), [], RubricWeights())
    assert groups["format"] == 0.75 and groups["outcome"] == 0.0
    with pytest.raises(ValueError, match="judged by their environment"):
        rollout_reward(Judged(None), [], RubricWeights())
