"""Support tasks generated from a store database: the customer's first message and what success looks like.

Each task knows the writes a correct episode leaves in the database (`expected_writes`, as `store.diff` reports
them) and the facts its reply must mention (`facts`). Requests the policy forbids and customers or orders that do
not exist are tasks too: there the right episode writes nothing and refuses, or says it cannot find them. The same
database always gives the same tasks; every fifth task of each category is a test task.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import date
from typing import Any

from agent_rl.environments.core import Task
from agent_rl.environments.support.policy import can_cancel, can_change_address, can_return, refund_amount
from agent_rl.environments.support.store import (
    FIRST_NAMES,
    LAST_NAMES,
    RETURN_REQUESTED,
    Customer,
    Database,
    Order,
    address_dict,
    random_address,
)
from agent_rl.records import Split

NAME = "support"
CATEGORIES = ("order_status", "cancel_order", "change_address", "return_items", "policy_refusal", "unknown_customer")
REFUSAL_CATEGORIES = ("policy_refusal", "unknown_customer")
REFUSE, NOT_FOUND = "refuse", "not found"
CANCEL_REASONS = {"I no longer need it": "no longer needed", "I ordered it by mistake": "ordered by mistake"}


def _identity(rng: random.Random, name: str, email: str, zip_code: str) -> str:
    if rng.random() < 0.5:
        return rng.choice((f"My email is {email}.", f"I'm writing from {email}.", f"My account email is {email}."))
    return rng.choice((f"My name is {name} and my zip code is {zip_code}.", f"This is {name}, zip code {zip_code}."))


def _items_phrase(order: Order, ids: list[str]) -> str:
    if len(ids) == len(order.items) and len(ids) > 1:
        return "everything"
    names = [f"the {i.name}" for i in order.items if i.product_id in ids]
    return " and ".join(names)


def _request(rng: random.Random, kind: str, order_id: str, **extra: Any) -> str:
    """The customer's ask, in first person; the teacher reads these shapes back."""
    if kind == "status":
        return rng.choice((f"Where is my order {order_id}?", f"Can you tell me the status of order {order_id}?",
                           f"Has my order {order_id} shipped yet? I'd like the tracking number if there is one."))
    if kind == "cancel":
        return f"Please cancel order {order_id}, {extra['reason']}."
    if kind == "address":
        a = extra["address"]
        return rng.choice((f"Please change the shipping address of order {order_id} to {a.street}, {a.city}, "
                           f"{a.zip_code}.",
                           f"I moved. Could you ship order {order_id} to {a.street}, {a.city}, {a.zip_code} "
                           "instead?"))
    return f"I'd like to return {extra['items']} from order {order_id}."


def _prompt(rng: random.Random, identity: str, request: str) -> str:
    if rng.random() < 0.6:
        return f"Hi! {identity} {request}"
    return f"Hello, {request if request.startswith('I') else request[0].lower() + request[1:]} {identity}"


class _Builder:
    """Draws the tasks of one category from the orders its requests fit."""

    def __init__(self, db: Database) -> None:
        self.db, self.today = db, date.fromisoformat(db.today)
        self.rng = random.Random(f"support-tasks-{db.id}")
        orders = sorted(db.orders.values(), key=lambda o: o.id)
        self.pending = [o for o in orders if can_cancel(o) is None]
        self.returnable = [o for o in orders if can_return(o, [o.items[0].product_id], self.today) is None]
        self.late = [o for o in orders if o.status == "delivered" and o not in self.returnable]
        self.active = [o for o in orders if o.status in ("processed", "shipped", "delivered")]
        self.not_delivered = [o for o in orders if o.status in ("pending", "processed", "shipped")]
        self.cancelled = [o for o in orders if o.status == "cancelled"]
        self.orders = orders
        used = {c.name for c in db.customers.values()}
        self.strangers = sorted(f"{f} {l}" for f in FIRST_NAMES for l in LAST_NAMES if f"{f} {l}" not in used)

    def pick(self, pool: list[Order]) -> Order:
        if not pool:
            raise ValueError(f"store {self.db.id} has too few orders of a kind to build its tasks")
        return self.rng.choice(pool)

    def who(self, order: Order) -> str:
        c: Customer = self.db.customers[order.customer_id]
        return _identity(self.rng, c.name, c.email, c.address.zip_code)

    def action(self, order: Order, kind: str) -> tuple[str, dict[str, Any]]:
        """A request of `kind` about `order`, and the metadata of what it asks."""
        rng = self.rng
        if kind == "cancel":
            phrase = rng.choice(sorted(CANCEL_REASONS))
            return _request(rng, kind, order.id, reason=phrase), {"reason": CANCEL_REASONS[phrase]}
        if kind == "address":
            new = random_address(rng)
            while new.street == order.shipping_address.street:
                new = random_address(rng)
            return _request(rng, kind, order.id, address=new), {"new_address": address_dict(new)}
        if kind == "return":
            ids = sorted(rng.sample([i.product_id for i in order.items], rng.randint(1, len(order.items))))
            return _request(rng, kind, order.id, items=_items_phrase(order, ids)), {"item_ids": ids}
        return _request(rng, kind, order.id), {}

    # -- categories: each gives (prompt, reference, expected writes, facts, metadata) -------------

    def order_status(self, n: int) -> tuple[str, str, list, list, dict]:
        order = self.pick(self.orders)
        request, meta = self.action(order, "status")
        facts = [order.status] + ([order.tracking_number] if order.tracking_number else [])
        return _prompt(self.rng, self.who(order), request), "; ".join(facts), [], facts, meta | {"order_id": order.id}

    def cancel_order(self, n: int) -> tuple[str, str, list, list, dict]:
        order = self.pick(self.pending)
        request, meta = self.action(order, "cancel")
        writes = [{"order_id": order.id, "field": "status", "value": "cancelled"}]
        return (_prompt(self.rng, self.who(order), request), f"order {order.id} cancelled", writes,
                [order.id, "cancel"], meta | {"order_id": order.id})

    def change_address(self, n: int) -> tuple[str, str, list, list, dict]:
        order = self.pick(self.pending)
        request, meta = self.action(order, "address")
        writes = [{"order_id": order.id, "field": "shipping_address", "value": meta["new_address"]}]
        where = "{street}, {city}, {zip_code}".format(**meta["new_address"])
        return (_prompt(self.rng, self.who(order), request), f"order {order.id} ships to {where}", writes,
                [order.id], meta | {"order_id": order.id})

    def return_items(self, n: int) -> tuple[str, str, list, list, dict]:
        order = self.pick(self.returnable)
        request, meta = self.action(order, "return")
        ids, amount = meta["item_ids"], f"{refund_amount(order, meta['item_ids']):.2f}"
        writes = [{"order_id": order.id, "field": "status", "value": RETURN_REQUESTED},
                  {"order_id": order.id, "field": "returned_items", "value": ids}]
        return (_prompt(self.rng, self.who(order), request), f"return of {ids} from {order.id}, refund {amount}",
                writes, [order.id, amount], meta | {"order_id": order.id})

    def policy_refusal(self, n: int) -> tuple[str, str, list, list, dict]:
        variant = ("cancel_not_pending", "address_not_pending", "return_late", "return_not_delivered",
                   "cancelled_order", "other_customer")[n % 6]
        pools = {"cancel_not_pending": (self.active, "cancel"), "address_not_pending": (self.active, "address"),
                 "return_late": (self.late, "return"), "return_not_delivered": (self.not_delivered, "return"),
                 "cancelled_order": (self.cancelled, self.rng.choice(("cancel", "address", "return"))),
                 "other_customer": (self.pending, "cancel")}
        pool, kind = pools[variant]
        order = self.pick(pool)
        request, meta = self.action(order, kind)
        asker = order
        if variant == "other_customer":  # someone else asks about this order
            asker = self.pick([o for o in self.orders if o.customer_id != order.customer_id])
        rules: dict[str, Callable[[Order], str | None]] = {
            "cancel": can_cancel, "address": can_change_address,
            "return": lambda o: can_return(o, meta.get("item_ids", []), self.today)}
        assert variant == "other_customer" or rules[kind](order) is not None
        return (_prompt(self.rng, self.who(asker), request), REFUSE, [], [],
                meta | {"order_id": order.id, "variant": variant})

    def unknown_customer(self, n: int) -> tuple[str, str, list, list, dict]:
        variant = ("unknown_email", "unknown_name", "wrong_zip", "unknown_order")[n % 4]
        order = self.pick(self.orders)
        kind = self.rng.choice(("status", "cancel", "address", "return"))
        customer = self.db.customers[order.customer_id]
        stranger = self.rng.choice(self.strangers)
        if variant == "unknown_order":
            missing = order.id
            while missing in self.db.orders:
                missing = f"W{self.rng.randint(1000000, 9999999)}"
            order = Order(missing, customer.id, order.items, order.status, order.shipping_address,
                          order.payment_method, order.placed_on)
            identity = self.who(order)
        elif variant == "unknown_email":
            first, last = stranger.lower().replace("'", "").split(" ", 1)
            identity = f"My email is {first}.{last}@{customer.email.rsplit('@', 1)[1]}."
        else:
            zip_code = customer.address.zip_code
            name = stranger if variant == "unknown_name" else customer.name
            if variant == "wrong_zip":
                zip_code = next(z for z in sorted({c.address.zip_code for c in self.db.customers.values()})
                                if z != customer.address.zip_code)
            identity = f"My name is {name} and my zip code is {zip_code}."
        request, meta = self.action(order, kind)
        return (_prompt(self.rng, identity, request), NOT_FOUND, [], [],
                meta | {"order_id": order.id, "variant": variant})


def generate_tasks(db: Database, per_category: int = 50) -> list[Task]:
    """`per_category` tasks of each category on `db` (the default: 300 tasks), deterministic."""
    builder, tasks = _Builder(db), []
    for category in CATEGORIES:
        make = getattr(builder, category)
        for n in range(per_category):
            prompt, reference, writes, facts, meta = make(n)
            tasks.append(Task(id=f"{db.id}-{category}-{n:03d}", environment=NAME, context=db.id, prompt=prompt,
                              reference=reference, category=category,
                              split=Split.TEST if n % 5 == 4 else Split.TRAIN,
                              metadata={"expected_writes": writes, "facts": facts} | meta))
    return tasks
