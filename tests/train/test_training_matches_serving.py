"""What SFT learns from is what serving shows: a pool episode that went through curation (JSONL export, anonymization,
the SFT dataset) renders, token for token, to the prompts the serving policy builds for the same conversation
(anonymization aside: both sides are compared after the same pseudonymization), and each trained assistant turn is
exactly the tokens a model would have to generate at that point."""

from __future__ import annotations

import json

import pytest

from agent_rl.agent.chat_format import render_prompt
from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy
from agent_rl.agent.policy import Policy
from agent_rl.agent.runner import EpisodeTask, run_episodes
from agent_rl.curation.anonymize import Anonymizer, AnonymizerConfig, build_directory
from agent_rl.curation.datasets import load_jsonl, save_jsonl, sft_rows
from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.pool.repository import PoolRepository
from agent_rl.environments.email.scenarios import generate_scenarios
from agent_rl.train.sft import tokenize_rows


class Recording(Policy):
    """The teacher, recording every conversation and tool list it is asked to continue (what serving renders)."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.version, self.seen = inner, inner.version, []

    def act(self, conversations, tools, max_new_tokens=256):
        turns = self.inner.act(conversations, tools, max_new_tokens)
        for conversation, turn in zip(conversations, turns):
            self.seen.append((json.loads(json.dumps(conversation)), tools, turn.as_message()))
        return turns


@pytest.fixture(scope="module")
def curated(tmp_path_factory):
    root = tmp_path_factory.mktemp("match")
    store = open_inbox_store(f"sqlite:///{root / 'inbox.db'}")
    corpus = build_demo_corpus(store, seed=1, n_inboxes=2, n_emails=240)
    scenarios = generate_scenarios(corpus, seed=1)[:24]
    policy = Recording(HeuristicPolicy(HeuristicConfig(scenarios=scenarios), store=store))
    episodes = run_episodes(policy, [EpisodeTask.from_scenario(s) for s in scenarios], store)
    # The pool and its JSONL export, as the retraining job reads them.
    pool = PoolRepository(f"sqlite:///{root / 'pool.db'}")
    pool.insert_episodes(episodes)
    exported = [e.model_dump(mode="json") for page in pool.iter_export() for e in page.episodes]
    save_jsonl(exported, root / "episodes.jsonl")
    emails = [email for inbox in store.inboxes() for email in store.iter_emails(inbox)]
    anonymizer = Anonymizer(AnonymizerConfig(key="k"), build_directory(emails))
    anonymized = anonymizer.anonymize_episodes(load_jsonl(root / "episodes.jsonl"))
    save_jsonl(sft_rows(anonymized, min_quality=0.0), root / "sft.jsonl")
    store.close()
    return load_jsonl(root / "sft.jsonl"), policy.seen, anonymizer


@pytest.fixture(scope="module", params=["tiny", pytest.param("base", marks=pytest.mark.slow)])
def tokenizer(request, tmp_path_factory):
    from transformers import AutoTokenizer

    from agent_rl.agent.models import build_tiny_model, resolve_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny")) if request.param == "tiny" else resolve_model("base")
    return AutoTokenizer.from_pretrained(path)


def _serving_turns(seen, anonymizer):
    """(anonymized prompt conversation, tools, anonymized assistant message) for every policy call."""
    out = []
    for conversation, tools, message in seen:
        anonymized = anonymizer.anonymize_episode({"messages": [*conversation, message]})["messages"]
        out.append((anonymized[:-1], tools, anonymized[-1]))
    return out


def _task(messages) -> tuple[str, ...]:
    """Which episode a conversation belongs to: its system messages (whose inbox, which day) and question."""
    return tuple(m["content"] for m in messages if m["role"] in ("system", "user"))[:3]


def test_every_trained_turn_is_what_serving_rendered_and_the_model_would_generate(curated, tokenizer):
    rows, seen, anonymizer = curated
    assert len(rows) >= 12
    tokenized = tokenize_rows(tokenizer, rows, max_length=100_000)
    assert not tokenized.dropped
    serving = _serving_turns(seen, anonymizer)
    by_question = {}
    for conversation, tools, message in serving:
        by_question.setdefault(_task(conversation), []).append((conversation, tools, message))
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    checked = 0
    for row, ids, labels in zip(rows, tokenized.input_ids, tokenized.labels):
        for conversation, tools, message in by_question[_task(row["messages"])]:
            prompt = tokenizer(render_prompt(tokenizer, conversation, tools), add_special_tokens=False)["input_ids"]
            if ids[: len(prompt)] != prompt:
                at = next(i for i, (a, b) in enumerate(zip(ids, prompt)) if a != b)
                pytest.fail("a training row's context differs from the serving prompt:\n"
                            f"trained: {tokenizer.decode(ids[max(0, at - 40): at + 60])!r}\n"
                            f"serving: {tokenizer.decode(prompt[max(0, at - 40): at + 60])!r}")
            assert labels[len(prompt) - 1] == -100  # the assistant header is context, not trained
            rendered = tokenizer(render_prompt(tokenizer, [*conversation, message], tools, add_generation_prompt=False),
                                 add_special_tokens=False)["input_ids"]
            assert rendered[: len(prompt)] == prompt
            generated = rendered[len(prompt):]
            generated = generated[: generated.index(end_of_turn) + 1]  # what follows <|im_end|> is the template's
            trained = [t for t in labels[len(prompt): len(prompt) + len(generated)]]
            assert trained == ids[len(prompt): len(prompt) + len(generated)]
            assert ids[len(prompt): len(prompt) + len(generated)] == generated, "the trained turn is not what " \
                "the model generates at that point"
            checked += 1
    assert checked >= 3 * len(rows) // 2
