"""Implicit signals read from scripted conversations (agent_rl/feedback/signals.py): a re-ask, a correction, an
abandonment, tool errors, thanks and complaints, a follow-up on another topic (neither a re-ask nor a correction),
and the rating kept out of the features."""

from __future__ import annotations

import pytest

from agent_rl.feedback.signals import (
    FEATURE_NAMES,
    SignalConfig,
    episode_signals,
    is_tool_error,
    rating_of,
    signals_from_messages,
)

SYSTEM = {"role": "system", "content": "You are a shop's support assistant."}


def call(call_id: str, name: str = "lookup_order", arguments: str = '{"order_id": "123"}') -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


def result(call_id: str, content: str = '{"status": "shipped"}') -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def reply(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_a_plain_answered_conversation_shows_nothing_but_its_turns():
    s = signals_from_messages([SYSTEM, user("Where is my order 123?"), call("c1"), result("c1"),
                               reply("Order 123 shipped on Monday.")])
    assert (s.user_turns, s.assistant_turns, s.tool_calls) == (1, 2, 1)
    assert (s.reasks, s.corrections, s.complaints, s.thanks, s.tool_errors, s.agent_gave_up) == (0, 0, 0, 0, 0, 0)
    assert not s.abandoned and s.rating is None and not s.rated


def test_a_reask_restating_the_first_request_is_counted():
    s = signals_from_messages([SYSTEM, user("What is the refund policy for a damaged kettle?"),
                               reply("Kettles are great."),
                               user("I asked: what is your refund policy for a damaged kettle?"),
                               reply("Damaged kettles are refunded within 30 days.")])
    assert s.reasks == 1 and s.max_reask_similarity >= 0.6
    assert s.corrections == 0 and s.follow_ups == 0


@pytest.mark.parametrize("follow_up", ["Also, how much is shipping to Denver?", "and does the kettle have a warranty",
                                       "One more thing: can you change the address of order 456 to 7 Lake Road?",
                                       "i moved, please send order 456 to 7 lake road instead"])
def test_a_follow_up_on_another_topic_is_no_reask_and_no_correction(follow_up):
    s = signals_from_messages([SYSTEM, user("Where is my order 123?"), reply("It shipped."),
                               user(follow_up), reply("Done.")])
    assert s.reasks == 0 and s.max_reask_similarity < 0.4 and s.corrections == 0
    assert s.follow_ups == 1 and s.features()["follow_ups"] == 1.0


def test_after_a_follow_up_a_restated_question_is_still_a_reask():
    s = signals_from_messages([SYSTEM, user("Where is my order 123?"), reply("It shipped."),
                               user("Perfect, thank you!"), reply("You're welcome!"),
                               user("And what is the refund policy for a damaged kettle?"), reply("Kettles are great."),
                               user("I asked: what is your refund policy for a damaged kettle?"), reply("30 days."),
                               user("Perfect, thank you!"), reply("You're welcome!")])
    # One follow-up, one re-ask of it, two thanks (the second thanks restates no question).
    assert (s.follow_ups, s.reasks, s.corrections, s.thanks) == (1, 1, 0, 2)
    # Thanks and a follow-up in one message: both count.
    both = signals_from_messages([SYSTEM, user("Where is my order 123?"), reply("It shipped."),
                                  user("Great, thanks! Also, is the kettle in stock in Denver?"), reply("Yes.")])
    assert (both.follow_ups, both.thanks, both.reasks) == (1, 1, 0)


@pytest.mark.parametrize("later", ["Thanks, that's what I needed.", "What a waste of time.", "No, I meant order 124.",
                                   "Can you just tell me where order 123 is?", "ok",
                                   "My neighbour got the parcel today.",  # a remark: it asks nothing
                                   # reworded: below the re-ask bar, above a follow-up's
                                   "What's the status of order 123? Please answer the question."])
def test_thanks_complaints_corrections_and_restatements_are_no_follow_ups(later):
    s = signals_from_messages([SYSTEM, user("Where is my order 123?"), reply("Order 321 is delayed."), user(later),
                               reply("Sorry about that.")])
    assert s.follow_ups == 0
    # A request before any reply (the opening in two messages) is no follow-up either.
    assert signals_from_messages([SYSTEM, user("Hi!"), user("Where is my order 123?"), reply("It shipped.")]
                                 ).follow_ups == 0


@pytest.mark.parametrize("text", ["No, I meant order 124.", "That's not what I asked.", "that's wrong",
                                  "Not what I wanted at all", "nope, the other one"])
def test_corrections_are_counted(text):
    s = signals_from_messages([SYSTEM, user("Where is my order 123?"), reply("Order 321 is delayed."), user(text),
                               reply("Sorry, order 124 shipped.")])
    assert s.corrections == 1


def test_no_thanks_is_not_a_correction():
    s = signals_from_messages([SYSTEM, user("Where is my order 123?"), reply("It shipped."),
                               user("No thanks, that's all!")])
    assert s.corrections == 0 and s.thanks == 1


def test_abandonment_pending_tool_call_or_unanswered_user():
    pending = signals_from_messages([SYSTEM, user("Where is my order 123?"), call("c1")])
    assert pending.abandoned
    unanswered = signals_from_messages([SYSTEM, user("Where is my order 123?"), reply("Which order?"), user("123")])
    assert unanswered.abandoned
    assert signals_from_messages([SYSTEM]).abandoned  # no conversation at all


def test_a_final_tool_call_is_an_answer_not_an_abandonment():
    messages = [SYSTEM, user("Where is my order 123?"), call("c1"), result("c1"),
                call("c2", "respond", '{"answer": "shipped"}')]
    assert signals_from_messages(messages).abandoned  # nothing says `respond` is the final tool
    # The gateway stores the final tool's arguments as the episode's final answer ...
    assert not signals_from_messages(messages, final_answer='{"answer": "shipped"}').abandoned
    # ... or the caller names it.
    assert not signals_from_messages(messages, config=SignalConfig(final_tools=("respond",))).abandoned


@pytest.mark.parametrize("content, error", [
    ('{"error": "upstream timeout"}', True), ('{"status": "error", "message": "x"}', True),
    ("Error: the service is unavailable", True), ("HTTP 503 Service Unavailable", True),
    ('{"is_error": true}', True), ('{"status": "shipped"}', False), ('{"error": null, "rows": []}', False),
    ("No orders found for that name.", False), ("The error rate was 2% last week.", False),
])
def test_tool_errors(content, error):
    assert is_tool_error(content) is error


def test_tool_errors_are_counted_per_result():
    s = signals_from_messages([SYSTEM, user("Where is my order 123?"), call("c1"), result("c1", '{"error": "timeout"}'),
                               call("c2"), result("c2"), reply("It shipped.")])
    assert (s.tool_calls, s.tool_errors) == (2, 1)


def test_thanks_and_complaints_after_a_reply_count_the_first_message_does_not():
    thanked = signals_from_messages([SYSTEM, user("Thanks in advance: where is order 123?"), reply("It shipped."),
                                     user("Perfect, thank you!"), reply("You're welcome!")])
    assert thanked.thanks == 1 and thanked.complaints == 0
    fed_up = signals_from_messages([SYSTEM, user("Where is order 123?"), reply("I couldn't find it."),
                                    user("This is useless."), reply("I'm sorry about that.")])
    assert fed_up.complaints == 1 and fed_up.thanks == 0 and fed_up.agent_gave_up == 1
    assert signals_from_messages([SYSTEM, user("Where?"), reply("Here."), user("that's not helpful")]).thanks == 0


def test_content_parts_are_read_like_strings():
    s = signals_from_messages([SYSTEM, {"role": "user", "content": [{"type": "text", "text": "Where is order 123?"}]},
                               reply("It shipped."), {"role": "user", "content": [{"type": "text", "text": "thanks!"}]},
                               reply("Welcome.")])
    assert s.thanks == 1 and s.user_turns == 2


@pytest.mark.parametrize("feedback, rating", [
    ("up", 1.0), ("down", -1.0), ("0.5", 0.5), ('{"reward": -0.25}', -0.25), ("correct", 1.0), (None, None),
    ("great answer but slow", None), ("nan", None),
])
def test_rating_is_read_as_curation_reads_feedback(feedback, rating):
    assert rating_of(feedback) == rating


def test_the_rating_is_never_a_feature_and_metadata_is_plain():
    episode = {"episode_id": "e1", "feedback": "down", "final_answer": "It shipped.",
               "messages": [SYSTEM, user("Where is order 123?"), reply("It shipped.")]}
    s = episode_signals(episode)
    assert s.rating == -1.0 and s.episode_id == "e1"
    assert tuple(s.features()) == FEATURE_NAMES and "rating" not in s.features()
    assert all(isinstance(v, float) for v in s.features().values())
    meta = s.to_metadata()
    assert meta["rating"] == -1.0 and meta["abandoned"] is False and meta["episode_id"] == "e1"
    assert episode_signals(episode) == s  # deterministic


def test_config_is_checked():
    with pytest.raises(ValueError):
        SignalConfig(reask_similarity=0)
    with pytest.raises(ValueError):
        SignalConfig(min_words=0)
    with pytest.raises(ValueError):
        SignalConfig(follow_up_similarity=0.5)  # above the re-ask bar: a turn would be both


def test_giving_up_through_the_final_tool_counts_like_giving_up_in_words():
    gave_up = call("c2", "respond", '{"answer": "I don\'t know where order 123 is."}')
    messages = [SYSTEM, user("Where is my order 123?"), call("c1"), result("c1", '{"rows": []}'), gave_up]
    assert signals_from_messages(messages, config=SignalConfig(final_tools=("respond",))).agent_gave_up == 1
    stored = '{"answer": "I don\'t know where order 123 is."}'  # the gateway's final answer: the call's arguments
    assert signals_from_messages(messages, final_answer=stored).agent_gave_up == 1
    assert signals_from_messages(messages).agent_gave_up == 0  # nothing says `respond` is the answer
    # A lookup whose arguments merely mention the words is no answer; a final answer that gives one is no giving up.
    lookup = call("c3", "lookup_order", '{"note": "customer said I don\'t know the number"}')
    assert signals_from_messages([SYSTEM, user("Where is my order?"), lookup],
                                 config=SignalConfig(final_tools=("respond",))).agent_gave_up == 0
    answered = [*messages[:-1], call("c2", "respond", '{"answer": "It shipped on Monday."}')]
    assert signals_from_messages(answered, config=SignalConfig(final_tools=("respond",))).agent_gave_up == 0
