"""Tuning the model judge's prompt against the ratings with DSPy, and the agreement before and after.

The rated episodes are split, stratified, into a training part that DSPy learns from and a held-out part that
only measures: agreement (judge_agreement.py, the labeler's AUC and ECE) of the judge with its current prompt
and with the tuned one, both on the held-out ratings, with the judge exactly as curation runs it (ModelJudge,
absolute mode). DSPy sees the judgement as a Signature (transcript -> score) whose instructions are the judge's
criteria; the default optimizer, BootstrapFewShot, picks scored examples (demos) from the training ratings,
keeping those the endpoint itself judged in agreement with the rating, and needs no model but the judge's own.
Any other DSPy optimizer (MIPROv2, COPRO: they also rewrite the criteria) can be passed in, with `judge_metric`.
The result is a `JudgePrompt` file (criteria, demos, how it was made) that `JudgeConfig.prompt_path` loads.

DSPy reaches the endpoint through LiteLLM; both are told to use their bundled model metadata rather than fetch
it from the internet, and DSPy's cache directory defaults to AGENT_RL_HOME.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent_rl.chat_client import ChatEndpoint
from agent_rl.feedback.judge import JudgeConfig, JudgePrompt, ModelJudge, compact_transcript
from agent_rl.feedback.judge_agreement import EpisodeLike, judge_agreement, split_rated


def _dspy() -> Any:
    """DSPy, imported on first use (it costs seconds) and kept offline: no model-metadata download."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if "DSPY_CACHEDIR" not in os.environ:
        from agent_rl.settings import home

        os.environ["DSPY_CACHEDIR"] = str(home() / "dspy_cache")
    import dspy

    return dspy


def judge_metric(example: Any, prediction: Any, trace: Any = None) -> float | bool:
    """How well a predicted score matches the rating (1 good, 0 bad): 1 - |score - rating| when evaluating; when
    bootstrapping (`trace` given) whether it sides with the rating, so only agreeing judgements become demos."""
    try:
        score = min(1.0, max(0.0, float(prediction.score)))
    except (TypeError, ValueError, AttributeError):
        return False if trace is not None else 0.0
    truth = float(example.score)
    return (score >= 0.5) == (truth >= 0.5) if trace is not None else 1.0 - abs(score - truth)


def dspy_lm(endpoint: ChatEndpoint) -> Any:
    """A DSPy LM on the judge's OpenAI-compatible endpoint (key read from `api_key_env`, never stored)."""
    dspy = _dspy()
    return dspy.LM(f"openai/{endpoint.model}", api_base=endpoint.base_url, api_key=endpoint.api_key() or "unused",
                   temperature=endpoint.temperature, max_tokens=endpoint.max_tokens or 1000, cache=False,
                   num_retries=endpoint.max_retries, timeout=endpoint.timeout_s)


def _split(episodes: Iterable[EpisodeLike], held_out_share: float, seed: int
           ) -> tuple[list[tuple[EpisodeLike, int]], list[EpisodeLike]]:  # fmt: skip
    """(training pairs, classes interleaved so early demos show both; held-out episodes), stratified by rating."""
    rated, labels, _ = split_rated(episodes)
    rng = random.Random(seed)
    train_by_class: list[list[tuple[EpisodeLike, int]]] = []
    held_out: list[EpisodeLike] = []
    for y in (1, 0):
        members = [(e, y) for e, label in zip(rated, labels) if label == y]
        rng.shuffle(members)
        cut = round(len(members) * held_out_share)
        if cut < 2 or len(members) - cut < 2:
            raise ValueError(f"too few {'good' if y else 'bad'} rated episodes to tune and measure: {len(members)} "
                             f"(need >= 2 on each side of a {held_out_share:.0%} held-out split)")
        held_out += [e for e, _ in members[:cut]]
        train_by_class.append(members[cut:])
    good, bad = train_by_class
    train = [pair for i in range(max(len(good), len(bad))) for pair in (good[i:i + 1] + bad[i:i + 1])]
    return train, held_out


def _signature(dspy: Any, criteria: str) -> Any:
    class JudgeConversation(dspy.Signature):
        """Judge one conversation between a user and an AI assistant that uses tools."""

        transcript: str = dspy.InputField(desc="the conversation, one line per message or tool call")
        score: float = dspy.OutputField(desc="probability in [0, 1] that the user rated the conversation good")

    return JudgeConversation.with_instructions(criteria)


def optimize_judge_prompt(rated_episodes: Iterable[EpisodeLike], endpoint: ChatEndpoint, out_path: str | Path, *,
                          prompt: JudgePrompt | None = None, optimizer: Any = None, max_demos: int = 4,
                          held_out_share: float = 0.3, min_auc: float = 0.85, max_ece: float = 0.05,
                          seed: int = 0, judge_options: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Tune the judge's prompt on part of the rated episodes, measure before and after on the rest, save it.

    `optimizer`: a DSPy teleprompter (anything with `compile(program, trainset=...)`); default BootstrapFewShot
    with up to `max_demos` bootstrapped and labeled demos. `judge_options`: other JudgeConfig fields for the
    judge that measures (truncation, retries). Returns before/after agreement (auc, ece, passed, ...), whether
    it improved (higher AUC, or equal AUC and lower ECE), the split's sizes, the demos kept and the file."""
    dspy = _dspy()
    base = prompt or JudgePrompt()
    train, held_out = _split(rated_episodes, held_out_share, seed)
    config = JudgeConfig(endpoint=endpoint, mode="absolute", **(judge_options or {}))

    def measure(tuned: JudgePrompt) -> dict[str, Any]:
        with ModelJudge(config, prompt=tuned) as judge:
            return judge_agreement(judge, held_out, min_auc=min_auc, max_ece=max_ece, min_rated=1)

    before = measure(base)
    trainset = [dspy.Example(transcript=compact_transcript(e, max_message_chars=config.max_message_chars,
                                                           max_chars=config.max_chars), score=float(y))
                .with_inputs("transcript") for e, y in train]
    optimizer = optimizer or dspy.BootstrapFewShot(metric=judge_metric, max_bootstrapped_demos=max_demos,
                                                   max_labeled_demos=max_demos, max_rounds=1)
    with dspy.context(lm=dspy_lm(endpoint), adapter=dspy.JSONAdapter()):
        compiled = optimizer.compile(dspy.Predict(_signature(dspy, base.criteria)), trainset=trainset)
    predictor = compiled.predictors()[0]
    demos = [{"transcript": str(d["transcript"]), "score": min(1.0, max(0.0, float(d["score"])))}
             for d in predictor.demos if "transcript" in d and "score" in d]
    tuned = JudgePrompt(criteria=predictor.signature.instructions or base.criteria, demos=demos)
    after = measure(tuned)
    improved = (after["auc"] or 0) > (before["auc"] or 0) or (
        after["auc"] == before["auc"] and (after["ece"] or 1) < (before["ece"] or 1))
    summary = {k: {key: value[key] for key in ("auc", "ece", "n", "passed")} for k, value in
               (("before", before), ("after", after))}
    tuned = tuned.model_copy(update={"source": {
        "optimizer": type(optimizer).__name__, "model": endpoint.model, "n_train": len(train),
        "n_held_out": len(held_out), "seed": seed, **summary}})
    path = tuned.save(out_path)
    return {"before": before, "after": after, "improved": improved, "n_train": len(train),
            "n_held_out": len(held_out), "demos": len(demos), "optimizer": type(optimizer).__name__,
            "criteria_changed": tuned.criteria != base.criteria, "path": str(path)}
