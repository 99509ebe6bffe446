"""Implicit signals of one episode, read from its recorded conversation: what users show without rating.

A user rarely presses thumbs-up or -down, but the conversation the gateway records already says a lot: a user who
asks the same thing again, says "no, I meant...", stops before the agent answered, or writes "thanks!" has told us
how it went; one who goes on to ask something else (a follow-up on another topic) mostly took the answer, and is
counted as such rather than as a re-ask. Everything here is read from the episode as the pool stores it
(docs/architecture.md, Records): `messages` in OpenAI's layout (user and assistant turns, assistant `tool_calls`,
`tool` results), `final_answer` (the gateway sets it to the last reply's text, or to the arguments of the client's
final-tool call) and `feedback` (the explicit rating, when a user gave one). No model and no network: word overlap
and phrase patterns, so a week of traffic is read in seconds and the same conversation always gives the same signals.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from agent_rl.environments.messages import text_of
from agent_rl.agent.tool_calls import call_name
from agent_rl.feedback.ratings import feedback_reward
from agent_rl.records import Episode

# Implicit features in a fixed order: the labeler's columns. The explicit rating is not one of them: it is the label.
FEATURE_NAMES = (
    "user_turns", "assistant_turns", "tool_calls", "tool_errors", "reasks", "max_reask_similarity",
    "corrections", "complaints", "thanks", "agent_gave_up", "abandoned", "follow_ups",
)

_WORD = re.compile(r"[a-z0-9]+")
# Function words and chat filler: they make unrelated requests look alike, so re-asks compare the rest.
_STOP = frozenset("""
a about above after again all also am an and any are as at be been being but by can could did do does doing
for from get got had has have how i if in into is it its just know let like me might more most much my need no
not now of off on once only or our out over please so some than that the their them then there these they this
those to too up us very want was we were what when where which while who why will with would you your yes ok okay
hi hello hey tell show give help asked ask again still mean meant
""".split())

_CORRECTION = re.compile(
    r"\bi meant\b|\bactually,? i (?:want|need)|\bnot what i (?:asked|meant|wanted|need(?:ed)?|said)\b"
    r"|\b(?:that'?s|that is|this is|it'?s|thats) (?:not (?:right|correct|it|true|what)|wrong|incorrect)\b"
    r"|\byou misunderstood\b|\bmisunderstand|\b(?:wrong|incorrect) (?:answer|order|one|item|account|date|product)\b"
    r"|^\W*(?:no|nope|nah)\b(?!\W*(?:thanks|thank|problem|worries|need|that'?s all))")
_COMPLAINT = re.compile(
    r"\buseless\b|\bnot (?:helpful|helping)\b|\bunhelpful\b|\bwaste of (?:my )?time\b|\bterrible\b|\bawful\b"
    r"|\bridiculous\b|\bfrustrat\w*|\bannoying\b|\bforget it\b|\bnever ?mind\b|\bi give up\b|\bstupid\b"
    r"|\bhorrible\b|\bworst\b|\b(?:does ?n[o']?t|did ?n[o']?t|does not|did not) (?:work|help)\b"
    r"|\bstill (?:wrong|not)\b")
_THANKS = re.compile(
    r"\bthank(?:s| you| u)?\b|\bthx\b|\bty\b|\bappreciate|\bperfect\b|\bawesome\b|\bexcellent\b|\bbrilliant\b"
    r"|\bthat helps\b|(?<!not )(?<!un)\bhelpful\b|\bexactly what\b|\bthat works\b|\bworks now\b|\bsolved\b|\bgreat\b")
# A turn that asks for something: a question mark, a polite request, or a question word that opens a sentence or
# follows "also", "and", "one more thing"... ("Thanks! Also, what ..."). Thanks and complaints ask nothing, so they
# never read as follow-ups; "and have a nice day" neither ("have" only asks at a sentence's start).
_ASKS = r"(?:what|where|when|how|who|whom|which|why|is|are|was|were|do|does|did|can|could|should|will|would)\b"
_REQUEST = re.compile(
    r"\?|\bplease\b|\b(?:can|could|would|will) you\b"
    rf"|(?:^|[.!:;]\s*)\W*(?:{_ASKS}|(?:has|have)\b|i (?:need|want|would like|moved)\b)"
    rf"|\b(?:also|and|btw|by the way|one more thing|another (?:thing|question)|oh|ok(?:ay)?|so)\W+{_ASKS}")
_GAVE_UP = re.compile(
    r"\bi (?:could ?n[o']?t|can ?n[o']?t|cannot|was unable|am unable|am not able)\b|\bi'm (?:unable|not able)\b"
    r"|\bunable to\b|\bi don'?t know\b|\bno results\b|\bunfortunately\b")
_ERROR_TEXT = re.compile(
    r"^\W*(?:error|exception|traceback|failed|failure|fatal)\b|\b(?:http|status)\W*[45]\d\d\b|\btimed? ?out\b",
    re.IGNORECASE)


@dataclass(frozen=True)
class SignalConfig:
    """How signals are read. `reask_similarity`: the Jaccard overlap of content words at which a later user turn
    restates an earlier one (a re-ask shares most of its words; a follow-up on a new topic shares a word or two);
    `follow_up_similarity`: the overlap below which a later request asks something new (a follow-up); between the
    two a turn is neither, since a loosely reworded re-ask lands there too;
    `min_words`: content words both turns need before they are compared (so "ok" never matches "ok");
    `final_tools`: tools whose call is the agent's answer (the gateway's `final_tool`), when the episode's
    `final_answer` does not show it already."""

    reask_similarity: float = 0.4
    follow_up_similarity: float = 0.2
    min_words: int = 2
    final_tools: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 < self.reask_similarity <= 1:
            raise ValueError(f"reask_similarity must be in (0, 1], got {self.reask_similarity}")
        if not 0 < self.follow_up_similarity <= self.reask_similarity:
            raise ValueError(f"follow_up_similarity must be in (0, reask_similarity], got {self.follow_up_similarity}")
        if self.min_words < 1:
            raise ValueError(f"min_words must be >= 1, got {self.min_words}")


@dataclass(frozen=True)
class Signals:
    """What one episode's conversation shows about how it went, and the user's rating when there is one.

    Thanks, corrections and complaints count user turns after the agent's first reply (a first message saying
    "thanks in advance" thanks nobody yet); re-asks compare each later user turn with the earlier ones;
    `follow_ups` counts later turns that ask for something none of the earlier ones asked (a new topic: neither a
    re-ask nor a correction or complaint); `abandoned` is a conversation that ends before the agent answered (its
    last tool calls never got results, or the user's or a tool's message is the last one)."""

    episode_id: str | None
    user_turns: int
    assistant_turns: int
    tool_calls: int
    tool_errors: int
    reasks: int
    max_reask_similarity: float
    corrections: int
    complaints: int
    thanks: int
    agent_gave_up: int
    abandoned: bool
    follow_ups: int = 0
    rating: float | None = None  # the explicit rating (up 1, down -1, or the reward sent); None: unrated

    @property
    def rated(self) -> bool:
        return self.rating is not None

    def features(self) -> dict[str, float]:
        """The implicit signals as numbers, in FEATURE_NAMES order. The rating is left out on purpose: the labeler
        learns to predict it from these, so it must never be one of its inputs."""
        return {name: float(getattr(self, name)) for name in FEATURE_NAMES}

    def to_metadata(self) -> dict[str, Any]:
        """Plain JSON values for curation's files and Dagster metadata."""
        return asdict(self)


def _stem(word: str) -> str:
    """A crude suffix strip, enough for "orders"/"order" and "shipping"/"shipped" to meet."""
    for suffix, repl in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)] + repl
    return word


def content_words(text: str) -> frozenset[str]:
    """The words of a turn that carry its request: lower-cased, function words dropped, suffixes stripped."""
    return frozenset(_stem(w) for w in _WORD.findall(text.lower().replace("'", "")) if w not in _STOP)


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard overlap of two turns' content words (0 when either is empty)."""
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def is_tool_error(content: Any) -> bool:
    """Whether a tool result reports an error: a JSON object with a truthy `error` (or `is_error`, or a failed
    `status`), or text that starts with "Error"/"Exception"/"Traceback", names an HTTP 4xx/5xx or a timeout."""
    text = text_of(content, " ").strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's limit (validation names it)
            value = None
        if isinstance(value, Mapping):
            status = str(value.get("status", "")).lower()
            return bool(value.get("error") or value.get("is_error") or value.get("isError")) or status in (
                "error", "failed", "failure")
    return bool(_ERROR_TEXT.search(text))


def _answered(last: Mapping[str, Any], final_answer: str | None, final_tools: Sequence[str]) -> bool:
    """Whether the conversation's last message is the agent's answer: text without pending tool calls, or a call
    of a final tool (named in the config, or the call whose arguments the gateway stored as the final answer)."""
    if last.get("role") != "assistant":
        return False
    calls = last.get("tool_calls") or []
    if not calls:
        return bool(text_of(last.get("content"), " ").strip())
    for call in calls:
        if call_name(call) in final_tools:
            return True
        arguments = (call.get("function") or {}).get("arguments") if isinstance(call, Mapping) else None
        if final_answer is not None and isinstance(arguments, str) and arguments == final_answer:
            return True
    return False


def _said(message: Mapping[str, Any], final_answer: str | None, final_tools: Sequence[str]) -> str:
    """What an assistant message says to its user: its text, and the answer it gives through a final tool's call
    (a call named in `final_tools`, or the one whose arguments the gateway stored as the final answer): an agent that
    answers `{"answer": "I don't know"}` through its final tool gave up as surely as one that says it in words."""
    parts = [text_of(message.get("content"), " ")]
    for call in message.get("tool_calls") or []:
        if not isinstance(call, Mapping):
            continue
        arguments = (call.get("function") or {}).get("arguments")
        if call_name(call) in final_tools or (final_answer is not None and arguments == final_answer):
            parts.extend(_strings(arguments))
    return " ".join(p for p in parts if p)


def _strings(arguments: Any) -> list[str]:
    """The string values of a call's arguments (JSON text or an object); text that is not JSON, as it is."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return [arguments]
    if isinstance(arguments, str):
        return [arguments]
    if isinstance(arguments, Mapping):
        return [s for value in arguments.values() for s in _strings(value)]
    if isinstance(arguments, (list, tuple)):
        return [s for value in arguments for s in _strings(value)]
    return []


def _overlaps(texts: list[str], config: SignalConfig) -> list[float | None]:
    """Per user turn (lower-cased), its highest overlap with an earlier one (None: the first turn, too few words to
    compare, or a thanks that asks nothing: a second "great, that's what I needed" after a follow-up's answer
    restates no question)."""
    words = [content_words(t) if _REQUEST.search(t) or not _THANKS.search(t) else frozenset() for t in texts]
    out: list[float | None] = [None]
    for j in range(1, len(words)):
        if len(words[j]) < config.min_words:
            out.append(None)
            continue
        out.append(max((similarity(words[i], words[j]) for i in range(j) if len(words[i]) >= config.min_words),
                       default=0.0))
    return out[: len(words)]


def _is_follow_up(text: str, overlap: float | None, config: SignalConfig) -> bool:
    """A later turn that asks for something new: a request that shares at most a word or two with every earlier
    turn, and is neither a correction ("no, I meant ...") nor a complaint."""
    return (overlap is not None and overlap < config.follow_up_similarity and bool(_REQUEST.search(text))
            and not _CORRECTION.search(text) and not _COMPLAINT.search(text))


def rating_of(feedback: Any) -> float | None:
    """The explicit rating: curation's reading of the feedback (agent_rl/feedback/ratings.py: the number sent, else 1
    for a positive verdict and -1 for a negative one), so a label and a rating mean the same thing; None for no
    feedback, a free comment or a number that is not finite."""
    reward = feedback_reward(feedback)
    return reward if reward is not None and math.isfinite(reward) else None


def signals_from_messages(messages: Sequence[Mapping[str, Any]], *, episode_id: str | None = None,
                          final_answer: str | None = None, feedback: Any = None,
                          config: SignalConfig = SignalConfig()) -> Signals:  # fmt: skip
    """The signals of one conversation in OpenAI's layout (tool-call arguments as JSON text or as objects)."""
    turns = [m for m in messages if isinstance(m, Mapping) and m.get("role") not in ("system", "developer")]
    users = [m for m in turns if m.get("role") == "user"]
    assistants = [m for m in turns if m.get("role") == "assistant"]
    first_reply = next((i for i, m in enumerate(turns) if m.get("role") == "assistant"), len(turns))
    later = [text_of(m.get("content"), " ").lower() for m in turns[first_reply:] if m.get("role") == "user"]
    overlaps = _overlaps([text_of(m.get("content"), " ").lower() for m in users], config)
    # Users' turns before the first reply are the opening request (in several messages): not follow-ups.
    answered_overlaps = overlaps[len(users) - len(later):]
    return Signals(
        episode_id=episode_id,
        user_turns=len(users),
        assistant_turns=len(assistants),
        tool_calls=sum(len(m.get("tool_calls") or []) for m in assistants),
        tool_errors=sum(is_tool_error(m.get("content")) for m in turns if m.get("role") == "tool"),
        reasks=sum(o is not None and o >= config.reask_similarity for o in overlaps),
        max_reask_similarity=round(max((o for o in overlaps if o is not None), default=0.0), 6),
        corrections=sum(bool(_CORRECTION.search(t)) for t in later),
        complaints=sum(bool(_COMPLAINT.search(t)) for t in later),
        thanks=sum(bool(_THANKS.search(t)) for t in later),
        agent_gave_up=sum(bool(_GAVE_UP.search(_said(m, final_answer, config.final_tools).lower()))
                          for m in assistants),
        abandoned=not turns or not _answered(turns[-1], final_answer, config.final_tools),
        follow_ups=sum(_is_follow_up(t, o, config) for t, o in zip(later, answered_overlaps)),
        rating=rating_of(feedback),
    )


def episode_signals(episode: Episode | Mapping[str, Any], config: SignalConfig = SignalConfig()) -> Signals:
    """The signals of an episode as the pool stores it: an `Episode` (`PoolRepository.get`, `export`) or an
    exported row (`pool_episodes/<week>/episodes.jsonl`); reads `messages`, `final_answer`, `feedback` and
    `episode_id`, nothing else."""
    if isinstance(episode, Episode):
        return signals_from_messages(episode.messages, episode_id=episode.episode_id, final_answer=episode.final_answer,
                                     feedback=episode.feedback, config=config)
    return signals_from_messages(episode.get("messages") or [], episode_id=episode.get("episode_id"),
                                 final_answer=episode.get("final_answer"), feedback=episode.get("feedback"),
                                 config=config)
