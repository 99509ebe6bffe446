"""What the simulated outside agent talks about: a shop's support assistant, its client-declared tools, and the
words its users write (requests, re-asks, corrections, follow-ups, thanks, complaints).

The wording is shared by satisfied and unhappy users alike: in `population.py` the two differ only in how often
they react which way, as people do, never in a giveaway phrase the labeler could learn instead of the behaviour.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

SYSTEM_PROMPT = ("You are the support assistant of an online shop. Use the tools to look things up; answer briefly "
                 "and never invent order details.")

_PRODUCTS = ("kettle", "desk lamp", "blender", "rice cooker", "air fryer", "standing desk", "office chair",
             "coffee grinder", "toaster", "space heater", "monitor arm", "backpack")
_CITIES = ("Portland", "Denver", "Austin", "Boston", "Chicago", "Seattle", "Atlanta", "Phoenix", "Detroit")
_STREETS = ("12 Oak Street", "48 Pine Avenue", "7 Lake Road", "301 Hill Drive", "95 River Lane", "22 Elm Court")
_STATUSES = ("shipped", "out for delivery", "being packed", "delayed at the depot")


def _fn(name: str, description: str, **params: str) -> dict[str, Any]:
    properties = {k: {"type": "string", "description": v} for k, v in params.items()}
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": list(params)}}}


# The tools the client declares on every call (the gateway stores them with the episode).
TOOLS: list[dict[str, Any]] = [
    _fn("lookup_order", "Status and delivery date of an order", order_id="the order number"),
    _fn("search_help", "Search the shop's help articles", query="what to look for"),
    _fn("check_stock", "Units of a product in stock at a city's store", product="product name", city="city"),
    _fn("update_address", "Change an order's delivery address", order_id="the order number", address="new address"),
]


@dataclass(frozen=True)
class Topic:
    """One kind of request: its phrasings (each a full request), a short form for terse re-asks, the tool calls
    that answer it and the answer's wording."""

    name: str
    phrasings: tuple[str, ...]
    short: str
    calls: tuple[tuple[str, tuple[str, ...]], ...]  # (tool, argument slot names)
    answer: str


TOPICS: tuple[Topic, ...] = (
    Topic("order_status", ("Where is my order {order}?", "What's the status of order {order}?",
                           "Has order {order} shipped yet?", "When will order {order} arrive?"),
          "where order {order} is", (("lookup_order", ("order",)),),
          "Order {order} is {status} and should arrive on {date}."),
    Topic("refund", ("How do I get a refund for a damaged {product}?",
                     "What is your refund policy for a broken {product}?",
                     "Can I return a damaged {product} and get my money back?"),
          "how to get a refund for the {product}", (("search_help", ("refund_query",)),),
          "A damaged {product} can be returned within 30 days for a full refund: start it from your orders page."),
    Topic("stock", ("Is the {product} in stock in {city}?", "Do you have any {product} available at the {city} store?",
                    "Can I buy a {product} in {city} today?"),
          "if the {product} is in stock in {city}", (("check_stock", ("product", "city")),),
          "The {city} store has {units} {product} units in stock right now."),
    Topic("address", ("Can you change the delivery address for order {order} to {street}?",
                      "Please update the shipping address of order {order} to {street}.",
                      "I moved, please ship order {order} to {street} instead."),
          "to change the address of order {order}",
          (("lookup_order", ("order",)), ("update_address", ("order", "street"))),
          "Done: order {order} will now be delivered to {street}."),
    Topic("shipping", ("How much is shipping to {city}?", "What does delivery to {city} cost?",
                       "What is the shipping fee for an order to {city}?"),
          "the shipping cost to {city}", (("search_help", ("shipping_query",)),),
          "Standard shipping to {city} is $6.90, free on orders over $50."),
    Topic("warranty", ("How long is the warranty on the {product}?", "Does the {product} come with a warranty?",
                       "What warranty do I get with a {product}?"),
          "the warranty of the {product}", (("search_help", ("warranty_query",)),),
          "The {product} has a two-year warranty covering defects; keep your receipt."),
)

REASKS = ("I asked: {request}", "{request} Please answer the question.", "Again, {short}?",
          "Can you just tell me {short}?", "{other}", "{other} I still need to know.")
CORRECTIONS = ("No, I meant {changed}", "That's not what I asked. {request}", "That's wrong, I need {short}.",
               "Not what I asked for. {other}", "Sorry, I meant {changed}", "No no, {short}.")
THANKS = ("Thanks!", "Perfect, thank you.", "Great, that's what I needed.", "thx", "Awesome, thanks a lot.",
          "ok thanks", "That helps, thanks.")
COMPLAINTS = ("This is useless.", "You're not helping at all.", "Forget it.", "What a waste of time.",
              "This doesn't help me.", "Never mind, I'll call the store.")
FOLLOW_UP_PREFIXES = ("", "Also, ", "One more thing: ", "And ")
_QUESTION_WORDS = frozenset("what where when how who which why is are was were do does did has have can could "
                            "will would please".split())
WELCOME = "You're welcome! Anything else I can do?"
APOLOGY = "I'm sorry about that. Is there anything else I can try for you?"
GIVE_UP = ("I'm sorry, I couldn't find anything about {short}.", "Unfortunately I was unable to get {short}.",
           "I don't know {short}, sorry.")
TOOL_ERRORS = ('{"error": "upstream timeout"}', "Error: the service is unavailable, try again later",
               '{"status": "error", "message": "internal error"}', "HTTP 503 Service Unavailable")


def draw_slots(rng: random.Random) -> dict[str, str]:
    """The specifics of one request: an order, a product, a city, a street, and what the tools will report."""
    product, city = rng.choice(_PRODUCTS), rng.choice(_CITIES)
    return {"order": str(rng.randint(10000, 99999)), "product": product, "city": city, "street": rng.choice(_STREETS),
            "status": rng.choice(_STATUSES), "date": f"November {rng.randint(18, 30)}",
            "units": str(rng.randint(1, 40)),
            "refund_query": f"refund damaged {product}", "shipping_query": f"shipping cost {city}",
            "warranty_query": f"warranty {product}"}


def changed_slots(rng: random.Random, slots: dict[str, str], topic: Topic) -> str:
    """What a correction names instead: another order, product or city than the one the agent used."""
    if "{order}" in topic.short:
        return f"order {int(slots['order']) + rng.choice((-9, -1, 1, 10, 100))}"
    if "{city}" in topic.short and rng.random() < 0.5 or "{product}" not in topic.short:
        return f"the store in {rng.choice([c for c in _CITIES if c != slots['city']])}"
    return f"the {rng.choice([p for p in _PRODUCTS if p != slots['product']])}"


def tool_result(tool: str, slots: dict[str, str]) -> str:
    """A successful result of `tool` for these slots, as JSON text (what the client sends back)."""
    if tool == "lookup_order":
        value: dict[str, Any] = {"order_id": slots["order"], "status": slots["status"], "eta": slots["date"]}
    elif tool == "check_stock":
        value = {"product": slots["product"], "city": slots["city"], "units": int(slots["units"])}
    elif tool == "update_address":
        value = {"ok": True, "order_id": slots["order"], "address": slots["street"]}
    else:
        value = {"articles": [{"title": "Help centre", "snippet": "Returns, shipping and warranty terms."}]}
    return json.dumps(value)


def call_arguments(tool: str, names: tuple[str, ...], slots: dict[str, str]) -> str:
    """A call's arguments as JSON text (OpenAI's wire layout), named as the tool declares them."""
    keys = {"order": "order_id", "street": "address", "refund_query": "query", "shipping_query": "query",
            "warranty_query": "query"}
    return json.dumps({keys.get(n, n): slots[n] for n in names})


def follow_up(rng: random.Random, request: str) -> str:
    """A new request after an answer, as people start one: on its own, or after "Also, " or "And " (then its
    question word goes lower case, "Also, what ...", but never a name or "I")."""
    prefix = rng.choice(FOLLOW_UP_PREFIXES)
    first = request.split(" ", 1)[0]
    if prefix and first.lower() in _QUESTION_WORDS:
        request = first.lower() + request[len(first):]
    return prefix + request


def casual(rng: random.Random, text: str) -> str:
    """Users type carelessly: sometimes all lower case, sometimes without the final punctuation."""
    if rng.random() < 0.3:
        text = text.lower()
    if rng.random() < 0.3:
        text = text.rstrip(".?!")
    return text
