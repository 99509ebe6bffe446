"""Question templates for the demo corpus's facts, worded like the ART-E questions (casual, specific).

Each fact kind has several templates with a realism score; `question_for` picks one.
"""

from __future__ import annotations

import random

from agent_rl.environments.email.inbox.demo_corpus import Fact

# kind -> [(template, realism)]; templates use the fact's slots ({topic}, {sender_first}, ...).
TEMPLATES: dict[str, list[tuple[str, float]]] = {
    "meeting": [
        ("When is the {topic} {meeting} scheduled?", 0.9),
        ("What day and time is the {meeting} for the {topic}?", 0.85),
        ("When did {sender_first} set up the {topic} {meeting} for?", 0.8),
        ("When am I supposed to be at the {topic} {meeting}?", 0.8),
    ],
    "deadline": [
        ("When is the {deliverable} for the {topic} due?", 0.9),
        ("What's the deadline for the {topic} {deliverable}?", 0.9),
        ("By when does the {topic} {deliverable} need to be submitted?", 0.85),
    ],
    "move_date": [
        ("When is {mover_first}'s move to {city} targeted for?", 0.9),
        ("What's the target date for {mover_first}'s relocation to {city}?", 0.85),
        ("When is {mover_first} moving to the {city} office?", 0.85),
    ],
    "budget": [
        ("What's the approved budget for the {topic}?", 0.9),
        ("How much budget did we get for the {topic}?", 0.85),
        ("What budget did {sender_first} confirm for the {topic}?", 0.8),
    ],
    "invoice": [
        ("How much was the {vendor} invoice for the {topic} work?", 0.9),
        ("What's the total due on invoice {invoice_no}?", 0.85),
        ("How much do we owe {vendor} for the {topic}?", 0.8),
    ],
    "owner": [
        ("Who is responsible for the {topic}?", 0.9),
        ("Who's the lead on the {topic} now?", 0.85),
        ("Who did {sender_first} put in charge of the {topic}?", 0.85),
        ("Who should I go to with questions about the {topic}?", 0.8),
    ],
    "offsite": [
        ("Where is the {event} being held?", 0.9),
        ("Which city is the {event} in?", 0.85),
        ("Where are we going for the {event}?", 0.8),
    ],
    "move": [
        ("Where is {mover_first}'s {dept} team relocating to?", 0.85),
        ("Which office is {mover_first}'s team moving to?", 0.85),
        ("Where is the {dept} group that {mover_first} manages moving?", 0.75),
    ],
    "decision": [
        ("What's the status of the {request} for the {topic}?", 0.9),
        ("What happened with the {topic} {request}?", 0.85),
        ("Did the {request} for the {topic} get approved?", 0.8),
        ("What did the committee decide on the {topic} {request}?", 0.8),
    ],
}

# Facts whose key names a person (by first name) make poor "not in this inbox" questions: the same
# first name may well appear in another inbox for unrelated reasons.
UNANSWERABLE_KINDS = ("meeting", "deadline", "budget", "invoice", "owner", "offsite", "decision")


def question_for(fact: Fact, rng: random.Random) -> tuple[str, float]:
    """A question whose answer is the fact's value, and the template's realism score."""
    try:
        options = TEMPLATES[fact.kind]
    except KeyError:
        raise ValueError(f"fact {fact.id}: no question templates for kind {fact.kind!r}") from None
    template, realism = rng.choice(options)
    try:
        return template.format(**fact.slots), realism
    except KeyError as exc:
        raise ValueError(f"fact {fact.id}: template {template!r} needs slot {exc.args[0]!r}") from None
