"""The store database the support agent works on: customers, products and orders, generated from a seed.

Everything is made up from small word lists, but shaped like real personal data (names, emails, phones, street
addresses): that is what the pseudonymizer must find and replace. A database is plain dataclasses that round-trip
through JSON; `copy()` gives an episode its own orders to write on, and `diff` says what an episode changed.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import date, timedelta
from string import ascii_lowercase
from typing import Any

TODAY = date(2024, 6, 15)  # the database's fixed "today": return windows are counted from it
STATUSES = ("pending", "processed", "shipped", "delivered", "cancelled")
RETURN_REQUESTED = "return requested"
# Order fields an episode may change; `diff` compares these and nothing else (a cancel reason is not judged).
WRITABLE_FIELDS = ("status", "shipping_address", "returned_items")

FIRST_NAMES = (
    "Aiden Amara Anika Bryce Callum Cassidy Damian Delphine Elias Esme Fabian Freya Gideon Greer Hollis Imogen "
    "Jonah Kiara Lachlan Leilani Magnus Marisol Nico Noelle Orson Petra Quinn Rafael Rosalind Silas Soren Talia "
    "Tristan Valeria Wesley Willa Xander Yara Zane Zoe"
).split()
LAST_NAMES = (
    "Abernathy Blackwood Brightman Castellano Dunleavy Ekwueme Faulkner Fitzgerald Gallagher Haverford Iwasaki "
    "Jablonski Kowalczyk Lindgren McAllister Montgomery Nygaard O'Donnell Pereira Quintero Rasmussen Rutherford "
    "Santangelo Szymanski Thackeray Valdivia Vanderberg Whitfield Wojcik Yamamoto"
).split()
STREET_NAMES = ("Maple Cedar Juniper Willow Hawthorn Sycamore Magnolia Chestnut Alder Linden Poplar Spruce "
                "Laurel Briar Aspen Redwood Cypress Hemlock").split()
STREET_SUFFIXES = ("Street", "Avenue", "Road", "Lane", "Drive", "Court", "Place", "Boulevard")
# Street names the pseudonymizer hands out; disjoint from every word above.
SURROGATE_STREET_NAMES = ("Birch Elm Oak Pine Walnut Hickory Holly Acacia Beech Dogwood Fir Larch Locust Mulberry "
                          "Rowan Sassafras Tamarack Yew Buckeye Catalpa Ginkgo Hornbeam Sumac Tupelo").split()
CITIES = (("Springfield", "62704"), ("Riverton", "82501"), ("Fairview", "97024"), ("Georgetown", "78626"),
          ("Madison", "53703"), ("Clinton", "28328"), ("Ashland", "97520"), ("Burlington", "05401"),
          ("Oakdale", "95361"), ("Salem", "01970"), ("Kingston", "12401"), ("Dover", "19901"))
AREA_CODES = ("207", "312", "415", "503", "608", "617", "704", "802", "919", "971")
EMAIL_DOMAINS = ("gmail.com", "outlook.com", "yahoo.com", "icloud.com", "fastmail.com")
PRODUCTS = (
    ("Wireless Mouse", 24.99, ("black", "white")), ("Mechanical Keyboard", 89.0, ("brown switches", "red switches")),
    ("USB-C Hub", 39.5, ()), ("Noise Cancelling Headphones", 199.0, ("black", "silver")),
    ("Bluetooth Speaker", 59.99, ("blue", "grey")), ("Laptop Stand", 34.0, ()), ("Webcam", 69.0, ()),
    ("Desk Lamp", 27.5, ("white", "black")), ("Water Bottle", 18.0, ("500 ml", "750 ml")),
    ("Yoga Mat", 32.0, ("purple", "green")), ("Running Shoes", 120.0, ("size 9", "size 10", "size 11")),
    ("Backpack", 75.0, ("navy", "olive")), ("Coffee Grinder", 45.0, ()), ("French Press", 29.0, ()),
    ("Electric Kettle", 49.99, ()), ("Cast Iron Skillet", 38.0, ()), ("Chef Knife", 64.0, ()),
    ("Cutting Board", 22.0, ()), ("Throw Blanket", 44.0, ("cream", "charcoal")), ("Scented Candle", 16.5, ()),
    ("Picture Frame", 19.0, ("5x7", "8x10")), ("Wall Clock", 36.0, ()), ("Phone Case", 21.0, ("clear", "black")),
    ("Screen Protector", 12.0, ()), ("Portable Charger", 42.0, ()), ("Fitness Tracker", 99.0, ("black", "rose")),
    ("Sunglasses", 85.0, ()), ("Rain Jacket", 110.0, ("S", "M", "L")), ("Wool Socks", 14.0, ("M", "L")),
    ("Garden Hose", 33.0, ()), ("Board Game", 39.0, ()), ("Jigsaw Puzzle", 17.0, ()),
)


@dataclass(frozen=True)
class Address:
    street: str
    city: str
    zip_code: str


@dataclass(frozen=True)
class Customer:
    id: str
    name: str
    email: str
    phone: str
    address: Address
    payment_methods: tuple[str, ...]


@dataclass(frozen=True)
class Product:
    id: str
    name: str
    price: float
    variants: tuple[str, ...] = ()


@dataclass(frozen=True)
class OrderItem:
    product_id: str
    name: str
    quantity: int
    price: float
    variant: str | None = None


@dataclass
class Order:
    """The one mutable record: tools change status, shipping address and returned items."""

    id: str
    customer_id: str
    items: tuple[OrderItem, ...]
    status: str
    shipping_address: Address
    payment_method: str
    placed_on: str
    tracking_number: str | None = None
    delivered_on: str | None = None
    returned_items: tuple[str, ...] = ()
    cancel_reason: str | None = None

    @property
    def total(self) -> float:
        return round(sum(i.price * i.quantity for i in self.items), 2)


@dataclass
class Database:
    id: str
    today: str
    customers: dict[str, Customer]
    products: dict[str, Product]
    orders: dict[str, Order] = field(default_factory=dict)

    def copy(self) -> Database:
        """A copy an episode may write on: new Order objects (the only mutable records), shared frozen rest."""
        return replace(self, customers=dict(self.customers), products=dict(self.products),
                       orders={k: replace(o) for k, o in self.orders.items()})

    def orders_of(self, customer_id: str) -> list[Order]:
        return [o for o in self.orders.values() if o.customer_id == customer_id]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Database:
        def address(a: dict[str, Any]) -> Address:
            return Address(**a)

        customers = {k: Customer(**{**c, "address": address(c["address"]),
                                    "payment_methods": tuple(c["payment_methods"])})
                     for k, c in data["customers"].items()}
        products = {k: Product(**{**p, "variants": tuple(p["variants"])}) for k, p in data["products"].items()}
        orders = {k: Order(**{**o, "items": tuple(OrderItem(**i) for i in o["items"]),
                              "shipping_address": address(o["shipping_address"]),
                              "returned_items": tuple(o["returned_items"])})
                  for k, o in data["orders"].items()}
        return cls(data["id"], data["today"], customers, products, orders)


def address_dict(address: Address) -> dict[str, str]:
    return {"street": address.street, "city": address.city, "zip_code": address.zip_code}


def order_state(order: Order) -> dict[str, Any]:
    """The judged fields of an order, as JSON values."""
    return {"status": order.status, "shipping_address": address_dict(order.shipping_address),
            "returned_items": sorted(order.returned_items)}


def diff(before: Database, after: Database) -> list[dict[str, Any]]:
    """Every judged field an episode changed: [{"order_id", "field", "value"}], sorted."""
    changes = []
    for order_id, order in sorted(after.orders.items()):
        old = before.orders.get(order_id)
        new_state, old_state = order_state(order), order_state(old) if old else {}
        changes += [{"order_id": order_id, "field": f, "value": new_state[f]}
                    for f in WRITABLE_FIELDS if new_state[f] != old_state.get(f)]
    return changes


def random_street(rng: random.Random) -> str:
    return f"{rng.randint(10, 9899)} {rng.choice(STREET_NAMES)} {rng.choice(STREET_SUFFIXES)}"


def random_address(rng: random.Random) -> Address:
    city, zip_code = rng.choice(CITIES)
    return Address(random_street(rng), city, zip_code)


def _email(rng: random.Random, first: str, last: str) -> str:
    first, last = first.lower(), last.lower().replace("'", "")
    local = rng.choice((f"{first}.{last}", f"{first}{last}{rng.randint(1, 99)}", f"{first[0]}.{last}",
                        f"{first}_{last}"))
    return f"{local}@{rng.choice(EMAIL_DOMAINS)}"


def _customers(rng: random.Random, count: int) -> dict[str, Customer]:
    names = [f"{f} {l}" for f in FIRST_NAMES for l in LAST_NAMES]
    rng.shuffle(names)
    customers, phones = {}, set()
    for n, name in enumerate(names[:count]):
        first, last = name.split(" ", 1)
        phone = ""
        while not phone or phone in phones:
            phone = f"({rng.choice(AREA_CODES)}) {rng.randint(200, 989)}-{rng.randint(0, 9999):04d}"
        phones.add(phone)
        methods = [f"credit_card ending {rng.randint(1000, 9999)}"]
        methods += rng.sample(("paypal", "gift_card"), rng.randint(0, 2))
        customers[f"C{101 + n}"] = Customer(f"C{101 + n}", name, _email(rng, first, last), phone,
                                            random_address(rng), tuple(methods))
    return customers


def _order(rng: random.Random, order_id: str, customer: Customer, products: list[Product], today: date) -> Order:
    status = rng.choices(STATUSES, weights=(26, 14, 18, 32, 10))[0]
    items = tuple(OrderItem(p.id, p.name, rng.choice((1, 1, 1, 2)), p.price,
                            rng.choice(p.variants) if p.variants else None)
                  for p in rng.sample(products, rng.randint(1, 3)))
    age = {"pending": (0, 2), "processed": (1, 4), "shipped": (3, 8), "delivered": (8, 75), "cancelled": (2, 60)}
    placed = today - timedelta(days=rng.randint(*age[status]))
    tracking = delivered = None
    if status in ("shipped", "delivered"):
        tracking = "1Z" + "".join(rng.choice("0123456789ABCDEFGHJKLMNPRSTUVWXYZ") for _ in range(14))
    if status == "delivered":
        delivered = (placed + timedelta(days=rng.randint(3, 7))).isoformat()
    address = customer.address if rng.random() < 0.85 else random_address(rng)
    return Order(order_id, customer.id, items, status, address, rng.choice(customer.payment_methods),
                 placed.isoformat(), tracking, delivered)


def generate_database(seed: int = 0, customers: int = 48, orders: int = 150) -> Database:
    """The store `store-<seed>`: the same seed always gives the same database."""
    rng = random.Random(f"support-store-{seed}")
    today = TODAY
    products = {f"P{201 + n}": Product(f"P{201 + n}", name, price, variants)
                for n, (name, price, variants) in enumerate(PRODUCTS)}
    people = _customers(rng, customers)
    people_list, product_list = list(people.values()), list(products.values())
    order_ids: set[str] = set()
    all_orders: dict[str, Order] = {}
    for n in range(orders):
        customer = people_list[n] if n < len(people_list) else rng.choice(people_list)  # everyone has an order
        order_id = ""
        while not order_id or order_id in order_ids:
            order_id = f"W{rng.randint(1000000, 9999999)}"
        order_ids.add(order_id)
        all_orders[order_id] = _order(rng, order_id, customer, product_list, today)
    return Database(f"store-{seed}", today.isoformat(), people, products, dict(sorted(all_orders.items())))


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """A JSON-like value with `fn` applied to every string in it (keys stay; tuples become lists)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [map_strings(v, fn) for v in value]
    return value


class Pseudonymizer:
    """Consistent surrogates for the store's personal data, chosen by a keyed hash (HMAC-SHA256) of a secret.

    Names are mapped word by word (first and last names separately, one-to-one, onto name lists disjoint from the
    store's), so a name reads the same in the database, a prompt, a tool result and a reply; an email keeps its
    domain and layout with its name parts replaced, a phone keeps its area code and gets new digits, a street
    gets a new number and name and keeps its suffix. Cities and zip codes stay. `text` works on any free text,
    so episodes, prompts and answers change exactly as the database does and still replay to the same outcome.
    """

    def __init__(self, secret: str) -> None:
        from agent_rl.surrogates import FIRST_NAMES as FIRST_POOL
        from agent_rl.surrogates import LAST_NAMES as LAST_POOL

        if not secret:
            raise ValueError("pseudonymizing needs a secret key")
        self._key = secret.encode("utf-8")
        taken = {_bare(w) for w in FIRST_NAMES + LAST_NAMES + STREET_NAMES + [c for c, _ in CITIES]}
        self._names = (self._assign("first", FIRST_NAMES, [n for n in FIRST_POOL if _bare(n) not in taken])
                       | self._assign("last", LAST_NAMES, [n for n in LAST_POOL if _bare(n) not in taken]))
        self._streets = self._assign("street", STREET_NAMES, SURROGATE_STREET_NAMES)
        self._letters = dict(zip(ascii_lowercase, sorted(ascii_lowercase, key=lambda c: self._digest("letter", c))))
        words = sorted(FIRST_NAMES + LAST_NAMES, key=len, reverse=True)
        self._name_re = re.compile(r"(?<![\w'])(?:%s)(?![\w'])" % "|".join(map(re.escape, words)), re.IGNORECASE)
        self._street_re = re.compile(r"\b(\d{1,5}) (%s) (%s)\b" % ("|".join(STREET_NAMES), "|".join(STREET_SUFFIXES)))

    _email_re = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
    _phone_re = re.compile(r"\((\d{3})\) (\d{3})-(\d{4})")

    def _digest(self, kind: str, value: str) -> bytes:
        return hmac.new(self._key, f"{kind}\0{value}".encode(), hashlib.sha256).digest()

    def _assign(self, kind: str, originals: list[str], pool: list[str]) -> dict[str, str]:
        """A one-to-one keyed map of `originals` (by lowercase bare form) onto `pool`."""
        out: dict[str, str] = {}
        used: set[str] = set()
        for original in sorted(originals):
            pick = next(c for c in sorted(pool, key=lambda c: self._digest(f"{kind}:{original}", c)) if c not in used)
            used.add(pick)
            out[_bare(original)] = pick
        return out

    def _number(self, kind: str, value: str, digits: int) -> int:
        low = 10 ** (digits - 1)
        return low + int.from_bytes(self._digest(kind, value)[:8], "big") % (10 ** digits - low)

    def name(self, word: str) -> str:
        return _match_case(self._names[_bare(word)], word)

    def email(self, address: str) -> str:
        local, _, domain = address.rpartition("@")
        out = []
        for part in re.split(r"([._+\-]|\d+)", local):
            bare = _bare(part)
            if bare in self._names:
                out.append(_bare(self._names[bare]))
            elif len(part) == 1 and part.isalpha():
                out.append(self._letters.get(part.lower(), part))
            elif part.isalpha() and (split := self._split(bare)):
                out.append("".join(_bare(self._names[w]) for w in split))
            elif part.isalpha():
                out.append("".join(ascii_lowercase[b % 26] for b in self._digest("word", bare)[:len(part)]))
            else:
                out.append(part)
        return "".join(out) + "@" + domain

    def _split(self, run: str) -> tuple[str, str] | None:
        """A run of letters read as two name parts ("aidenblackwood"), if it is one."""
        return next(((run[:i], run[i:]) for i in range(2, len(run) - 1)
                     if run[:i] in self._names and run[i:] in self._names), None)

    def phone(self, match: re.Match[str]) -> str:
        number = str(self._number("phone", match.group(0), 7))
        number = str(2 + int(number[0]) % 8) + number[1:]
        return f"({match.group(1)}) {number[:3]}-{number[3:]}"

    def street(self, match: re.Match[str]) -> str:
        number = self._number("house", match.group(0), len(match.group(1)))
        return f"{number} {self._streets[_bare(match.group(2))]} {match.group(3)}"

    def text(self, text: str) -> str:
        """`text` with every email, phone, street and customer name replaced by its surrogate."""
        text = self._email_re.sub(lambda m: self.email(m.group(0)), text)
        text = self._phone_re.sub(self.phone, text)
        text = self._street_re.sub(self.street, text)
        return self._name_re.sub(lambda m: self.name(m.group(0)), text)

    def value(self, value: Any) -> Any:
        """A JSON-like value with `text` applied to every string in it (keys stay)."""
        return map_strings(value, self.text)

    def database(self, db: Database) -> Database:
        return Database.from_dict(self.value(db.to_dict()))


def _bare(word: str) -> str:
    return word.lower().replace("'", "")


def _match_case(surrogate: str, original: str) -> str:
    if original.isupper() and len(original) > 1:
        return surrogate.upper()
    return surrogate.lower() if original.islower() else surrogate
