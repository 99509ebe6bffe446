"""A rule-based policy that uses the tools sensibly: search, read the best hits, answer.

It stands in for a strong prompted model as the teacher (with the scenarios as an oracle its
trajectories become SFT data) and for load tests (it answers instantly). Configured error
rates inject wrong answers, "I don't know", malformed tool calls and wasted turns, drawn
deterministically per (seed, question) so runs are reproducible.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent_rl.environments.answers import DeterministicJudge, is_idk
from agent_rl.environments.email.inbox.store_interface import InboxStore
from agent_rl.environments.email.reading import (  # noqa: F401 - question_category is this module's API too
    STOP_WORDS,
    TEXT_CACHE,
    evidence_from,
    hit_relevance,
    proper_phrases,
    shows_answer,
    content_words,
    question_category,
)
from agent_rl.environments.policy import Conversation, Policy, PolicyTurn, ToolCall, ToolSchema
from agent_rl.environments.email.records import Scenario

IDK = "I don't know"

# Lower-case words after a lone name that the first search keeps with it (the student copies this habit).
NAMED_THING_WORDS = 2


# Teacher variants that were measured, made the SFT student worse, and were taken out (docs/experiments.md).
REMOVED_KNOBS = frozenset({"explain_answer", "search_again", "retry_rate"})


class HeuristicConfig(BaseModel):
    """Error rates (each a share of episodes), the seed, and the optional oracle."""

    model_config = ConfigDict(frozen=True)

    wrong_rate: float = Field(0.0, ge=0, le=1, description="share of episodes answered with a wrong answer")
    idk_rate: float = Field(0.0, ge=0, le=1, description="share of episodes answered \"I don't know\"")
    malformed_rate: float = Field(0.0, ge=0, le=1, description="share of episodes with a malformed tool call")
    extra_turn_rate: float = Field(0.0, ge=0, le=1, description="share of episodes that waste one turn")
    seed: int = 0
    scenarios: list[Scenario] = Field(default_factory=list, description="oracle: golden answers by question text")
    # Short, clean trajectories are what the student imitates (every token is a trained token). The first search is
    # built from the question's names, so a second one rarely finds what it missed; reading the hits together leaves
    # the student only the answer to choose (fewer wrong answers). Measurements, and the teacher variants tried and
    # dropped (quoting the evidence sentence, retry rows, searching again): docs/experiments.md.
    max_searches: int = Field(1, ge=1, description="searches before giving up")
    max_reads: int = Field(2, ge=1, description="emails read before giving up")
    parallel_reads: int = Field(
        4, ge=1, description="read up to this many relevant hits of the search together in one turn, in the order "
        "shown, and answer from the one that tells (the student copies ids instead of judging snippets); 1 reads one "
        "at a time, the likeliest first. Four read calls (~57 tokens each) fit the runner's 256-token turn")
    version: str = "heuristic-v1"

    @model_validator(mode="before")
    @classmethod
    def _no_removed_knobs(cls, values: Any) -> Any:
        removed = sorted(set(values) & REMOVED_KNOBS) if isinstance(values, dict) else []
        if removed:
            raise ValueError(f"{', '.join(removed)}: removed, measured to make the student worse "
                             "(docs/experiments.md)")
        return values

    @model_validator(mode="after")
    def _rates_fit(self) -> HeuristicConfig:
        total = self.wrong_rate + self.idk_rate + self.malformed_rate
        if total > 1:
            raise ValueError(f"wrong_rate + idk_rate + malformed_rate = {total} must not exceed 1")
        return self


@dataclass
class _Plan:
    """The injected errors of one episode, drawn from (seed, question)."""

    mistake: str | None  # "wrong" | "idk" | "malformed" | None
    extra_turn: bool
    malformed_turn: int


@dataclass
class _State:
    """What the conversation so far tells: the question, searches made, hits seen, emails read."""

    question: str = ""
    system: str = ""
    turn: int = 0
    searches: list[dict[str, Any]] = field(default_factory=list)
    hits: list[str] = field(default_factory=list)
    hit_text: dict[str, str] = field(default_factory=dict)
    hit_date: dict[str, str] = field(default_factory=dict)
    hit_origin: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (sender, subject)
    reads: dict[str, dict[str, Any]] = field(default_factory=dict)
    read_order: list[str] = field(default_factory=list)
    repeated_search: bool = False


def _named_thing(question: str, phrase: str, words: int = NAMED_THING_WORDS) -> str | None:
    """The name followed by the lower-case words that say what it is ("Eagle Pass pipeline"), or None. A word that
    ends the question is left out: there it is usually what is asked about it ("... microgrid due?")."""
    match = re.search(re.escape(phrase) + r"((?:\s+[a-z][a-z-]*)+)", question)
    if not match:
        return None
    run = match.group(1).split()
    if not question[match.end():].strip(" ?!.").strip():
        run = run[:-1]
    following = []
    for word in run:
        if word in STOP_WORDS or len(following) == words:
            break
        following.append(word)
    return f"{phrase} {' '.join(following)}" if following else None


def _question_queries(question: str) -> list[dict[str, Any]]:
    """Searches from the question alone: its names together, a lone name with what it names ("Eagle Pass pipeline
    retrofit", not every Eagle Pass project), each name, a name with a topic word, topic words."""
    phrases = proper_phrases(question)
    in_phrases = {w.lower() for p in phrases for w in p.split()}
    topic = sorted((w for w in content_words(question) if w not in in_phrases), key=len, reverse=True)
    queries = []
    thing = _named_thing(question, phrases[0]) if len(phrases) == 1 else None
    if thing:
        queries.append([thing])
    if phrases:
        queries.append(phrases[:3])
    if len(phrases) > 1:
        queries += [[p] for p in phrases[:3]]
    if phrases and topic:
        queries.append([phrases[0], topic[0]])
    if len(topic) >= 2:
        queries.append(topic[:2])
    queries += [[w] for w in topic[:1]]
    return [{"keywords": q} for q in queries]


class HeuristicPolicy(Policy):
    """Reads each conversation and picks the next tool call by rules; never raises."""

    # It never edits the conversations it is given, so the runner may pass them without copying.
    reads_conversations_only = True

    def __init__(self, config: HeuristicConfig | None = None, store: InboxStore | None = None) -> None:
        self.config = config or HeuristicConfig()
        self.version = self.config.version
        # With the store the oracle can pick keywords from the gold email itself.
        self._store = store
        self._scenarios: dict[str, list[Scenario]] = {}
        for scenario in self.config.scenarios:
            self._scenarios.setdefault(scenario.question.strip(), []).append(scenario)
        self._judge = DeterministicJudge()
        self._queries: dict[str, list[dict[str, Any]]] = {}
        self._plans: dict[str, _Plan] = {}
        # The runner passes equal tool schemas every turn: measure their size once, compare after.
        self._schema_size: tuple[list[dict[str, Any]], int] | None = None

    def act(
        self, conversations: list[Conversation], tools: list[ToolSchema], max_new_tokens: int = 256
    ) -> list[PolicyTurn]:
        return [self._act_one(conversation, self._schema_chars(tools)) for conversation in conversations]

    def _schema_chars(self, tools: list[ToolSchema]) -> int:
        if not tools:
            return 0
        known = self._schema_size
        if known is not None and known[0] == tools:
            return known[1]
        size = len(json.dumps(tools))
        self._schema_size = (json.loads(json.dumps(tools)), size)  # our own copy: the caller may edit theirs
        return size

    # -- one turn ----------------------------------------------------------------------------

    def _act_one(self, conversation: list[dict[str, Any]], schema_chars: int) -> PolicyTurn:
        try:
            state = _read_state(conversation)
            turn = self._decide(state)
        except Exception:  # an odd conversation gets an honest give-up, not an exception
            state = _State()
            turn = _call(0, "return_final_answer", {"answer": IDK, "sources": []})
        prompt_chars = schema_chars + sum(_message_chars(m) for m in conversation)
        completion_chars = len(turn.content) + sum(len(json.dumps(c.arguments)) + len(c.name) + 20 for c in turn.tool_calls)
        # About four characters per token: close enough for cost accounting in load tests.
        turn.prompt_tokens = prompt_chars // 4 + 1
        turn.completion_tokens = completion_chars // 4 + 1
        return turn

    def _plan(self, question: str) -> _Plan:
        plan = self._plans.get(question)
        if plan is None:
            if len(self._plans) > 100_000:  # bounded memory in long load tests
                self._plans.clear()
            plan = self._plans[question] = self._draw_plan(question)
        return plan

    def _draw_plan(self, question: str) -> _Plan:
        digest = hashlib.sha256(f"{self.config.seed}\x00{question}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        draw, extra, malformed_turn = rng.random(), rng.random(), rng.randrange(3)
        c = self.config
        mistake = None
        if draw < c.malformed_rate:
            mistake = "malformed"
        elif draw < c.malformed_rate + c.wrong_rate:
            mistake = "wrong"
        elif draw < c.malformed_rate + c.wrong_rate + c.idk_rate:
            mistake = "idk"
        return _Plan(mistake, extra < c.extra_turn_rate, malformed_turn)

    def _decide(self, state: _State) -> PolicyTurn:
        plan = self._plan(state.question)
        scenario = self._scenario_for(state)
        queries = self._search_plan(state.question, scenario)
        step = (self._oracle_step(state, scenario, queries) if scenario
                else self._reading_step(state, queries, self.config.max_searches))
        if step is None and plan.extra_turn and not state.repeated_search and state.searches:
            step = _call(state.turn, "search_emails", dict(state.searches[0]))
        # The malformed call replaces a chosen turn, or the answer if the episode ends sooner.
        if plan.mistake == "malformed" and (step is None or state.turn >= plan.malformed_turn):
            return _malformed(queries[0])
        return step or self._answer(state, scenario, plan)

    def _scenario_for(self, state: _State) -> Scenario | None:
        candidates = self._scenarios.get(state.question.strip())
        if not candidates:
            return None
        # The same question may be asked of several inboxes: the system prompt names this one.
        return next((s for s in candidates if s.inbox_id in state.system), candidates[0])

    def _oracle_step(self, state: _State, scenario: Scenario, queries: list[dict[str, Any]]) -> PolicyTurn | None:
        """Search until a gold email shows up, read the gold emails seen; None when ready to answer."""
        gold = scenario.source_ids if scenario.answerable else []
        unread_gold = [h for h in state.hits if h in gold and h not in state.reads]
        if unread_gold:
            return _call(state.turn, "read_email", {"message_id": unread_gold[0]})
        if not state.searches:
            return _call(state.turn, "search_emails", queries[0])
        if not gold or set(gold) <= set(state.reads):
            return None
        if len(state.searches) < min(len(queries), self.config.max_searches):
            return _call(state.turn, "search_emails", queries[len(state.searches)])
        return None

    def _reading_step(self, state: _State, queries: list[dict[str, Any]], searches: int) -> PolicyTurn | None:
        """Search, read the likeliest hit until a relevant email yields an answer; None when ready to answer."""
        unread = [h for h in state.hits if h not in state.reads and hit_relevance(state.question, state.hit_text.get(h, "")) > 0]
        if self.config.parallel_reads > 1:
            return self._parallel_reading_step(state, unread, queries, searches)
        last = state.reads[state.read_order[-1]] if state.read_order else None
        found = evidence_from(state.question, last) if last is not None else None
        if found:
            if not found.from_quote or len(state.reads) >= self.config.max_reads:
                return None
            # An acknowledgement answers from the email it quotes; a hit as new that shows an answer may correct it.
            day = str(last.get("date") or "")[:10]
            newer = [h for h in unread if state.hit_date.get(h, "") >= day
                     and shows_answer(state.question, state.hit_text.get(h, ""))]
            return _call(state.turn, "read_email", {"message_id": newer[0]}) if newer else None
        if unread and len(state.reads) < self.config.max_reads:
            best = max(unread, key=lambda h: _read_preference(state, h))
            return _call(state.turn, "read_email", {"message_id": best})
        if len(state.searches) < min(len(queries), searches):
            return _call(state.turn, "search_emails", queries[len(state.searches)])
        return None

    def _parallel_reading_step(self, state: _State, unread: list[str], queries: list[dict[str, Any]],
                               searches: int) -> PolicyTurn | None:
        """Search, then read the relevant hits together in one turn; None when ready to answer."""
        if state.reads:
            return None
        if unread:
            batch = unread[: self.config.parallel_reads]
            return _calls(state.turn, [("read_email", {"message_id": h}) for h in batch])
        if len(state.searches) < min(len(queries), searches):
            return _call(state.turn, "search_emails", queries[len(state.searches)])
        return None

    def _answer_candidates(self, state: _State) -> list[str]:
        """Read emails in the order the answer is looked for: one at a time, the last read (it was read because
        the earlier ones did not tell); read together, the one the sequential teacher would have read first,
        an email's own words before a quote it carries.

        Tried and not kept: the newest read email with the answer in its own words first. The better teacher gave the
        worse student, which still answered from the announcement over the correction (docs/experiments.md)."""
        if self.config.parallel_reads == 1:
            return list(reversed(state.read_order))

        def quoted_or_silent(message_id: str) -> bool:
            found = evidence_from(state.question, state.reads[message_id])
            return found is None or found.from_quote

        ranked = sorted(state.read_order, key=lambda m: _read_preference(state, m), reverse=True)
        return sorted(ranked, key=quoted_or_silent)  # stable: own-words evidence first, each part in rank order

    def _answer(self, state: _State, scenario: Scenario | None, plan: _Plan) -> PolicyTurn:
        answer, sources = IDK, []
        if scenario is not None:
            if scenario.answerable:
                answer = scenario.answer
                gold = scenario.source_ids
                sources = [g for g in gold if g in state.reads] or [g for g in gold if g in state.hits] or list(gold)
        else:
            for message_id in self._answer_candidates(state):
                found = evidence_from(state.question, state.reads[message_id])
                if found:
                    answer = found.answer
                    sources = [_quoted_origin(state, message_id) if found.from_quote else message_id]
                    break
        if plan.mistake == "idk":
            answer, sources = IDK, []
        elif plan.mistake == "wrong":
            answer = self._wrong_answer(state, scenario, answer)
            sources = sources or state.read_order[:1]
        return _call(state.turn, "return_final_answer", {"answer": answer, "sources": sources})

    def _wrong_answer(self, state: _State, scenario: Scenario | None, right: str) -> str:
        """A plausible answer that the judge rejects (checked against the golden when it is known)."""
        candidates = []
        if right and not is_idk(right):
            shifted = re.sub(r"\d+", lambda m: str(int(m.group()) % 9 + 2) if len(m.group()) < 3 else str(int(m.group()) + 7), right)
            if shifted != right:
                candidates.append(shifted)
        candidates += ["Next Tuesday at 4 pm", "$12,345", "Robert Fallon", "In Chicago", "It was cancelled"]
        golden = (scenario.answer if scenario and scenario.answerable else IDK) if scenario else right
        for candidate in candidates:
            if not self._judge.judge(state.question, golden, candidate).correct:
                return candidate
        return "Nobody"

    # -- search queries -----------------------------------------------------------------------

    def _search_plan(self, question: str, scenario: Scenario | None) -> list[dict[str, Any]]:
        key = question.strip() + ("\x00oracle" if scenario else "")
        if key not in self._queries:
            queries = self._oracle_queries(question, scenario) if scenario else []
            queries += _question_queries(question)
            unique: list[dict[str, Any]] = []
            for query in queries:
                if query not in unique:
                    unique.append(query)
            if len(self._queries) > 100_000:  # bounded memory in long load tests
                self._queries.clear()
            self._queries[key] = unique or [{"keywords": [question.split()[0] if question.split() else "email"]}]
        return self._queries[key]

    def _oracle_queries(self, question: str, scenario: Scenario) -> list[dict[str, Any]]:
        """Keywords that find the gold email: question words it contains, then its subject words, then by sender."""
        if self._store is None or not scenario.answerable or not scenario.source_ids:
            return []
        try:
            email = self._store.read(scenario.inbox_id, scenario.source_ids[0])
        except Exception:
            email = None
        if email is None:
            return []
        in_email = set(content_words(f"{email.subject} {email.body}"))
        shared = [p for p in proper_phrases(question) if p.lower() in f"{email.subject} {email.body}".lower()]
        shared += sorted((w for w in content_words(question) if w in in_email), key=len, reverse=True)
        subject = [w for w in content_words(email.subject) if not w[:1].isdigit()]
        queries = []
        if shared:
            queries.append({"keywords": shared[:2]})
        if subject:
            queries.append({"keywords": subject[:3]})
        if shared and email.sender:
            queries.append({"keywords": shared[:1], "sender": email.sender})
        return queries


def _quoted_origin(state: _State, message_id: str) -> str:
    """The email a read reply quotes, when it was among the hits (the same subject, from the "On ..., <address>
    wrote:" sender): what to cite for an answer from the quote. Else the reply itself."""
    email = state.reads[message_id]
    sender = _QUOTED_SENDER_RE.search(str(email.get("body", "")))
    subject = _REPLY_PREFIX_RE.sub("", str(email.get("subject", "")))
    if not sender:
        return message_id
    origin = (sender.group(1).lower(), subject)
    return next((h for h in state.hits if h != message_id and state.hit_origin.get(h) == origin), message_id)


_QUOTED_SENDER_RE = re.compile(r"^On .{6,200}<([^<>\s]+@[^<>\s]+)> wrote:$", re.MULTILINE)
_REPLY_PREFIX_RE = re.compile(r"^(?:(?:re|fw|fwd):\s*)+", re.IGNORECASE)


def _message_chars(message: dict[str, Any]) -> int:
    calls = message.get("tool_calls", "")
    # json.dumps("") is '""': two characters for a message without tool calls, without encoding anything.
    return len(str(message.get("content") or "")) + (2 if calls == "" else len(json.dumps(calls)))


def _call(turn: int, name: str, arguments: dict[str, Any]) -> PolicyTurn:
    return PolicyTurn(tool_calls=[ToolCall(name=name, arguments=arguments, id=f"call_{turn}")])


def _read_preference(state: _State, message_id: str) -> tuple[Any, ...]:
    """How likely a hit is to answer, from its subject/snippet: one that already shows an answer of the asked kind
    first, then the most relevant, the newest among equals (a later email may correct an earlier one)."""
    text = state.hit_text.get(message_id, "")
    relevance = hit_relevance(state.question, text)
    return (shows_answer(state.question, text), int(relevance), state.hit_date.get(message_id, ""), relevance)


def _calls(turn: int, calls: list[tuple[str, dict[str, Any]]]) -> PolicyTurn:
    """Several tool calls in one turn (run in order, each result its own tool message)."""
    return PolicyTurn(tool_calls=[ToolCall(name=name, arguments=arguments, id=f"call_{turn}_{index}")
                                  for index, (name, arguments) in enumerate(calls)])


def _malformed(query: dict[str, Any]) -> PolicyTurn:
    # What a small model emits when it stops mid-call: the runner must see a format error.
    text = '<tool_call>\n{"name": "search_emails", "arguments": ' + json.dumps(query)[:-2]
    return PolicyTurn(content=text, parse_error="unterminated JSON in <tool_call>")


def _read_state(conversation: list[dict[str, Any]]) -> _State:
    """The state of the request the agent works on: the last one its user made. A user who asks again after the
    agent's answer (a follow-up, a re-ask, a correction) starts a new request, worked on afresh like the first: the
    agent answers what it is asked now, not its first question again (its injected errors are drawn per request).
    Words that ask nothing ("thx", "ok great") leave the request as it was: the agent gives its answer again."""
    state = _State()
    for message in conversation:
        role = message.get("role")
        if role == "system":  # the instructions, then whose inbox and which day
            state.system += str(message.get("content") or "") + "\n"
        elif role == "user":
            text = str(message.get("content") or "")
            if state.turn and _asks(text):
                state = _State(question=text, system=state.system)
            elif not state.question:
                state.question = text
        elif role == "assistant":
            state.turn += 1
            for call in message.get("tool_calls") or []:
                function = call.get("function", {})
                if function.get("name") == "search_emails":
                    arguments = function.get("arguments")
                    if arguments in state.searches:
                        state.repeated_search = True
                    state.searches.append(arguments)
        elif role == "tool":
            _read_tool_result(state, message)
    return state


_UNPARSABLE = object()
_COURTESY = re.compile(r"^\W*(?:thanks?|thx|thank you|ty|ok(?:ay)?|great|perfect|cool|got it|bye)\b", re.IGNORECASE)


def _asks(text: str) -> bool:
    """Whether a user's words after an answer ask for something: a question, or a sentence of four words or more
    that does not open with thanks ("no, I meant the Boise office" asks; "thx", "ok great, thanks" do not)."""
    return "?" in text or (len(re.findall(r"[A-Za-z]{3,}", text)) >= 4 and not _COURTESY.match(text))


@lru_cache(maxsize=TEXT_CACHE)
def _parsed_result(content: str) -> Any:
    """A tool result's JSON, parsed once: every later turn re-reads the same results (callers only read it)."""
    try:
        return json.loads(content)
    except ValueError:
        return _UNPARSABLE


def _read_tool_result(state: _State, message: dict[str, Any]) -> None:
    content = message.get("content") or ""
    if not isinstance(content, str):
        return  # not a JSON text (json.loads would refuse it too)
    result = _parsed_result(content)
    if result is _UNPARSABLE:
        return
    if message.get("name") == "search_emails" and isinstance(result, list):
        for hit in result:
            if isinstance(hit, dict) and isinstance(hit.get("id"), str) and hit["id"] not in state.hits:
                state.hits.append(hit["id"])
                state.hit_text[hit["id"]] = f"{hit.get('subject', '')} {hit.get('snippet', '')}"
                state.hit_date[hit["id"]] = str(hit.get("date") or "")
                state.hit_origin[hit["id"]] = (str(hit.get("from") or "").lower(), str(hit.get("subject") or ""))
    elif message.get("name") == "read_email" and isinstance(result, dict) and "body" in result:
        message_id = str(result.get("id"))
        if message_id not in state.reads:
            state.read_order.append(message_id)
        state.reads[message_id] = result


