"""The demo corpus's threads: how each kind of fact (a meeting, a deadline, a moved date, a budget, an invoice, an
owner, an offsite, a move, a decision) is written as a thread of emails in varied prose, corrections included."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from agent_rl.environments.email.records import Category, Email
from agent_rl.environments.email.inbox.demo_world import (
    DOMAIN,
    Fact,
    Person,
    YEAR,
    _ASSETS,
    _CITIES,
    _DECISIONS,
    _DELIVERABLES,
    _DEPTS,
    _EVENT_TYPES,
    _EXTERNAL,
    _INTERNAL,
    _MEETINGS,
    _MONTHS,
    _PREFIXES,
    _REQUESTS,
    _ROOMS,
    _TIMES,
    _WEEKDAYS,
)

def _long_date(d: datetime) -> str:
    return f"{_MONTHS[d.month - 1]} {d.day}, {d.year}"


def _clock(hour: int, minute: int, style: int = 0) -> str:
    h12 = hour % 12 or 12
    suffix = "AM" if hour < 12 else "PM"
    if style == 1:
        return f"{h12}:{minute:02d}{suffix.lower()}"
    if style == 2 and minute == 0:
        return f"{h12} {suffix.lower()}"
    return f"{h12}:{minute:02d} {suffix}"


def _header_date(d: datetime) -> str:
    return f"{_WEEKDAYS[d.weekday()][:3]}, {_MONTHS[d.month - 1][:3]} {d.day}, {d.year} at {_clock(d.hour, d.minute)}"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _date_in_prose(rng: random.Random, d: datetime) -> str:
    """The same date as people write it: with or without the year, weekday, ordinal or slashes."""
    return rng.choice([
        f"{_WEEKDAYS[d.weekday()]}, {_MONTHS[d.month - 1]} {d.day}",
        f"{_MONTHS[d.month - 1]} {d.day}, {d.year}",
        f"{_WEEKDAYS[d.weekday()]} {d.month}/{d.day}",
        f"{_MONTHS[d.month - 1]} {_ordinal(d.day)}",
        f"{_WEEKDAYS[d.weekday()]}, {d.day} {_MONTHS[d.month - 1]} {d.year}",
    ])  # fmt: skip


def _money(value: float) -> str:
    return f"${value:,.2f}" if value != int(value) or value < 100_000 else f"${int(value):,}"


def _money_in_prose(rng: random.Random, value: float) -> str:
    if value >= 1_000_000 and value % 100_000 == 0:
        m = f"{value / 1e6:g}"
        return rng.choice([f"${m} million", f"${m}M", f"{m}M USD", f"${int(value):,}"])
    if value >= 100_000 and value % 1000 == 0:
        return rng.choice([f"${int(value) // 1000}K", f"${int(value):,}", f"${int(value) // 1000}k"])
    return rng.choice([f"${value:,.2f}", f"USD {value:,.2f}"])


# --- the builder -------------------------------------------------------------------------------


class _Builder:
    def __init__(self, seed: int, n_inboxes: int, n_emails: int) -> None:
        if n_inboxes < 1 or n_inboxes > len(_INTERNAL) // 2:
            raise ValueError(f"n_inboxes={n_inboxes}: must be between 1 and {len(_INTERNAL) // 2}")
        if n_emails < n_inboxes * 20:
            raise ValueError(f"n_emails={n_emails}: need at least 20 per inbox ({n_inboxes * 20})")
        self.rng = random.Random(seed)
        self.seed = seed
        self.n_emails = n_emails
        rng = self.rng
        self.people = [
            Person(f, l, f"{f}.{l}".lower().replace("'", "") + f"@{DOMAIN}", t, "Northwind Energy",
                   f"(713) 555-{rng.randint(100, 9999):04d}")
            for f, l, t in _INTERNAL
        ]  # fmt: skip
        self.vendors = [
            Person(f, l, f"{f[0]}{l}".lower() + f"@{dom}", t, co, f"({rng.randint(201, 989)}) 555-{rng.randint(100, 9999):04d}")
            for f, l, t, co, dom in _EXTERNAL
        ]  # fmt: skip
        self.owners = self.people[:n_inboxes]
        self.emails: list[Email] = []
        self.facts: list[Fact] = []
        self._seq = 0
        # Names are popped from the end: plain ones first, numbered variants only for very large corpora.
        self._topics = self._shuffled([f"{p} {a} phase 2" for p in _PREFIXES for a in _ASSETS])
        self._topics += self._shuffled([f"{p} {a}" for p in _PREFIXES for a in _ASSETS])
        self._events = self._shuffled([f"Q{q} {d} {e}" for q in (1, 2, 3, 4) for d in _DEPTS for e in _EVENT_TYPES])
        self._events += self._shuffled([f"{d} {e}" for d in _DEPTS for e in _EVENT_TYPES])
        self.movers: set[tuple[str, str]] = set()  # (inbox, first name): one move per person per inbox
        self._contents: set[tuple[str, str, str, str]] = set()  # stores drop same inbox+sender+subject+body

    def _shuffled(self, items: list[str]) -> list[str]:
        self.rng.shuffle(items)
        return items

    # unique keys across the corpus, so a fact's key never shows up in another inbox by accident
    def topic(self) -> str:
        if not self._topics:
            raise ValueError("demo corpus ran out of distinct project names; ask for fewer emails per inbox")
        return self._topics.pop()

    def event(self) -> str:
        if not self._events:
            raise ValueError("demo corpus ran out of distinct event names; ask for fewer emails per inbox")
        return self._events.pop()

    def when(self, start: datetime | None = None, min_days: float = 0, max_days: float = 330) -> datetime:
        base = start or datetime(YEAR, 1, 8, tzinfo=timezone.utc)
        d = base + timedelta(days=self.rng.uniform(min_days, max_days))
        return d.replace(hour=self.rng.randint(7, 18), minute=self.rng.randint(0, 59), second=self.rng.randint(0, 59))

    def add(self, inbox: Person, sender: Person, to: list[Person], subject: str, body: str, date: datetime,
            cc: list[Person] = (), noise: bool = False) -> Email | None:  # fmt: skip
        """Append one email; a noise email that repeats an earlier one word for word is not added (None)."""
        content = (inbox.email, sender.email, subject, body)
        if content in self._contents:
            if noise:
                return None
            raise AssertionError(f"demo corpus wrote the same email twice: {subject!r}")
        self._contents.add(content)
        self._seq += 1
        # No person's name in the id: ids pass through anonymization unchanged (citations must still match).
        message_id = f"<{self._seq:06d}.{self.rng.getrandbits(40):010x}@mail.{DOMAIN}>"
        date = date.replace(microsecond=0)
        email = Email(
            message_id=message_id,
            inbox=inbox.email,
            date=date,
            subject=subject,
            sender=sender.email,
            to=tuple(p.email for p in to),
            cc=tuple(p.email for p in cc),
            body=body,
            folder="sent_items" if sender == inbox else "inbox",
        )
        self.emails.append(email)
        return email

    def signature(self, p: Person) -> str:
        if self.rng.random() < 0.25:
            return f"Thanks,\n{p.first}\n\nSent from my iPhone"
        closing = self.rng.choice(["Thanks,", "Best,", "Regards,", "Cheers,", "Thank you,"])
        return f"{closing}\n{p.first}\n\n--\n{p.name}\n{p.title} | {p.company}\n{p.phone}"

    def body(self, sender: Person, recipient: Person, text: str) -> str:
        greeting = self.rng.choice(["Hi {f},", "{f},", "Hello {f},", "Hey {f},", "Good morning {f},"])
        return f"{greeting.format(f=recipient.first)}\n\n{text}\n\n{self.signature(sender)}"

    @staticmethod
    def quoted(prev: Email, author: Person) -> str:
        lines = "\n".join("> " + line if line else ">" for line in prev.body.splitlines())
        return f"\n\nOn {_header_date(prev.date)}, {author.name} <{author.email}> wrote:\n{lines}"

    def reply(self, inbox: Person, prev: Email, author: Person, sender: Person, to: list[Person], text: str,
              date: datetime) -> Email:  # fmt: skip
        subject = prev.subject if prev.subject.startswith("Re: ") else f"Re: {prev.subject}"
        return self.add(inbox, sender, to, subject, self.body(sender, to[0], text) + self.quoted(prev, author), date)

    def forward(self, inbox: Person, prev: Email, author: Person, to: Person, date: datetime) -> Email:
        note = self.rng.choice(["FYI, see below.", f"{to.first} - looping you in on this.", "Passing this along.",
                                "For your records."])  # fmt: skip
        recipients = ", ".join(prev.to)
        text = (
            f"{note}\n\n{inbox.first}\n\n---------- Forwarded message ----------\n"
            f"From: {author.name} <{author.email}>\nDate: {_header_date(prev.date)}\n"
            f"Subject: {prev.subject}\nTo: {recipients}\n\n{prev.body}"
        )
        return self.add(inbox, inbox, [to], f"Fwd: {prev.subject}", text, date)


# --- fact threads --------------------------------------------------------------------------------

@dataclass
class _Thread:
    """What a fact kind writes: the opening statement, and how a correction and an ack read."""

    category: Category
    kind: str
    key: str
    subject: str
    value: str
    opening: str
    corrected_value: str | None = None
    correction: str | None = None
    slots: dict[str, str] = field(default_factory=dict)
    external: Person | None = None
    mention: str = ""  # how a later email refers to the subject without stating the value
    cc: list[Person] = field(default_factory=list)


def _weekday_after(b: _Builder, start: datetime, lo: int, hi: int) -> datetime:
    d = start + timedelta(days=b.rng.randint(lo, hi))
    while d.weekday() >= 5:
        d += timedelta(days=1)
    return d


def _meeting(b: _Builder, owner: Person, sender: Person, start: datetime) -> _Thread:
    rng = b.rng
    topic, meeting = b.topic(), rng.choice(_MEETINGS)
    day, (h, m) = _weekday_after(b, start, 5, 25), rng.choice(_TIMES)
    value = f"{_long_date(day)} at {_clock(h, m)}"
    said = f"{_date_in_prose(rng, day)} at {_clock(h, m, rng.randint(0, 2))}"
    room = rng.choice(_ROOMS)
    opening = rng.choice([
        f"I've booked the {topic} {meeting} for {said} in {room}. Please bring the latest schedule and any open risks.",
        f"Let's hold the {meeting} for the {topic} on {said}. I grabbed {room}; agenda to follow.",
        f"Quick heads up: the {topic} {meeting} is set for {said} ({room}). Diane from Halvorsen may dial in.",
    ])  # fmt: skip
    new_day, (nh, nm) = _weekday_after(b, day, 1, 6), rng.choice(_TIMES)
    new_value = f"{_long_date(new_day)} at {_clock(nh, nm)}"
    correction = rng.choice([
        f"Correction: the {topic} {meeting} moved to {_date_in_prose(rng, new_day)} at {_clock(nh, nm)}, same room. Sorry for the churn.",
        f"Scratch that - we had a conflict. The {meeting} for the {topic} is now {_date_in_prose(rng, new_day)} at {_clock(nh, nm)}.",
    ])  # fmt: skip
    return _Thread(Category.DATE, "meeting", topic, f"{topic} {meeting}", value, opening, new_value, correction,
                   {"topic": topic, "meeting": meeting})  # fmt: skip


def _deadline(b: _Builder, owner: Person, sender: Person, start: datetime) -> _Thread:
    rng = b.rng
    topic, deliverable = b.topic(), rng.choice(_DELIVERABLES)
    day = _weekday_after(b, start, 7, 40)
    opening = rng.choice([
        f"Reminder that the {deliverable} for the {topic} is due {_date_in_prose(rng, day)}. Let me know if anything is blocking.",
        f"Per the call with the state commission, we need the {topic} {deliverable} submitted by {_date_in_prose(rng, day)}.",
        f"The {deliverable} for {topic} has a hard deadline of {_date_in_prose(rng, day)}. Legal wants a draft a week before.",
    ])  # fmt: skip
    new_day = _weekday_after(b, day, 3, 14)
    correction = (f"Correction: the commission gave us an extension. The {topic} {deliverable} is now due "
                  f"{_date_in_prose(rng, new_day)}.")  # fmt: skip
    return _Thread(Category.DATE, "deadline", topic, f"{topic} {deliverable} deadline", _long_date(day), opening,
                   _long_date(new_day), correction, {"topic": topic, "deliverable": deliverable})  # fmt: skip


def _move_date(b: _Builder, owner: Person, sender: Person, start: datetime) -> _Thread:
    rng = b.rng
    city = rng.choice(_CITIES)
    day = _weekday_after(b, start, 20, 90)
    opening = rng.choice([
        f"Good news: my move to {city} is approved. HR has it targeted for {_date_in_prose(rng, day)}, so I'll start handing off my accounts.",
        f"Wanted you to hear it from me first - I'm relocating to the {city} office. Target date is {_date_in_prose(rng, day)}.",
    ])  # fmt: skip
    new_day = _weekday_after(b, day, 7, 30)
    correction = f"Small correction on my {city} move: the movers pushed us, so the target is now {_date_in_prose(rng, new_day)}."
    return _Thread(Category.DATE, "move_date", f"{sender.first}'s move to {city}", f"Moving to {city}",
                   _long_date(day), opening, _long_date(new_day), correction,
                   {"mover_first": sender.first, "city": city}, mention=f"{city} move")  # fmt: skip


def _budget(b: _Builder, owner: Person, sender: Person, start: datetime) -> _Thread:
    rng = b.rng
    topic = b.topic()
    value = rng.choice([rng.randint(3, 60) * 100_000, rng.randint(150, 990) * 1000])
    opening = rng.choice([
        f"The steering committee signed off on a budget of {_money_in_prose(rng, value)} for the {topic}. Contingency is included.",
        f"Final number for the {topic}: {_money_in_prose(rng, value)} approved for this year. Please plan against that.",
        f"Gregory confirmed the {topic} budget at {_money_in_prose(rng, value)}. Anything above that needs a new request.",
    ])  # fmt: skip
    new_value = value + rng.choice([-1, 1]) * rng.randint(1, 5) * (100_000 if value >= 1_000_000 else 10_000)
    correction = (f"Correction: I fat-fingered the number. The {topic} budget is {_money_in_prose(rng, new_value)}, "
                  f"not {_money_in_prose(rng, value)}.")  # fmt: skip
    return _Thread(Category.AMOUNT, "budget", topic, f"{topic} budget", _money(value), opening, _money(new_value),
                   correction, {"topic": topic})  # fmt: skip


def _invoice(b: _Builder, owner: Person, sender: Person, start: datetime) -> _Thread:
    rng = b.rng
    topic, vendor = b.topic(), rng.choice(b.vendors)
    number = f"INV-{rng.randint(10000, 99999)}"
    value = round(rng.randint(1500, 95000) + rng.choice([0, 0.5, 0.25, 0.4, 0.75]), 2)
    opening = (
        f"Attached is invoice {number} for the {topic} work completed last month. The total due is "
        f"{_money_in_prose(rng, value)}, payable net 30. Let me know if you need a W-9."
    )
    new_value = round(value * rng.choice([0.9, 0.95, 1.05]), 2)
    correction = (f"Apologies - invoice {number} had a billing error. The corrected total for the {topic} work is "
                  f"{_money_in_prose(rng, new_value)}. A revised PDF is attached.")  # fmt: skip
    return _Thread(Category.AMOUNT, "invoice", topic, f"Invoice {number} - {topic}", _money(value), opening,
                   _money(new_value), correction, {"topic": topic, "vendor": vendor.company, "invoice_no": number},
                   external=vendor, mention=f"{topic} invoice")  # fmt: skip


def _owner(b: _Builder, owner: Person, sender: Person, start: datetime) -> _Thread:
    rng = b.rng
    topic = b.topic()
    lead, other = rng.sample([p for p in b.people if p not in (owner, sender)], 2)
    opening = rng.choice([
        f"Effective Monday, {lead.name} will own the {topic} end to end. {lead.first} has the history from the feasibility study.",
        f"Please welcome {lead.name} as the new lead for the {topic}. Route questions on it to {lead.first} going forward.",
        f"After talking with Leonard, we're putting {lead.name} in charge of the {topic}. I'll stay on as sponsor.",
    ])  # fmt: skip
    correction = (f"Quick correction: {other.name} will lead the {topic}, not {lead.first}; {lead.first} "
                  f"is backing up while finishing another project.")  # fmt: skip
    return _Thread(Category.PERSON, "owner", topic, f"{topic} ownership", lead.name, opening, other.name,
                   correction, {"topic": topic}, cc=[lead])  # fmt: skip


def _offsite(b: _Builder, owner: Person, sender: Person, start: datetime) -> _Thread:
    rng = b.rng
    event = b.event()
    city, new_city = rng.sample(_CITIES, 2)
    day = _weekday_after(b, start, 20, 60)
    opening = rng.choice([
        f"Save the date: the {event} will be in {city} the week of {_date_in_prose(rng, day)}. Jeffrey at Pinecrest is handling the venue.",
        f"We've picked {city} for the {event}. Hotel block details are coming from Redline Travel.",
        f"Venue update for the {event}: we're going with {city}. Please hold {_date_in_prose(rng, day)} through Thursday.",
    ])  # fmt: skip
    correction = f"Correction: the {event} moved to {new_city}. The hotel in {city} couldn't hold our block."
    return _Thread(Category.LOCATION, "offsite", event, f"{event} logistics", city, opening, new_city, correction,
                   {"event": event})  # fmt: skip


def _move(b: _Builder, owner: Person, sender: Person, start: datetime) -> _Thread:
    rng = b.rng
    dept = rng.choice(_DEPTS)
    city, new_city = rng.sample(_CITIES, 2)
    opening = rng.choice([
        f"Heads up that the {dept} group I manage is moving to the {city} office this quarter. Facilities is sorting out desks.",
        f"It's official: my {dept} team relocates to {city} once the lease is signed. Denise has the floor plans.",
    ])  # fmt: skip
    correction = f"Correction: the lease fell through, so my {dept} team is going to {new_city} instead of {city}."
    return _Thread(Category.LOCATION, "move", f"{sender.first}'s {dept} team", f"{dept} team relocation", city,
                   opening, new_city, correction, {"mover_first": sender.first, "dept": dept},
                   mention=f"{dept} relocation")  # fmt: skip


def _decision(b: _Builder, owner: Person, sender: Person, start: datetime) -> _Thread:
    rng = b.rng
    topic, request = b.topic(), rng.choice(_REQUESTS)
    value, new_value = rng.sample(_DECISIONS, 2)
    phrase = {
        "Approved": ["has been approved", "was approved by the committee this morning"],
        "Rejected": ["was rejected", "has been rejected by the committee"],
        "On hold": ["is on hold until next quarter", "has been put on hold pending the rate case"],
        "Cancelled": ["has been cancelled", "was cancelled outright"],
    }
    opening = f"Update on the {request} for the {topic}: it {rng.choice(phrase[value])}. I'll send the minutes."
    correction = (f"Update: after the board call, the {topic} {request} {rng.choice(phrase[new_value])}. "
                  f"Please disregard my earlier note.")  # fmt: skip
    return _Thread(Category.STATUS, "decision", f"{topic} {request}", f"{topic} {request}", value, opening,
                   new_value, correction, {"topic": topic, "request": request})  # fmt: skip


_KINDS: dict[Category, list[Callable[[_Builder, Person, Person, datetime], _Thread]]] = {
    Category.DATE: [_meeting, _meeting, _deadline, _move_date],
    Category.AMOUNT: [_budget, _budget, _invoice],
    Category.PERSON: [_owner],
    Category.LOCATION: [_offsite, _offsite, _move],
    Category.STATUS: [_decision],
}
