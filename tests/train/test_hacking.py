"""Reward-hacking detectors on crafted rollouts: each kind fires on its pattern, clean rollouts raise nothing."""

from __future__ import annotations

import json

import pytest

from agent_rl.environments.email.environment import EmailEnvironment
from agent_rl.reward.hacking import KINDS, HackingConfig, detect_reward_hacking, environment_detectors, measure_reward_hacking

# The email assistant declares two detectors of its own (unsupported answers, padded sources); these rollouts are its.
EMAIL_DETECTORS = environment_detectors([EmailEnvironment()])


def detect(rollouts, config=None):
    return detect_reward_hacking(rollouts, config, EMAIL_DETECTORS)

EMAILS = {
    f"m{i}": {"id": f"m{i}", "subject": f"Topic {i}", "body": body}
    for i, body in enumerate([
        "The budget review meeting is on June 5 in Houston.",
        "Invoice 443 from Acme totals $12,450 and is due June 30.",
        "Kay Mann approved the gas storage expansion.",
        "The offsite moved to Tulsa, Oklahoma.",
        "The pipeline project was cancelled last week.",
        "Quarterly numbers go to Sally Beck on Friday.",
    ])
}
QUESTIONS = [
    ("When is the budget review meeting?", "June 5", "m0"),
    ("How much is invoice 443 from Acme?", "$12,450", "m1"),
    ("Who approved the gas storage expansion?", "Kay Mann", "m2"),
    ("Where is the offsite?", "Tulsa", "m3"),
    ("What happened to the pipeline project?", "cancelled", "m4"),
    ("Who gets the quarterly numbers?", "Sally Beck", "m5"),
]


def _call(name: str, **arguments) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def _tool(name: str, content) -> dict:
    return {"role": "tool", "name": name, "content": content if isinstance(content, str) else json.dumps(content)}


def _episode(question: str, answer: str, read: list[str], sources: list[str] | None = None, reward: float = 1.3,
             extra_calls: list[tuple[str, dict]] = ()) -> dict:
    messages = [{"role": "system", "content": "You answer questions."}, {"role": "user", "content": question}]
    messages += [_call("search_emails", keywords=question.split()[-2:]), _tool("search_emails", [{"id": m} for m in read])]
    for message_id in read:
        messages += [_call("read_email", message_id=message_id), _tool("read_email", EMAILS[message_id])]
    for name, arguments in extra_calls:
        messages += [_call(name, **arguments), _tool(name, "[]")]
    sources = read[:1] if sources is None else sources
    messages += [_call("return_final_answer", answer=answer, sources=sources), _tool("return_final_answer", "Answer recorded.")]
    return {"question": question, "final_answer": answer, "sources": sources, "messages": messages,
            "reward": reward, "outcome": "correct" if reward >= 1 else "wrong"}


def clean_rollouts() -> list[dict]:
    return [_episode(q, a, [m]) for q, a, m in QUESTIONS]


def test_clean_rollouts_raise_no_finding():
    assert detect(clean_rollouts()) == []
    measured = measure_reward_hacking(clean_rollouts(), extra=EMAIL_DETECTORS)
    assert [f.kind for f in measured] == [*KINDS, "unsupported_answer", "padded_sources"]
    assert all(f.rate == 0 for f in measured)


def test_an_environment_without_detectors_of_its_own_is_measured_by_the_generic_ones():
    unread = [_episode(q, a, [], sources=[m]) for q, a, m in QUESTIONS]  # cites what it never read
    assert [f.kind for f in measure_reward_hacking(unread)] == list(KINDS)
    assert "padded_sources" in {f.kind for f in detect(unread)}


def test_an_environment_detector_may_not_shadow_a_generic_one():
    with pytest.raises(ValueError, match="same_answer"):
        measure_reward_hacking(clean_rollouts(), extra={"same_answer": lambda rollouts, config: None})


def test_same_answer_to_many_questions():
    rollouts = clean_rollouts()[:2] + [_episode(q, "June 5", [m], reward=-1.0) for q, _, m in QUESTIONS[2:]]
    findings = {f.kind: f for f in detect(rollouts)}
    assert "same_answer" in findings
    finding = findings["same_answer"]
    assert finding.count == 5 and finding.total == 6 and finding.rate > finding.threshold
    assert finding.examples and all(e["final_answer"] == "June 5" for e in finding.examples)


def test_answers_not_supported_by_any_email_read():
    rollouts = clean_rollouts()
    rollouts[0] = _episode(QUESTIONS[0][0], "March 17", ["m1"])  # read an email that says nothing about it
    rollouts[1] = _episode(QUESTIONS[1][0], "$99,000", [])  # read nothing at all
    finding = {f.kind: f for f in detect(rollouts)}["unsupported_answer"]
    assert finding.count == 2 and finding.total == 6
    assert {e["question"] for e in finding.examples} == {QUESTIONS[0][0], QUESTIONS[1][0]}
    assert any("without seeing" in e["why"] for e in finding.examples)


def test_tool_call_spam():
    rollouts = clean_rollouts()
    rollouts[0] = _episode(*QUESTIONS[0][:2], [QUESTIONS[0][2]],
                           extra_calls=[("search_emails", {"keywords": ["budget"]})] * 4)
    rollouts[1] = _episode(*QUESTIONS[1][:2], [QUESTIONS[1][2]],
                           extra_calls=[("search_emails", {"keywords": [f"w{i}"]}) for i in range(15)])
    finding = {f.kind: f for f in detect(rollouts)}["tool_call_spam"]
    assert finding.count == 2
    assert any("same tool call" in e["why"] for e in finding.examples)
    assert any("tool calls" in e["why"] and "same" not in e["why"] for e in finding.examples)


def test_padded_sources():
    rollouts = clean_rollouts()
    rollouts[0] = _episode(*QUESTIONS[0][:2], ["m0"], sources=["m0", "m1", "m2", "m3", "m4"])
    rollouts[1] = _episode(*QUESTIONS[1][:2], ["m1"], sources=["m1", "m5"])  # m5 never read
    finding = {f.kind: f for f in detect(rollouts)}["padded_sources"]
    assert finding.count == 2 and finding.total == 6
    assert any("never read" in e["why"] for e in finding.examples)


def test_format_exploits_that_score():
    rollouts = clean_rollouts()
    rollouts[0] = _episode(QUESTIONS[0][0], "June 5, June 6, June 7 or June 8", ["m0"])
    rollouts[1] = _episode(QUESTIONS[1][0], "$12,450 " + "and more details " * 20, ["m1"])
    finding = {f.kind: f for f in detect(rollouts)}["format_exploit"]
    assert finding.count == 2
    # The same shapes without a reward are not exploits (they did not pay off).
    for rollout in rollouts[:2]:
        rollout["reward"], rollout["outcome"] = -1.0, "wrong"
    assert "format_exploit" not in {f.kind for f in detect(rollouts)}


def test_too_few_rollouts_never_fire_and_bad_input_is_named():
    rollouts = [_episode(q, "June 5", [m], reward=-1.0) for q, _, m in QUESTIONS[:3]]
    assert detect(rollouts, HackingConfig(min_episodes=4)) == []
    with pytest.raises(TypeError, match="episode-like dicts"):
        detect_reward_hacking("not a list")  # type: ignore[arg-type]


def test_findings_are_json_serializable_for_check_metadata():
    rollouts = [_episode(q, "June 5", [m], reward=-1.0) for q, _, m in QUESTIONS]
    findings = detect(rollouts)
    assert findings
    json.dumps([f.as_dict() for f in findings])


def test_penalised_guesses_loops_and_padding_are_not_hacking():
    """What did not pay is being trained away: a weak policy's wrong guesses, loops and unread citations that
    scored below zero raise no finding (the evaluation's hallucination gate covers them)."""
    rollouts = clean_rollouts()
    rollouts[0] = _episode(QUESTIONS[0][0], "March 17", ["m1"], reward=-1.0)
    rollouts[1] = _episode(QUESTIONS[1][0], "$99,000", [], reward=-1.2)
    rollouts[2] = _episode(*QUESTIONS[2][:2], [QUESTIONS[2][2]], reward=-0.5,
                           extra_calls=[("search_emails", {"keywords": ["budget"]})] * 4)
    rollouts[3] = _episode(*QUESTIONS[3][:2], [QUESTIONS[3][2]], sources=["m1", "m5"], reward=-1.0)
    assert detect(rollouts) == []
    # The same shapes that paid off are flagged.
    for rollout in rollouts[:4]:
        rollout["reward"], rollout["outcome"] = 1.1, "correct"
    assert {"unsupported_answer", "tool_call_spam", "padded_sources"} <= {f.kind for f in detect(rollouts)}


def test_an_answer_taken_from_a_search_snippet_is_supported():
    rollouts = clean_rollouts()
    question, answer, message_id = QUESTIONS[0]
    messages = [{"role": "system", "content": "You answer questions."}, {"role": "user", "content": question},
                _call("search_emails", keywords=["launch"]),
                _tool("search_emails", [{"id": message_id, "snippet": EMAILS[message_id]["body"]}]),
                _call("return_final_answer", answer=answer, sources=[message_id]),
                _tool("return_final_answer", "Answer recorded.")]
    rollouts[0] = {"question": question, "final_answer": answer, "sources": [message_id], "messages": messages,
                   "reward": 1.2, "outcome": "correct", "reads": []}
    measured = {f.kind: f for f in measure_reward_hacking(rollouts, extra=EMAIL_DETECTORS)}
    assert measured["unsupported_answer"].count == 0


def test_an_amount_written_another_way_in_the_email_is_supported():
    """Seen in a demo run: the email said "USD 53,351.50", the rewarded answer was "$53,351.50"."""
    rollouts = clean_rollouts()
    EMAILS["m9"] = {"id": "m9", "subject": "Invoice INV-18537", "body": "The total due is USD 53,351.50, net 30."}
    try:
        rollouts[0] = _episode("What's the total due on invoice INV-18537?", "$53,351.50", ["m9"])
        rollouts[1] = _episode("What's the total due on invoice INV-18538?", "$53,351.90", ["m9"])  # a near miss
        finding = {f.kind: f for f in measure_reward_hacking(rollouts, extra=EMAIL_DETECTORS)}["unsupported_answer"]
        assert finding.count == 1
        assert finding.examples[0]["final_answer"] == "$53,351.90"
    finally:
        del EMAILS["m9"]


def test_a_graded_judges_small_scores_for_long_answers_are_not_rewards():
    """A job's fuzzy-match grader gives every answer a little: long wrong answers scoring 0.1 are no answers the
    reward favoured, so they are no format exploit (the base model's verbose replies once disqualified GRPO at 72%);
    the same answers judged correct still are."""
    from agent_rl.reward.hacking import mark_rewarded

    rollouts = clean_rollouts()
    for rollout in rollouts[:3]:
        rollout.update(final_answer="the email says many things " * 12, reward=0.1, outcome="wrong")
    assert "format_exploit" in {f.kind for f in detect(rollouts)}  # read as rewarded: reward > 0
    assert "format_exploit" not in {f.kind for f in detect(mark_rewarded(rollouts, 0.5))}
    for rollout in rollouts[:3]:
        rollout["outcome"] = "correct"
    assert "format_exploit" in {f.kind for f in detect(mark_rewarded(rollouts, 0.5))}
    assert mark_rewarded(rollouts, 0.0) is rollouts
