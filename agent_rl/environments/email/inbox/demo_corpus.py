"""A seeded generator of a realistic corporate mailbox set with known facts, for demos and tests.

Eight (or more) Northwind Energy inboxes hold threads, replies with quoted text, forwards,
signatures, newsletters and noise; meetings, amounts, owners, locations and decisions are stated
in prose, some corrected in a later reply. Each `Fact` records its final value and the message ids
that state it, so scenarios can be generated with golden answers (agent_rl.environments.email.scenarios).
"""


from __future__ import annotations

from datetime import datetime, timedelta

from agent_rl.environments.email.inbox.store_interface import AddReport, InboxStore
from agent_rl.environments.email.records import Category
from agent_rl.environments.email.inbox.demo_threads import (
    _KINDS,
    _Builder,
    _date_in_prose,
    _header_date,
    _long_date,
    _meeting,
    _move,
    _move_date,
    _offsite,
)
from agent_rl.environments.email.inbox.demo_world import (  # noqa: F401 - DOMAIN, Fact, public_terms: this module's API
    DOMAIN,
    YEAR,
    DemoCorpus,
    Fact,
    Person,
    _DEPTS,
    _NOISE_PROJECTS,
    public_terms,
)

def _write_thread(b: _Builder, owner: Person, circle: list[Person], category: Category) -> None:
    rng = b.rng
    start = b.when(max_days=300)
    make = rng.choice(_KINDS[category])
    candidates = circle
    if make in (_move, _move_date):
        candidates = [p for p in circle if (owner.email, p.first) not in b.movers] or circle
        if candidates is circle:
            make = _offsite if make is _move else _meeting
    sender = rng.choice(candidates)
    if make in (_move, _move_date):
        b.movers.add((owner.email, sender.first))
    thread = make(b, owner, sender, start)
    author = thread.external or sender
    others = [p for p in circle if p != sender]
    cc = thread.cc + [p for p in rng.sample(others, rng.randint(0, 2)) if p not in thread.cc]
    first = b.add(owner, author, [owner], thread.subject, b.body(author, owner, thread.opening), start, cc)
    last, last_author, when = first, author, start
    sources = [first]
    if rng.random() < 0.4:  # the owner acknowledges; the value is only quoted, not stated anew
        when = when + timedelta(hours=rng.uniform(0.5, 20))
        ack = rng.choice(["Thanks, got it.", "Perfect, thank you.", "Noted - I'll update the tracker.",
                          "Thanks for the heads up. Looping in the team."])  # fmt: skip
        last, last_author = b.reply(owner, last, last_author, owner, [author], ack, when), owner
    value, original = thread.value, None
    if thread.correction and rng.random() < 0.25:
        when = when + timedelta(hours=rng.uniform(2, 60))
        last = b.reply(owner, last, last_author, author, [owner], thread.correction, when)
        last_author = author
        value, original, sources = thread.corrected_value, thread.value, [last]
    elif rng.random() < 0.2:
        when = when + timedelta(hours=rng.uniform(1, 48))
        sources.append(b.forward(owner, first, author, rng.choice(others), when))
    if rng.random() < 0.3:  # a later mention of the same subject that does not state the value
        later = when + timedelta(days=rng.uniform(1, 10))
        nudge = rng.choice([
            "Can you send me the latest deck on the {m} before Friday?",
            "Do we have a list of the open action items on the {m}?",
            "Any news from the team on the {m}? I haven't seen the notes yet.",
        ]).format(m=thread.mention or thread.key)  # fmt: skip
        peer = rng.choice(others)
        b.add(owner, peer, [owner], f"{thread.mention or thread.key} follow-up", b.body(peer, owner, nudge), later)
    latest = max(s.date for s in sources)
    b.facts.append(Fact(
        id=f"fact-{len(b.facts):04d}", inbox=owner.email, category=thread.category, kind=thread.kind,
        key=thread.key, value=value, source_ids=[s.message_id for s in sources], stated_at=latest,
        original_value=original, slots={**thread.slots, "sender_first": author.first},
    ))  # fmt: skip


# --- noise ---------------------------------------------------------------------------------------

_NEWS_ITEMS = [
    "Henry Hub spot settled at ${p:.2f}/MMBtu, {d} from the prior week.",
    "ERCOT reported peak demand of {n:,} MW on {date}.",
    "Congratulations to the {dept} team for {n} days without a recordable injury.",
    "The cafeteria will close early on {date} for maintenance.",
    "Open enrollment for benefits runs through {date}. Questions go to HR.",
    "Our United Way campaign has raised ${n:,} so far - thank you!",
    "PJM capacity prices cleared at ${p:.2f}/MW-day in the latest auction.",
    "Reminder: badge readers on the 9th floor are being replaced on {date}.",
]


def _noise(b: _Builder, owner: Person, circle: list[Person], when: datetime) -> None:
    rng = b.rng
    kind = rng.choices(["newsletter", "digest", "ticket", "social", "chatter", "ooo", "expense", "calendar"],
                       [14, 10, 10, 16, 26, 6, 8, 10])[0]  # fmt: skip
    comms = Person("Northwind", "Communications", f"communications@{DOMAIN}", "", "Northwind Energy", "")
    if kind in ("newsletter", "digest"):
        items = rng.sample(_NEWS_ITEMS, 4)
        lines = [
            "- " + it.format(p=rng.uniform(1.5, 9), d=rng.choice(["up", "down"]), n=rng.randint(40, 90000),
                             dept=rng.choice(_DEPTS), date=_date_in_prose(rng, when + timedelta(days=rng.randint(1, 20))))
            for it in items
        ]  # fmt: skip
        if kind == "newsletter":
            sender, subject = comms, f"Northwind Weekly - {_long_date(when)}"
            text = "NORTHWIND WEEKLY\nNews from around the company\n\n" + "\n".join(lines)
            text += "\n\nYou are receiving this because you are a Northwind Energy employee."
        else:
            sender = Person("Grid", "Insider", "newsletter@gridinsider.com", "", "Grid Insider", "")
            subject = f"Grid Insider Daily: {rng.choice(['Markets', 'Policy', 'Storage', 'Transmission'])} roundup"
            text = "GRID INSIDER DAILY\n\n" + "\n".join(lines) + "\n\nUnsubscribe | Manage preferences"
        b.add(owner, sender, [owner], subject, text, when, noise=True)
    elif kind == "ticket":
        desk = Person("IT", "Service Desk", f"servicedesk@{DOMAIN}", "", "Northwind Energy", "")
        n = rng.randint(100000, 999999)
        state = rng.choice(["has been updated", "has been resolved", "is awaiting your response"])
        issue = rng.choice(["VPN disconnects", "Outlook search not working", "Monitor request", "Password reset",
                            "Printer on 12 jammed"])  # fmt: skip
        b.add(owner, desk, [owner], f"[ServiceDesk] Ticket INC{n} {state}",
              f"Ticket INC{n} ({issue}) {state}.\n\nView it in the portal. Please do not reply to this message.", when,
              noise=True)  # fmt: skip
    elif kind == "expense":
        bot = Person("Concur", "Expense", f"expense@{DOMAIN}", "", "Northwind Energy", "")
        n = rng.randint(10000, 99999)
        b.add(owner, bot, [owner], f"Expense report ER-{n} submitted",
              f"Your expense report ER-{n} ({rng.choice(['Travel', 'Meals', 'Training'])}) for "
              f"${rng.uniform(20, 2500):,.2f} was routed to your manager.", when, noise=True)  # fmt: skip
    elif kind == "calendar":
        peer = rng.choice(circle)
        title = rng.choice(["Weekly staff sync", "1:1", "Ops standup", "Monthly all-hands", "Lunch and learn"])
        b.add(owner, peer, [owner], f"Accepted: {title} @ {_header_date(when)}",
              f"{peer.name} has accepted this invitation.", when, noise=True)
    elif kind == "ooo":
        peer = rng.choice(circle)
        back = when + timedelta(days=rng.randint(2, 10))
        b.add(owner, peer, [owner], "Automatic reply: Out of office",
              f"I am out of the office with limited access to email and will return on {_date_in_prose(rng, back)}. "
              f"For urgent matters please contact {rng.choice(circle).name}.", when, noise=True)  # fmt: skip
    else:
        peer = rng.choice(circle)
        if kind == "social":
            subject, text = rng.choice([
                ("lunch?", "Anyone up for lunch at the taco place on Main today? Thinking 11:45."),
                ("cake!", "There's birthday cake for Hannah in the 12th floor break room."),
                ("quick question", "Does anyone have a spare HDMI adapter? Mine walked off."),
                ("parking", "Reminder that the parking garage is closed this weekend for restriping."),
                ("Happy Friday", "Happy Friday! Great work this week everyone."),
                ("coffee", "Coffee run in ten minutes - want anything?"),
            ])  # fmt: skip
        else:
            project = rng.choice(_NOISE_PROJECTS)
            text = rng.choice([
                f"Can you take a look at {project} when you get a chance? I left comments on slides 4-7.",
                f"I pushed the latest numbers into {project}. Let me know if the totals look off to you.",
                f"Are we still doing the weekly check-in on {project}? I have a conflict Thursday.",
                f"Sending over my notes on {project}. Nothing urgent.",
            ])  # fmt: skip
            subject = rng.choice([project.replace("the ", "").title(), f"RE: {project}", "notes", "follow up"])
        first = b.add(owner, peer, [owner], subject, b.body(peer, owner, text), when, noise=True)
        if first and rng.random() < 0.35:
            reply = rng.choice(["Sounds good.", "Sure - I'll take a look this afternoon.", "Count me in.",
                                "Thanks, will do."])  # fmt: skip
            b.reply(owner, first, peer, owner, [peer], reply, when + timedelta(hours=rng.uniform(0.2, 6)))


# --- public API -----------------------------------------------------------------------------------


def generate_demo_corpus(seed: int = 0, n_inboxes: int = 8, n_emails: int = 4000) -> DemoCorpus:
    """The demo mailboxes and their facts; pure and deterministic for a seed."""
    b = _Builder(seed, n_inboxes, n_emails)
    per_inbox = [n_emails // n_inboxes + (i < n_emails % n_inboxes) for i in range(n_inboxes)]
    facts_per_category = max(1, min(10, min(per_inbox) // 50))
    for owner, target in zip(b.owners, per_inbox):
        start = len(b.emails)
        colleagues = [p for p in b.people if p != owner]
        circle = b.rng.sample(colleagues, 12)
        plan = [c for c in Category if c != Category.UNANSWERABLE] * facts_per_category
        b.rng.shuffle(plan)
        for category in plan:
            _write_thread(b, owner, circle, category)
        facts_end = len(b.emails)
        while len(b.emails) - start < target:
            _noise(b, owner, circle, b.when())
        del b.emails[max(start + target, facts_end) :]  # a last noise reply may overshoot the target
    emails = sorted(b.emails, key=lambda e: (e.inbox, e.date, e.message_id))
    return DemoCorpus(emails=emails, facts=b.facts)


def build_demo_corpus(store: InboxStore, seed: int = 0, **kwargs: int) -> DemoCorpus:
    """Generate the demo corpus and write its emails into `store`."""
    corpus = generate_demo_corpus(seed=seed, **kwargs)
    report: AddReport = store.add_emails(corpus.emails)
    if report.inserted + report.duplicates != len(corpus.emails):
        raise RuntimeError(f"inbox store took {report.inserted}+{report.duplicates} of {len(corpus.emails)} emails")
    return corpus
