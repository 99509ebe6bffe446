"""The demo corpus's world: Northwind Energy's domain and year, its people (internal and external), projects,
departments, places and the vocabulary its threads draw from, and the records of what the corpus states
(`Fact`, `DemoCorpus`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from agent_rl.environments.email.records import Category, Email

DOMAIN = "northwind-energy.com"
YEAR = 2024


class Fact(BaseModel):
    """One fact stated in an inbox: its final value and the messages that state that value."""

    model_config = ConfigDict(frozen=True)

    id: str
    inbox: str
    category: Category
    kind: str = Field(
        description="template family: meeting, deadline, move_date, budget, invoice, owner, move, offsite, decision"
    )
    key: str = Field(description="the distinctive phrase the fact is about (a project, event, request)")
    value: str = Field(description="the final value, the golden answer")
    source_ids: list[str]
    stated_at: datetime = Field(description="date of the latest source email")
    original_value: str | None = Field(default=None, description="the value first stated, when later corrected")
    slots: dict[str, str] = Field(default_factory=dict, description="words the question templates may use")

    @property
    def corrected(self) -> bool:
        return self.original_value is not None


@dataclass
class DemoCorpus:
    emails: list[Email]
    facts: list[Fact]
    _by_id: dict[str, Email] = field(default_factory=dict, repr=False)

    @property
    def inboxes(self) -> list[str]:
        return sorted({e.inbox for e in self.emails})

    def email(self, message_id: str) -> Email:
        if not self._by_id:
            self._by_id = {e.message_id: e for e in self.emails}
        return self._by_id[message_id]

    def emails_of(self, inbox: str) -> list[Email]:
        return [e for e in self.emails if e.inbox == inbox]


@dataclass(frozen=True)
class Person:
    first: str
    last: str
    email: str
    title: str
    company: str
    phone: str

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


# --- the cast -----------------------------------------------------------------------------------

_INTERNAL = [
    ("Sherry", "Ortiz", "VP, Project Development"), ("Marcus", "Chen", "Director, Grid Analytics"),
    ("Priya", "Raman", "Senior Counsel"), ("Daniel", "Whitaker", "Controller"),
    ("Elena", "Kowalski", "Head of Procurement"), ("Trevor", "Hughes", "Field Operations Manager"),
    ("Angela", "Moreno", "Director, Regulatory Affairs"), ("Kevin", "O'Brien", "IT Program Manager"),
    ("Rachel", "Goldberg", "Treasury Analyst"), ("Samuel", "Okafor", "Project Engineer"),
    ("Laura", "Fitzgerald", "HR Business Partner"), ("Victor", "Alvarez", "Construction Manager"),
    ("Nina", "Petrova", "Data Scientist"), ("Gregory", "Lambert", "Chief Financial Officer"),
    ("Hannah", "Schultz", "Executive Assistant"), ("Omar", "Haddad", "Senior Trader"),
    ("Bridget", "Sullivan", "Communications Manager"), ("Carlos", "Mendes", "Safety Coordinator"),
    ("Denise", "Walker", "Facilities Manager"), ("Franklin", "Boyd", "Asset Manager"),
    ("Grace", "Nakamura", "Environmental Specialist"), ("Isaac", "Feldman", "Risk Manager"),
    ("Julia", "Brennan", "Senior Accountant"), ("Leonard", "Price", "SVP, Operations"),
    ("Monica", "Reyes", "Contracts Administrator"), ("Patrick", "Doyle", "Substation Engineer"),
    ("Quentin", "Harris", "Business Analyst"), ("Sofia", "Lindqvist", "Interconnection Manager"),
    ("Tyrone", "Jackson", "Scheduling Lead"), ("Wendy", "Castillo", "Payroll Specialist"),
    ("Yusuf", "Demir", "SCADA Engineer"), ("Zachary", "Cole", "Project Coordinator"),
    ("Megan", "Foster", "Land Agent"), ("Ethan", "Caldwell", "Planning Engineer"),
    ("Irene", "Novak", "Compliance Officer"), ("Howard", "Bishop", "General Counsel"),
    ("Natalie", "Brooks", "Engineering Manager"), ("Raymond", "Kim", "Senior Buyer"),
    ("Olivia", "Grant", "Financial Analyst"), ("Harold", "Simmons", "Plant Manager"),
]  # fmt: skip
_EXTERNAL = [
    ("Diane", "Mercer", "Project Manager", "Halvorsen Engineering", "halvorsen-eng.com"),
    ("Raj", "Malhotra", "Account Director", "Cobalt Grid Services", "cobaltgrid.com"),
    ("Tom", "Gallagher", "Operations Lead", "Summit Field Services", "summitfield.com"),
    ("Lisa", "Tran", "Partner", "Meridian Legal LLP", "meridianlegal.com"),
    ("Brian", "Kessler", "Sales Manager", "Apex Office Interiors", "apexinteriors.com"),
    ("Carmen", "Ruiz", "Principal", "Bluewater Consulting", "bluewaterconsult.com"),
    ("Jeffrey", "Stone", "Event Coordinator", "Pinecrest Events", "pinecrestevents.com"),
    ("Amy", "Whitfield", "Travel Consultant", "Redline Travel", "redlinetravel.com"),
    ("Gavin", "Porter", "Billing Specialist", "Trident Electrical Supply", "tridentsupply.com"),
    ("Helen", "Ashworth", "Senior Associate", "Keystone Environmental", "keystone-env.com"),
]

_PREFIXES = [
    "Harbor Point", "Cedar Ridge", "Falcon Mesa", "Blue Mesa", "Ironwood", "Sable Creek", "Granite Falls",
    "Lakeshore", "Red Butte", "Silver Lake", "Pine Hollow", "Copper Basin", "Eagle Pass", "Willow Bend",
    "Stony Brook", "Maple Grove", "North Fork", "Crystal Springs", "Aspen Ridge", "Bear Creek", "Dry Gulch",
    "Elk Meadow", "Fox Run", "Gold Hill", "Hawk Ridge", "Juniper Flats", "Kettle River", "Lone Pine",
    "Mill Creek", "Oak Knoll", "Prairie View", "Quarry Lake", "Rock Springs", "Salt Flats", "Timber Ridge",
    "Upper Valley", "Verde Canyon", "West Branch", "Yellow Pine", "Sandy Hook",
]  # fmt: skip
_ASSETS = [
    "solar farm", "substation upgrade", "pipeline retrofit", "wind repowering", "battery storage pilot",
    "SCADA migration", "meter replacement", "transmission line", "compressor overhaul", "microgrid",
    "gas storage expansion", "switchyard rebuild",
]  # fmt: skip
_DEPTS = ["Grid Analytics", "Field Operations", "Regulatory Affairs", "Procurement", "Treasury", "Project Development",
          "Land Services", "Trading", "Engineering", "Safety", "Asset Management", "Interconnection", "Compliance",
          "Environmental", "Facilities"]  # fmt: skip


def public_terms() -> tuple[str, ...]:
    """The demo world's names that belong to no person: sites, departments, cities and outside firms. They are
    task answers ("Where is the Treasury offsite?" "Reno"), so anonymization must leave them; none of them is a
    name of the cast (tested)."""
    return tuple(dict.fromkeys([*_PREFIXES, *_DEPTS, *_CITIES, *(firm for *_, firm, _ in _EXTERNAL)]))


def public_terms_of(inboxes: Iterable[str]) -> tuple[str, ...]:
    """The demo world's public terms when every inbox is one of its mailboxes; none for a real corpus (whose own
    go in the curation profile's `public_terms`)."""
    inboxes = list(inboxes)
    if inboxes and all(address.lower().endswith("@" + DOMAIN) for address in inboxes):
        return public_terms()
    return ()


_EVENT_TYPES = ["offsite", "planning summit", "team retreat", "strategy workshop", "leadership offsite"]
_CITIES = ["Denver", "Portland", "Austin", "Phoenix", "Boise", "Salt Lake City", "Tulsa", "Omaha", "Santa Fe",
           "Sacramento", "Minneapolis", "Kansas City", "Albuquerque", "Spokane", "Reno", "Charlotte", "Nashville",
           "Pittsburgh", "Chicago", "San Antonio"]  # fmt: skip
_MEETINGS = ["design review", "kickoff meeting", "budget review", "status meeting", "vendor walkthrough", "site visit"]
_DELIVERABLES = ["permit filing", "interconnection application", "final design package", "environmental report",
                 "cost estimate", "board memo"]  # fmt: skip
_REQUESTS = ["change order", "capex request", "scope change", "contract extension", "headcount request"]
_DECISIONS = ["Approved", "Rejected", "On hold", "Cancelled"]
_TIMES = [(8, 30), (9, 0), (9, 30), (10, 0), (11, 0), (13, 0), (13, 30), (14, 0), (14, 30), (15, 0), (16, 0)]
_ROOMS = ["the Pecos conference room", "the 12th floor boardroom", "Room Cypress", "the Brazos room", "Teams"]
_WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]  # fmt: skip
_NOISE_PROJECTS = ["Project Osprey", "the Tidewater deck", "Project Kestrel", "the Q-close checklist",
                   "the Lumen dashboard", "Project Heron", "the vendor scorecard", "the Juno data lake"]  # fmt: skip


# --- formatting --------------------------------------------------------------------------------
