"""The customer-support environment: a store's agent looks customers and orders up and acts within the policy.

Success is what the episode leaves behind: the writes it made to its own copy of the database (`store.diff`) must
be exactly the task's expected writes, and the reply must carry the facts asked for, or refuse, or say the customer
or order cannot be found. A wrong write is the worst outcome short of a broken format: it changes a real order.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from datetime import date
from typing import Any, ClassVar

from agent_rl.environments.core import (Environment, EnvironmentError, FinalAnswer, Grading, Judgement, PrivacySpec,
                                        ProbeItem, Task, Trajectory, World)
from agent_rl.environments.policy import Conversation, Policy, PolicyTurn, ToolCall, ToolSchema
from agent_rl.environments.support.policy import POLICY_TEXT, can_cancel, can_change_address, can_return
from agent_rl.environments.support.session import ORDER_ID, SupportSession
from agent_rl.environments.support.store import (
    Address,
    Database,
    Order,
    OrderItem,
    Pseudonymizer,
    diff,
    generate_database,
    map_strings,
)
from agent_rl.environments.support.tasks import CATEGORIES, NAME, REFUSAL_CATEGORIES, generate_tasks
from agent_rl.records import Outcome, Split

SYSTEM_PROMPT = f"""You are a customer-support agent of an online store. Use the tools to look the customer \
and their orders up and to act on them; never guess an order's state.

{POLICY_TEXT}"""

REFUSES = re.compile(r"\b(cannot|can ?not|can't|unable to|not able to|not (?:possible|allowed|eligible)|"
                     r"isn't (?:possible|allowed|eligible)|won't be able)\b", re.IGNORECASE)
NOT_FOUND = re.compile(r"\b((?:could ?n[o']t|cannot|can't|unable to|did ?n[o']t|was ?n[o']t able to) "
                       r"(?:find|locate)|not (?:be )?found|no (?:record|account|customer|order)s? "
                       r"(?:of|with|for|matching|under)|does ?n[o']t exist|do ?n[o']t exist)", re.IGNORECASE)
# Reward by outcome; a wrong write costs WRONG_WRITE on top, so it is always below an episode that wrote nothing.
REWARDS = {Outcome.CORRECT: 1.0, Outcome.IDK: 0.0, Outcome.RAN_OUT: 0.0, Outcome.WRONG: -0.5,
           Outcome.FORMAT_ERROR: -1.0}
WRONG_WRITE = -1.0


def _canonical(writes: Iterable[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(w, sort_keys=True) for w in writes)


def mentions(text: str, fact: str) -> bool:
    """Whether a reply states `fact`; an amount like 89.00 may also be written 89."""
    lower = text.lower()
    if fact.lower() in lower:
        return True
    whole = re.fullmatch(r"(\d+)\.00", fact)
    return bool(whole and re.search(rf"(?<![\d.]){whole.group(1)}(?![\d]|\.\d)", lower))


class SupportEnvironment(Environment):
    """A generated store (`store-<seed>`) and its support tasks, judged by database state and reply."""

    name: ClassVar[str] = NAME
    categories: ClassVar[tuple[str, ...]] = CATEGORIES
    # Categories where refusing is the right move: its judge rewards the refusal there.
    refusal_categories: ClassVar[tuple[str, ...]] = REFUSAL_CATEGORIES
    system_prompt: ClassVar[str] = SYSTEM_PROMPT

    def __init__(self, seed: int = 0, tasks_per_category: int = 50, database: Database | None = None,
                 tasks: list[Task] | None = None) -> None:
        self.database = database or generate_database(seed)  # the base: sessions get copies, never this
        self._tasks = tasks if tasks is not None else generate_tasks(self.database, tasks_per_category)

    def tasks(self, split: Split) -> list[Task]:
        return [t for t in self._tasks if t.split == split]

    def open(self, task: Task) -> SupportSession:
        if task.context != self.database.id:
            raise EnvironmentError(self.name, f"no store {task.context[:40]!r} (this one is {self.database.id!r})")
        return SupportSession(self.database.copy())

    def session_type(self) -> type:
        return SupportSession

    def final_answer(self, session: SupportSession) -> FinalAnswer | None:
        return session.answer

    def judge(self, task: Task, session: SupportSession, trajectory: Trajectory) -> Judgement:
        changes = diff(self.database, session.db)
        expected = _canonical(task.metadata.get("expected_writes") or [])
        wrong = any(c not in expected for c in _canonical(changes))
        state_ok = _canonical(changes) == expected
        answer = trajectory.answer
        reply_ok = answer is not None and self._reply_ok(task, answer.text)
        if trajectory.format_error:
            outcome = Outcome.FORMAT_ERROR
        elif answer is None:
            outcome = Outcome.RAN_OUT
        elif task.reference is None:
            return Judgement(Outcome.UNJUDGED)  # live traffic: nothing to judge against
        elif wrong:
            outcome = Outcome.WRONG
        elif state_ok and reply_ok:
            outcome = Outcome.CORRECT
        elif not changes and task.category not in self.refusal_categories and (
                REFUSES.search(answer.text) or NOT_FOUND.search(answer.text)):
            outcome = Outcome.IDK  # declined a request it should have served: better than a wrong reply
        else:
            outcome = Outcome.WRONG
        penalty = WRONG_WRITE if wrong else 0.0
        components = {"state": float(state_ok), "reply": float(reply_ok), "wrong_write": penalty,
                      "format": -1.0 if outcome == Outcome.FORMAT_ERROR else 0.0}
        return Judgement(outcome, REWARDS[outcome] + penalty, components)

    def _reply_ok(self, task: Task, text: str) -> bool:
        if not all(mentions(text, str(f)) for f in task.metadata.get("facts") or []):
            return False
        if task.category == "policy_refusal":
            return bool(REFUSES.search(text))
        if task.category == "unknown_customer":
            return bool(NOT_FOUND.search(text))
        return True

    # -- privacy ---------------------------------------------------------------------------------

    def world(self) -> SupportWorld:
        """The store's database: its customers are people, rewritten whole by curation (SupportWorld)."""
        return SupportWorld(self)

    def pseudonymized(self, secret: str) -> tuple[SupportEnvironment, Callable[[str], str]]:
        """This environment with its personal data replaced by keyed surrogates (`store.Pseudonymizer`), and the
        text function that replaces the same data the same way in prompts, episodes and answers."""
        pseudonymizer = Pseudonymizer(secret)
        return self.world().anonymized(pseudonymizer.text), pseudonymizer.text

    # -- grading ----------------------------------------------------------------------

    def grading(self) -> Grading:
        """Rewards from -2 to 1, and the forgetting probe below."""
        return Grading(reward_range=(-2.0, 1.0), probe=tuple(_probe()))


def _probe() -> list[ProbeItem]:
    """General questions the support model must still answer after training (the forgetting gate)."""
    return [ProbeItem(q, a) for q, a in (
        ("What is 7 times 8?", ("56",)), ("What is 125 plus 375?", ("500",)),
        ("What is 81 divided by 9?", ("9", "nine")), ("How many days are in a leap year?", ("366",)),
        ("What is the capital of France?", ("Paris",)), ("What is the chemical symbol for water?", ("H2O",)),
        ("How many minutes are in two hours?", ("120",)), ("What planet is known as the Red Planet?", ("Mars",)),
        ("What is 15% of 200?", ("30",)), ("Which ocean is the largest?", ("Pacific",)),
    )]


EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
NAME_ZIP = re.compile(r"(?:name is|This is) (.+?)(?:,| and) (?:my )?zip code (?:is )?(\d{5})")
NEW_ADDRESS = re.compile(r" to (\d+ [^,]+), ([^,]+), (\d{5})")


class SupportWorld(World):
    """The store's database as curation sees it: customers are people (`privacy`: who, and which names are the
    store's), rewritten with their orders' streets and the tasks by `anonymized`."""

    def __init__(self, environment: SupportEnvironment) -> None:
        super().__init__(environment)
        self.env = environment

    def teacher(self, success_rate: float = 1.0, seed: int = 0) -> SupportTeacher:
        """The rule-based teacher; below a `success_rate` of 1 it stands in for an imperfect production agent."""
        return SupportTeacher(date.fromisoformat(self.env.database.today), success_rate=success_rate, seed=seed)

    def privacy(self) -> PrivacySpec:
        # Product names and cities are the store's, not anyone's: a name detector must leave them be.
        public = sorted({p.name for p in self.env.database.products.values()}
                        | {c.address.city for c in self.env.database.customers.values()})
        return PrivacySpec(id_fields=("task_id", "citations"), known_people=self.known_people,
                           public_terms=tuple(public))

    def known_people(self, context: str) -> list[tuple[str, str]]:
        """(name, email) of every customer of the store `context`."""
        if context != self.env.database.id:
            return []
        return [(c.name, c.email) for c in self.env.database.customers.values()]

    def anonymized(self, transform: Callable[[str], str]) -> SupportEnvironment:
        """A copy whose customers' names, emails, phones and streets (and orders' shipping streets) and whose
        tasks went through `transform`; ids, products, cities and zip codes stay, so tasks still play the same."""
        data = self.env.database.to_dict()
        for customer in data["customers"].values():
            for key in ("name", "email", "phone"):
                customer[key] = transform(customer[key])
            customer["address"]["street"] = transform(customer["address"]["street"])
        for order in data["orders"].values():
            order["shipping_address"]["street"] = transform(order["shipping_address"]["street"])
        tasks = [t.model_copy(update={"prompt": transform(t.prompt), "metadata": map_strings(dict(t.metadata), transform),
                                      "reference": None if t.reference is None else transform(t.reference)})
                 for t in self.env._tasks]
        return SupportEnvironment(database=Database.from_dict(data), tasks=tasks)


class SupportTeacher(Policy):
    """A rule-based agent for the support tasks: identify the customer, read the order, apply the policy's own
    rules, act or refuse, reply. It reads only the conversation (the customer's message and tool results)."""

    version = "support-teacher-v1"
    reads_conversations_only = True

    def __init__(self, today: date, success_rate: float = 1.0, seed: int = 0) -> None:
        if not 0 <= success_rate <= 1:
            raise ValueError(f"success_rate must be in [0, 1], got {success_rate}")
        self.today = today
        self.success_rate, self.seed = success_rate, seed

    def _fumbles(self, prompt: str) -> bool:
        """Whether this conversation is one the simulated agent gets wrong: a fixed share of requests, chosen by a
        keyed hash of the customer's message, so a replay fails the same way."""
        if self.success_rate >= 1:
            return False
        digest = hashlib.sha256(f"{self.seed}:{prompt}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 >= self.success_rate

    def act(self, conversations: list[Conversation], tools: list[ToolSchema],
            max_new_tokens: int = 256) -> list[PolicyTurn]:
        turns = []
        for messages in conversations:
            try:
                name, arguments = self._next(messages)
            except Exception:  # an odd conversation: end it politely rather than raise
                name, arguments = "reply", {"message": "I'm sorry, something went wrong. Please contact us again."}
            done = sum(1 for m in messages if m.get("role") == "assistant")
            turns.append(PolicyTurn(tool_calls=[ToolCall(name, arguments, f"call_{done + 1}")]))
        return turns

    def _next(self, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        prompt = next(str(m.get("content") or "") for m in messages if m.get("role") == "user")
        history = _history(messages)
        found = ORDER_ID.search(prompt)
        order_id = found.group(0) if found else ""

        lookup = next((r for n, _, r in history if n.startswith("find_customer")), None)
        if lookup is None:
            if email := EMAIL.search(prompt):
                return "find_customer_by_email", {"email": email.group(0)}
            if person := NAME_ZIP.search(prompt):
                return "find_customer_by_name_zip", {"name": person.group(1), "zip_code": person.group(2)}
            return _reply("I'm sorry, I could not find your account: please give me your email, or your name "
                          "and zip code.")
        if "error" in lookup:
            return _reply(f"I'm sorry, I could not find an account with those details, so I cannot help with "
                          f"order {order_id} yet. Please check your email, or your name and zip code.")
        if self._fumbles(prompt):  # it found the customer, then answers without doing or checking anything
            return _reply("Thanks for reaching out! I have noted your request and a colleague will follow up.")
        if not order_id:
            return _reply("Which order is it about? Please give me the order id, like W1234567.")
        order_json = next((r for n, _, r in history if n == "get_order"), None)
        if order_json is None:
            return "get_order", {"order_id": order_id}
        if "error" in order_json:
            if order_json["error"].startswith("no order"):
                return _reply(f"I'm sorry, I could not find order {order_id} on your account.")
            return _reply(f"I'm sorry, but I cannot help with order {order_id}: {order_json['error']}.")

        write = next(((n, a, r) for n, a, r in history if n in ("cancel_order", "change_address", "return_items")),
                     None)
        if write is not None:
            return _reply(_after_write(order_id, *write))
        return self._decide(prompt, _order(order_json))

    def _decide(self, prompt: str, order: Order) -> tuple[str, dict[str, Any]]:
        lower = prompt.lower()
        if re.search(r"\bcancel\b", lower):  # the word itself: "Noise Cancelling Headphones" is no request
            if refused := can_cancel(order):
                return _reply(f"I'm sorry, but I cannot cancel order {order.id}: {refused}.")
            reason = "ordered by mistake" if "mistake" in lower else "no longer needed"
            return "cancel_order", {"order_id": order.id, "reason": reason}
        if re.search(r"\breturn\b", lower):
            ids = [i.product_id for i in order.items if "everything" in lower or i.name.lower() in lower]
            if refused := can_return(order, ids, self.today):
                return _reply(f"I'm sorry, but I cannot accept that return: {refused}.")
            return "return_items", {"order_id": order.id, "item_ids": ids}
        if address := NEW_ADDRESS.search(prompt):
            if refused := can_change_address(order):
                return _reply(f"I'm sorry, but I cannot change the address of order {order.id}: {refused}.")
            street, city, zip_code = address.groups()
            return "change_address", {"order_id": order.id, "street": street, "city": city, "zip_code": zip_code}
        tracking = f" Its tracking number is {order.tracking_number}." if order.tracking_number else ""
        return _reply(f"Your order {order.id} is {order.status}.{tracking}")


def _reply(message: str) -> tuple[str, dict[str, Any]]:
    return "reply", {"message": message}


def _history(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(tool, arguments, decoded result) of every call so far, calls paired with the tool messages in order."""
    calls = [c.get("function", c) for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    results = [m.get("content") for m in messages if m.get("role") == "tool"]
    out = []
    for call, result in zip(calls, results):
        try:
            decoded = json.loads(result) if isinstance(result, str) else {}
        except ValueError:
            decoded = {"text": result}
        arguments = call.get("arguments")
        out.append((str(call.get("name")), arguments if isinstance(arguments, dict) else {},
                    decoded if isinstance(decoded, dict) else {"items": decoded}))
    return out


def _order(data: dict[str, Any]) -> Order:
    """An order as get_order showed it, so the teacher applies the policy's own rule functions."""
    items = tuple(OrderItem(i["item_id"], i["name"], i["quantity"], i["price"], i.get("variant"))
                  for i in data["items"])
    return Order(data["order_id"], data["customer_id"], items, data["status"], Address(**data["shipping_address"]),
                 data["payment_method"], data["placed_on"], data.get("tracking_number"), data.get("delivered_on"),
                 tuple(data.get("returned_items") or ()))


def _after_write(order_id: str, tool: str, arguments: dict[str, Any], result: dict[str, Any]) -> str:
    if "error" in result:
        return f"I'm sorry, but I cannot do that for order {order_id}: {result['error']}."
    refund = f" A refund of ${result.get('refund', 0):.2f} goes back to your {result.get('refund_to')}."
    if tool == "cancel_order":
        return f"Order {order_id} has been cancelled.{refund}"
    if tool == "return_items":
        return f"The return of {', '.join(result['returned_items'])} from order {order_id} is requested.{refund}"
    a = result["shipping_address"]
    return f"Done: order {order_id} will now ship to {a['street']}, {a['city']}, {a['zip_code']}."
