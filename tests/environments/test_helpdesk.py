"""The help desk (examples/helpdesk.py), the world the fast promotion path trains on, and the tiny model fitted to
it: its teacher solves every training request, its judge tells a right reply from a wrong one, the held-out split
is fixed, and a tiny model whose tokenizer learned the desk's text actually learns the desk from SFT."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_rl.agent.local_policy import LocalPolicy
from agent_rl.agent.models import build_tiny_model, resolve_model, world_tiny_model_path
from agent_rl.environments.runner import Play, play_episodes
from agent_rl.curation.datasets import sft_rows
from agent_rl.jsonl import save_jsonl
from agent_rl.records import Outcome, Split
from agent_rl.train.config import SFTSettings
from agent_rl.train.sft import train_sft
from examples.helpdesk import IDK, POLICIES, HelpdeskEnvironment, HelpdeskTeacher

SPEC = "tiny:examples.helpdesk:HelpdeskEnvironment"


def test_the_teacher_answers_every_request_and_the_split_is_fixed():
    env = HelpdeskEnvironment()
    train, test = env.tasks(Split.TRAIN), env.tasks(Split.TEST)
    assert len(train) > 200 and len(test) > 50
    assert not {t.id for t in train} & {t.id for t in test}
    assert {t.category for t in test} == set(env.categories)  # every kind of request is held out too
    assert [t.id for t in HelpdeskEnvironment().tasks(Split.TEST)] == [t.id for t in test]
    episodes = play_episodes(HelpdeskTeacher(), env, [Play(t) for t in train + test])
    assert all(e.outcome == Outcome.CORRECT for e in episodes)


def _play(env, task, calls):
    class Scripted(HelpdeskTeacher):
        def act(self, conversations, tools, max_new_tokens=256):
            from agent_rl.environments.policy import PolicyTurn, ToolCall

            step = sum(1 for m in conversations[0] if m["role"] == "assistant")
            return [PolicyTurn(tool_calls=[ToolCall(*calls[step])])]

    return play_episodes(Scripted(), env, [Play(task)])[0]


def test_the_judge_wants_the_policy_looked_up_and_its_words_in_the_reply():
    env = HelpdeskEnvironment()
    refund = next(t for t in env.tasks(Split.TRAIN) if t.category == "refund")
    weather = next(t for t in env.tasks(Split.TRAIN) if t.category == "out_of_scope")
    right = [("lookup_policy", {"topic": "refund"}), ("reply", {"answer": POLICIES["refund"][0], "topic": "refund"})]
    assert _play(env, refund, right).outcome == Outcome.CORRECT
    # The right words without reading the policy, or another policy's words, are wrong; "I don't know" is not.
    guessed = [("reply", {"answer": POLICIES["refund"][0], "topic": "refund"})]
    assert _play(env, refund, guessed).outcome == Outcome.WRONG
    other = [("lookup_policy", {"topic": "delivery"}), ("reply", {"answer": POLICIES["delivery"][0], "topic": "x"})]
    assert _play(env, refund, other).outcome == Outcome.WRONG
    assert _play(env, refund, [("reply", {"answer": IDK, "topic": ""})]).outcome == Outcome.IDK
    assert _play(env, weather, [("reply", {"answer": IDK, "topic": ""})]).outcome == Outcome.CORRECT
    assert _play(env, weather, right).outcome == Outcome.WRONG


def test_the_world_tiny_model_is_built_once_with_the_worlds_words_as_tokens():
    path = resolve_model(SPEC)
    assert path == world_tiny_model_path("examples.helpdesk:HelpdeskEnvironment") and path.is_dir()
    assert resolve_model(SPEC) == path  # cached: the same directory, not rebuilt
    from transformers import AutoTokenizer

    fitted, plain = AutoTokenizer.from_pretrained(path), AutoTokenizer.from_pretrained(build_tiny_model())
    text = '{"name": "lookup_policy", "arguments": {"topic": "refund"}}'
    assert len(fitted(text)["input_ids"]) < len(plain(text)["input_ids"])
    with pytest.raises(Exception, match="unknown"):
        resolve_model("tiny:no_such_environment")


@pytest.mark.slow
def test_a_tiny_model_fitted_to_the_desk_learns_it_from_sft(tmp_path: Path):
    """What the fast promotion path rests on: more SFT steps, a clearly better model on requests it never saw."""
    env = HelpdeskEnvironment()
    episodes = play_episodes(HelpdeskTeacher(), env, [Play(t) for t in env.tasks(Split.TRAIN)])
    rows = sft_rows([e.model_dump(mode="json") for e in episodes], min_quality=0.0, tools=env.tool_schemas(),
                    max_idk_share=None)
    save_jsonl(rows, tmp_path / "sft.jsonl")
    model = resolve_model(SPEC)
    test = env.tasks(Split.TEST)

    def accuracy(steps: int) -> float:
        result = train_sft(model, tmp_path / "sft.jsonl", tmp_path / f"sft-{steps}", SFTSettings(
            max_steps=steps, save_steps=steps, learning_rate=3e-3, per_device_train_batch_size=4,
            gradient_accumulation_steps=1, retain_fraction=0.0))
        served = LocalPolicy(model, adapter=result.adapter_dir, batch_size=16, version=f"sft-{steps}")
        held_out = play_episodes(served, env, [Play(t) for t in test])
        return sum(e.outcome == Outcome.CORRECT for e in held_out) / len(held_out)

    short, full = accuracy(100), accuracy(400)
    assert full >= 0.6 and full - short >= 0.3, (short, full)
