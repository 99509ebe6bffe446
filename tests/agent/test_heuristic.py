"""The heuristic policy on real SQLite inboxes: the oracle teacher is right with the right sources, injected
error rates show up as configured, the reader answers from emails, and nothing makes it raise."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy, question_category
from agent_rl.agent.policy import PolicyTurn
from agent_rl.environments.runner import RunnerConfig
from agent_rl.environments.email.episodes import EpisodeTask, run_episodes
from agent_rl.environments.email.tools import tool_schemas
from agent_rl.environments.email.inbox.demo_corpus import build_demo_corpus
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.records import Outcome, Split
from agent_rl.environments.email.records import Category, Email, Scenario
from agent_rl.environments.email.scenarios import generate_scenarios


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """Four demo inboxes with their scenarios (~190), in a real SQLite store shared by this module."""
    store = open_inbox_store(f"sqlite:///{tmp_path_factory.mktemp('demo') / 'inbox.db'}")
    corpus = build_demo_corpus(store, seed=3, n_inboxes=4, n_emails=1600)
    scenarios = generate_scenarios(corpus, seed=3)
    yield store, scenarios
    store.close()


def play(policy, scenarios, store, **config):
    return run_episodes(policy, [EpisodeTask.from_scenario(s) for s in scenarios], store, RunnerConfig(batch_size=64, **config))


def test_oracle_without_errors_answers_correctly_citing_the_gold_emails(demo):
    store, scenarios = demo
    policy = HeuristicPolicy(HeuristicConfig(scenarios=scenarios), store=store)
    episodes = play(policy, scenarios, store)
    assert Counter(e.outcome for e in episodes) == {Outcome.CORRECT: len(scenarios)}
    for episode, scenario in zip(episodes, scenarios):
        assert set(episode.sources) == set(scenario.source_ids)
        # Legit tool use: it read every email it cites, found through search, never guessed ids.
        read_ids = [m["tool_calls"][0]["function"]["arguments"]["message_id"] for m in episode.messages
                    if m["role"] == "assistant" and m["tool_calls"][0]["function"]["name"] == "read_email"]
        assert set(episode.sources) <= set(read_ids)
        assert episode.turns <= 6
    assert {s.category for s in scenarios} == set(Category)


def test_oracle_without_the_store_still_answers_from_the_scenarios(demo):
    store, scenarios = demo
    sample = scenarios[::8]
    episodes = play(HeuristicPolicy(HeuristicConfig(scenarios=sample)), sample, store)
    assert all(e.outcome == Outcome.CORRECT for e in episodes)


def test_configured_error_rates_show_up_in_the_outcomes(demo):
    store, scenarios = demo
    answerable = [s for s in scenarios if s.answerable]
    config = HeuristicConfig(scenarios=scenarios, wrong_rate=0.2, idk_rate=0.15, malformed_rate=0.1,
                             extra_turn_rate=0.3, seed=11)
    episodes = play(HeuristicPolicy(config, store=store), answerable, store)
    n = len(episodes)
    rates = {outcome: count / n for outcome, count in Counter(e.outcome for e in episodes).items()}
    assert n >= 150
    assert rates[Outcome.WRONG] == pytest.approx(0.2, abs=0.08)
    assert rates[Outcome.IDK] == pytest.approx(0.15, abs=0.08)
    assert rates[Outcome.FORMAT_ERROR] == pytest.approx(0.1, abs=0.07)
    assert rates[Outcome.CORRECT] == pytest.approx(0.55, abs=0.1)
    assert all("format_error.unparsable_tool_call" in e.reward_components for e in episodes if e.outcome == Outcome.FORMAT_ERROR)

    def repeated_search(episode) -> bool:
        searches = [json.dumps(m["tool_calls"][0]["function"]["arguments"], sort_keys=True) for m in episode.messages
                    if m["role"] == "assistant" and m.get("tool_calls") and m["tool_calls"][0]["function"]["name"] == "search_emails"]
        return len(searches) != len(set(searches))

    finished = [e for e in episodes if e.outcome != Outcome.FORMAT_ERROR]
    assert sum(map(repeated_search, finished)) / len(finished) == pytest.approx(0.3, abs=0.1)


def test_runs_are_deterministic_per_seed_and_question(demo):
    store, scenarios = demo
    sample = scenarios[:40]
    config = HeuristicConfig(scenarios=scenarios, wrong_rate=0.3, idk_rate=0.2, malformed_rate=0.2, extra_turn_rate=0.5, seed=5)
    first = play(HeuristicPolicy(config, store=store), sample, store)
    again = play(HeuristicPolicy(config, store=store), list(reversed(sample)), store)[::-1]
    assert [e.messages for e in first] == [e.messages for e in again]
    other_seed = play(HeuristicPolicy(config.model_copy(update={"seed": 6}), store=store), sample, store)
    assert [e.outcome for e in first] != [e.outcome for e in other_seed]


def test_wrong_answers_are_plausible_but_judged_wrong(demo):
    store, scenarios = demo
    answerable = [s for s in scenarios if s.answerable][:30]
    episodes = play(HeuristicPolicy(HeuristicConfig(scenarios=scenarios, wrong_rate=1.0), store=store), answerable, store)
    assert all(e.outcome == Outcome.WRONG for e in episodes)
    assert all(e.final_answer and e.final_answer != s.answer for e, s in zip(episodes, answerable))


# -- the reader: no oracle ---------------------------------------------------------------------

INBOX = "kim@example.com"
DAY = datetime(2002, 1, 1, tzinfo=timezone.utc)
EMAILS = [
    ("<r1@x>", "Quarterly review", "The Westfield quarterly review is on March 14, 2001 at 10:00 AM in the boardroom."),
    ("<r2@x>", "Westfield invoice", "Invoice for the Westfield retrofit: the total due is $18,250.00, net 30."),
    ("<r3@x>", "Westfield retrofit lead", "Effective Monday, Dana Whitfield will lead the Westfield retrofit."),
    ("<r4@x>", "Westfield offsite", "We picked Denver for the Westfield offsite. Hotel details to follow."),
    ("<r5@x>", "Westfield capex request", "Update on the Westfield capex request: it was approved by the committee."),
]
QUESTIONS = [
    ("When is the Westfield quarterly review?", "March 14, 2001 at 10:00 AM", "<r1@x>", Category.DATE),
    ("How much do we owe for the Westfield retrofit invoice?", "$18,250.00", "<r2@x>", Category.AMOUNT),
    ("Who will lead the Westfield retrofit?", "Dana Whitfield", "<r3@x>", Category.PERSON),
    ("Where is the Westfield offsite?", "Denver", "<r4@x>", Category.LOCATION),
    ("What did the committee decide on the Westfield capex request?", "Approved", "<r5@x>", Category.STATUS),
    ("Where is the Lakeside holiday party?", "I don't know", None, Category.UNANSWERABLE),
]


@pytest.fixture
def small_store(sqlite_url):
    store = open_inbox_store(sqlite_url)
    store.add_emails(Email(message_id=mid, inbox=INBOX, date=datetime(2001, 3, 1, i, tzinfo=timezone.utc), subject=subject,
                           sender="pat@example.com", to=(INBOX,), body=body) for i, (mid, subject, body) in enumerate(EMAILS))
    yield store
    store.close()


def test_reader_extracts_answers_by_question_type_and_cites_the_email(small_store):
    scenarios = [Scenario(id=f"q{i}", inbox_id=INBOX, question=q, answer=a, source_ids=[src] if src else [],
                          category=c, split=Split.TEST, query_date=DAY) for i, (q, a, src, c) in enumerate(QUESTIONS)]
    episodes = play(HeuristicPolicy(), scenarios, small_store)
    for episode, scenario in zip(episodes, scenarios):
        assert episode.outcome == Outcome.CORRECT, (scenario.question, episode.final_answer)
        assert episode.sources == scenario.source_ids


def test_question_categories_from_wording():
    assert question_category("When is the meeting?") == Category.DATE
    assert question_category("How much was the invoice?") == Category.AMOUNT
    assert question_category("Who's the lead now?") == Category.PERSON
    assert question_category("Which city is the offsite in?") == Category.LOCATION
    assert question_category("Did the request get approved?") == Category.STATUS
    assert question_category("Tell me a joke") is None
    # The question word wins over a topic word: these ask for a date about a budget, not for an amount.
    assert question_category("When is the Blue Mesa budget review scheduled?") == Category.DATE
    assert question_category("What day and time is the budget review for the SCADA migration?") == Category.DATE
    assert question_category("What's the deadline for the wind repowering cost estimate?") == Category.DATE
    assert question_category("What's the approved budget for the pipeline retrofit?") == Category.AMOUNT


# -- robustness --------------------------------------------------------------------------------

message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "other"])},
    optional={
        "content": st.none() | st.text(max_size=40) | st.just('[{"id": 3}]') | st.just('{"body": 1}'),
        "name": st.sampled_from(["search_emails", "read_email", "x"]),
        "tool_calls": st.none() | st.lists(st.dictionaries(st.sampled_from(["function", "id"]), st.none() | st.text(max_size=5)), max_size=2),
    },
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conversations=st.lists(st.lists(message, max_size=6), max_size=4), rate=st.floats(0, 0.3))
def test_odd_conversations_never_make_it_raise(conversations, rate):
    policy = HeuristicPolicy(HeuristicConfig(wrong_rate=rate, idk_rate=rate, malformed_rate=rate, extra_turn_rate=rate))
    turns = policy.act(conversations, tool_schemas())
    assert len(turns) == len(conversations)
    assert all(isinstance(t, PolicyTurn) and (t.tool_calls or t.parse_error) for t in turns)


def test_reader_without_oracle_is_a_good_short_teacher_on_the_demo(demo):
    # Its correct episodes become SFT data: they must be common, right, and short (every token is trained).
    store, scenarios = demo
    episodes = play(HeuristicPolicy(HeuristicConfig(), store=store), scenarios, store)
    outcomes = Counter(e.outcome for e in episodes)
    assert outcomes[Outcome.CORRECT] / len(episodes) >= 0.8
    assert outcomes[Outcome.WRONG] / len(episodes) <= 0.08
    assert sum(e.turns for e in episodes) / len(episodes) <= 3.6
    correct = [e for e in episodes if e.outcome == Outcome.CORRECT]
    assert sum(e.turns == 3 for e in correct) / len(correct) >= 0.7  # search, read, answer


def test_one_at_a_time_reader_reads_the_hit_that_shows_the_answer_and_skips_quoted_headers(sqlite_url):
    store = open_inbox_store(sqlite_url)
    emails = [
        ("<f1@x>", "Harbor pipeline follow-up", "Do we have the action items for the Harbor pipeline? Thanks, Lee"),
        ("<f2@x>", "Harbor pipeline ownership",
         "After talking with Sam, we're putting Nora Quist in charge of the Harbor pipeline. Best, Ann"),
        ("<f3@x>", "Re: Moving to Tulsa",
         "Correction on my Tulsa move: the target is now July 15, 2001. Best, Omar\n"
         "On Mon, May 14, 2001 at 9:38 AM, Omar Haddad <omar@x> wrote:\n> Target date is June 2, 2001."),
    ]
    store.add_emails(Email(message_id=mid, inbox=INBOX, date=datetime(2001, 5, 20 - i, tzinfo=timezone.utc), subject=subject,
                           sender="pat@example.com", to=(INBOX,), body=body) for i, (mid, subject, body) in enumerate(emails))
    questions = [("Who is in charge of the Harbor pipeline now?", "Nora Quist", "<f2@x>", Category.PERSON),
                 ("What's the target date for Omar's move to Tulsa?", "July 15, 2001", "<f3@x>", Category.DATE)]
    scenarios = [Scenario(id=f"q{i}", inbox_id=INBOX, question=q, answer=a, source_ids=[src], category=c,
                          split=Split.TEST, query_date=DAY) for i, (q, a, src, c) in enumerate(questions)]
    episodes = play(HeuristicPolicy(HeuristicConfig(parallel_reads=1)), scenarios, store)
    store.close()
    for episode, scenario in zip(episodes, scenarios):
        assert episode.outcome == Outcome.CORRECT, (scenario.question, episode.final_answer)
        assert episode.turns == 3  # the right email is the first one read


def _final_turn(episode) -> dict:
    return [m for m in episode.messages if m["role"] == "assistant"][-1]


def _read_bodies(episode) -> list[str]:
    return [json.loads(m["content"])["body"] for m in episode.messages
            if m["role"] == "tool" and m.get("name") == "read_email" and m["content"].startswith("{")]


def test_the_answer_turn_is_the_call_alone(demo):
    # No text before the answer call: a teacher that quoted its evidence sentence there made SmolLM2-135M quote some
    # line and answer from it (docs/experiments.md).
    store, scenarios = demo
    episodes = play(HeuristicPolicy(HeuristicConfig(), store=store), scenarios[:20], store)
    assert all(_final_turn(e)["content"] == "" for e in episodes)


def test_reader_says_idk_when_the_emails_are_about_another_event_of_the_same_project(small_store):
    # The Westfield emails tell about a review, an invoice, a lead, an offsite, a capex request; not a site visit.
    scenario = Scenario(id="sv", inbox_id=INBOX, question="When is the Westfield site visit scheduled?",
                        answer="I don't know", source_ids=[], category=Category.UNANSWERABLE, split=Split.TEST,
                        query_date=DAY)
    [episode] = play(HeuristicPolicy(), [scenario], small_store)
    assert episode.outcome == Outcome.CORRECT and episode.final_answer == "I don't know"


def test_first_search_keeps_a_lone_name_with_what_it_names():
    """The student copies the teacher's first search: "Eagle Pass pipeline" leaves out the other Eagle Pass projects
    a bare "Eagle Pass" would list next to the gold email; the question's last word is what is asked, not a name."""
    from agent_rl.environments.email.heuristic import _question_queries

    first = lambda question: _question_queries(question)[0]["keywords"]  # noqa: E731
    assert first("How much budget did we get for the Eagle Pass pipeline retrofit?") == ["Eagle Pass pipeline"]
    assert first("When is the permit filing for the Stony Brook microgrid due?") == ["Stony Brook microgrid"]
    assert first("When is Sherry's move to Portland targeted for?") == ["Sherry", "Portland"]  # two names already
    assert first("Which city is the Engineering offsite in?") == ["Engineering offsite"]
    assert _question_queries("How much budget did we get for the Eagle Pass pipeline retrofit?")[1] == {
        "keywords": ["Eagle Pass"]}  # the broader search follows if the narrow one finds nothing


def _thread_store(sqlite_url, emails):
    """`emails`: (id, subject, sender, body, day of May 2001, hour) in the test inbox."""
    store = open_inbox_store(sqlite_url)
    store.add_emails(Email(message_id=mid, inbox=INBOX, date=datetime(2001, 5, day, hour, tzinfo=timezone.utc),
                           subject=subject, sender=sender, to=(INBOX,), body=body)
                     for mid, subject, sender, body, day, hour in emails)
    return store


@pytest.fixture(params=[1, 4], ids=["one-at-a-time", "together"])
def reads(request):
    """The reader's two ways of reading hits (HeuristicConfig.parallel_reads): each must get these threads right."""
    return request.param


def _ask(store, question, answer, sources, category, reads):
    scenario = Scenario(id="q", inbox_id=INBOX, question=question, answer=answer, source_ids=sources,
                        category=category, split=Split.TEST, query_date=DAY)
    [episode] = play(HeuristicPolicy(HeuristicConfig(parallel_reads=reads)), [scenario], store)
    return episode


ORIGINAL = ("<o@x>", "Harbor pipeline ownership", "ann@x.com",
            "Hi Lee,\n\nEffective Monday, Nora Quist will own the Harbor pipeline end to end.\n\nBest,\nAnn", 3, 9)
ACK = ("<a@x>", "Re: Harbor pipeline ownership", "lee@x.com",
       "Hello Ann,\n\nPerfect, thank you.\n\nLee\n\nOn Thu, May 3, 2001 at 9:00 AM, Ann Bell <ann@x.com> wrote:\n"
       "> Hi Lee,\n>\n> Effective Monday, Nora Quist will own the Harbor pipeline end to end.\n>\n> Best,\n> Ann", 4, 8)


def test_reader_answers_from_the_email_an_acknowledgement_quotes_and_cites_that_email(sqlite_url, reads):
    # "Perfect, thank you." above the quoted announcement: the answer is in the quote, so no second read is needed,
    # and the source is the quoted email (it was among the hits), which the rubric credits.
    store = _thread_store(sqlite_url, [ORIGINAL, ACK])
    episode = _ask(store, "Who did Ann put in charge of the Harbor pipeline?", "Nora Quist", ["<o@x>"],
                   Category.PERSON, reads)
    store.close()
    assert (episode.outcome, episode.final_answer, episode.sources) == (Outcome.CORRECT, "Nora Quist", ["<o@x>"])
    assert episode.turns == 3


def test_reader_checks_a_correction_as_new_as_the_acknowledgement_it_answered_from(sqlite_url, reads):
    correction = ("<c@x>", "Re: Harbor pipeline ownership", "ann@x.com",
                  "Lee,\n\nQuick correction: Kevin O'Brien will lead the Harbor pipeline, not Nora.\n\nAnn", 4, 11)
    store = _thread_store(sqlite_url, [ORIGINAL, ACK, correction])
    episode = _ask(store, "Who is the lead on the Harbor pipeline now?", "Kevin O'Brien", ["<c@x>"],
                   Category.PERSON, reads)
    store.close()
    assert (episode.outcome, episode.final_answer) == (Outcome.CORRECT, "Kevin O'Brien")


def test_reader_skips_a_forwarded_emails_header_and_matches_question_words_by_stem(sqlite_url, reads):
    forward = ("<f@x>", "Fwd: Moving to Tulsa", "pat@x.com",
               "Passing this along.\n\n---------- Forwarded message ----------\nFrom: Julia Brennan <julia@x.com>\n"
               "Date: Fri, Aug 2, 2001 at 3:40 PM\nSubject: Moving to Tulsa\n\nGood news: my move to Tulsa is "
               "approved. HR has it targeted for Tuesday 8/27, so I'll start handing off my accounts.\n\nJulia", 5, 9)
    store = _thread_store(sqlite_url, [forward])
    episode = _ask(store, "What's the target date for Julia's relocation to Tulsa?", "Tuesday 8/27", ["<f@x>"],
                   Category.DATE, reads)
    store.close()
    assert (episode.outcome, episode.final_answer) == (Outcome.CORRECT, "Tuesday 8/27")


def test_reader_answers_questions_worded_unlike_the_email(sqlite_url, reads):
    # How a question asks ("put in charge", "the group Laura manages moving") is not what the email must say.
    emails = [("<v@x>", "Summit logistics", "leo@x.com",
               "Hello,\n\nVenue update for the Procurement planning summit: we're going with Sacramento. Please hold "
               "April 8th.\n\nLeo", 6, 9),
              ("<m@x>", "Environmental team relocation", "laura@x.com",
               "Hi,\n\nIt's official: my Environmental team relocates to Santa Fe once the lease is signed.\n\nLaura", 7, 9)]
    store = _thread_store(sqlite_url, emails)
    venue = _ask(store, "Where is the Procurement planning summit being held?", "Sacramento", ["<v@x>"],
                 Category.LOCATION, reads)
    move = _ask(store, "Where is the Environmental group that Laura manages moving?", "Santa Fe", ["<m@x>"],
                Category.LOCATION, reads)
    store.close()
    assert (venue.final_answer, move.final_answer) == ("Sacramento", "Santa Fe")


def test_a_date_field_of_a_meeting_notice_is_an_answer_not_a_header(sqlite_url, reads):
    notice = ("<n@x>", "Harbor pipeline kickoff", "ann@x.com",
              "Team,\n\nHarbor pipeline kickoff meeting\nDate: Friday, March 8\nLocation: Room 4B\n\nAnn", 2, 9)
    store = _thread_store(sqlite_url, [notice])
    episode = _ask(store, "When is the Harbor pipeline kickoff meeting?", "Friday, March 8", ["<n@x>"],
                   Category.DATE, reads)
    store.close()
    assert (episode.outcome, episode.final_answer) == (Outcome.CORRECT, "Friday, March 8")


def test_parallel_reader_reads_the_hits_together_and_answers_from_the_correction(sqlite_url):
    # One turn reads every hit in the order shown (the student copies ids instead of judging snippets); the answer
    # comes from the email the one-at-a-time reader would have picked: the newest own-words correction.
    correction = ("<c@x>", "Re: Harbor pipeline ownership", "ann@x.com",
                  "Lee,\n\nQuick correction: Kevin O'Brien will lead the Harbor pipeline, not Nora.\n\nAnn", 4, 11)
    follow_up = ("<u@x>", "Harbor pipeline follow-up", "kim@x.com",
                 "Lee,\n\nDo we have the action items for the Harbor pipeline?\n\nKim", 6, 9)
    store = _thread_store(sqlite_url, [ORIGINAL, ACK, correction, follow_up])
    scenario = Scenario(id="q", inbox_id=INBOX, question="Who is the lead on the Harbor pipeline now?",
                        answer="Kevin O'Brien", source_ids=["<c@x>"], category=Category.PERSON, split=Split.TEST,
                        query_date=DAY)
    [episode] = play(HeuristicPolicy(HeuristicConfig(parallel_reads=4)), [scenario], store)
    store.close()
    assert (episode.outcome, episode.final_answer, episode.sources) == (Outcome.CORRECT, "Kevin O'Brien", ["<c@x>"])
    assert episode.turns == 3
    search, reads, _ = [m for m in episode.messages if m["role"] == "assistant"]
    hits = [hit["id"] for hit in json.loads(episode.messages[episode.messages.index(search) + 1]["content"])]
    assert [c["function"]["arguments"]["message_id"] for c in reads["tool_calls"]] == hits
    assert len(_read_bodies(episode)) == 4


def test_parallel_reader_is_as_good_a_teacher_on_the_demo_in_fewer_turns(demo):
    store, scenarios = demo
    one = play(HeuristicPolicy(HeuristicConfig(parallel_reads=1), store=store), scenarios, store)
    together = play(HeuristicPolicy(HeuristicConfig(parallel_reads=4), store=store), scenarios, store)
    correct = [sum(e.outcome == Outcome.CORRECT for e in run) / len(run) for run in (one, together)]
    assert correct[1] >= correct[0] - 0.02
    assert sum(e.turns for e in together) <= sum(e.turns for e in one)
    assert max(len(m.get("tool_calls") or []) for e in together for m in e.messages) > 1


@pytest.mark.parametrize("knob", ["explain_answer", "search_again", "retry_rate"])
def test_removed_teacher_knobs_are_refused_not_ignored(knob):
    with pytest.raises(ValueError, match="docs/experiments.md"):
        HeuristicConfig.model_validate({knob: 1})


def test_after_its_answer_a_users_new_question_is_worked_on_not_the_first_again(demo):
    """Through the gateway a user may ask a follow-up (or re-ask) after the answer: the agent works on what it is
    asked now, with the same tools, instead of repeating its first answer."""
    store, scenarios = demo
    first, second = scenarios[0], next(s for s in scenarios[1:] if s.inbox_id == scenarios[0].inbox_id
                                       and s.question != scenarios[0].question)
    policy = HeuristicPolicy(HeuristicConfig(scenarios=[first, second]), store=store)
    messages = play(policy, [first], store)[0].messages
    calls = [(i, m["tool_calls"][0]) for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("tool_calls")]
    end, final = calls[-1]
    assert final["function"]["name"] == "return_final_answer"
    follow_up = [*messages[:end + 1], {"role": "tool", "tool_call_id": final.get("id", "c"), "content": "ok"},
                 {"role": "user", "content": second.question}]
    turn = policy.act([follow_up], tools=tool_schemas())[0]
    assert turn.tool_calls and turn.tool_calls[0].name == "search_emails"  # a new search, not the first answer again
    assert turn.tool_calls[0].arguments != calls[0][1]["function"]["arguments"]
    thanked = [*follow_up[:-1], {"role": "user", "content": "thx"}]  # asks nothing: the answer stands, given again
    again = policy.act([thanked], tools=tool_schemas())[0]
    assert again.tool_calls[0].name == "return_final_answer"
    assert again.tool_calls[0].arguments == final["function"]["arguments"] or json.loads(
        final["function"]["arguments"]) == again.tool_calls[0].arguments
