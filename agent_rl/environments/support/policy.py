"""The store's written policy (part of the system prompt) and the rules the write tools enforce.

A rule returns None when the action is allowed, else the reason it is not: the tool shows that reason to the model
as its error, the task generator uses the same rules to know which requests must be refused, and the teacher reads
them to decide, so the three can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date

from agent_rl.environments.support.store import Order

RETURN_WINDOW_DAYS = 30

POLICY_TEXT = f"""Store policy:
- Confirm the customer's identity before anything else: find them by email, or by full name plus zip code. Only \
then read their orders or act on them, and only on their own orders.
- Only pending orders can be cancelled or have their shipping address changed.
- Delivered items can be returned within {RETURN_WINDOW_DAYS} days of delivery; the refund goes to the original \
payment method.
- Cancelled orders cannot be changed.
- If the customer or the order cannot be found, say so. If the policy does not allow a request, refuse and say why.
- Finish by calling reply with your message to the customer."""


def _immutable(order: Order) -> str | None:
    return f"order {order.id} is cancelled and cannot be changed" if order.status == "cancelled" else None


def _pending_only(order: Order, action: str) -> str | None:
    """The policy's one rule for cancelling and changing the address, `action` naming which in the reason: only a
    pending order (a cancelled one is never changed)."""
    if reason := _immutable(order):
        return reason
    if order.status != "pending":
        return f"order {order.id} is {order.status}; only pending orders can {action}"
    return None


def can_cancel(order: Order) -> str | None:
    return _pending_only(order, "be cancelled")


def can_change_address(order: Order) -> str | None:
    return _pending_only(order, "have their address changed")


def can_return(order: Order, item_ids: Iterable[str], today: date) -> str | None:
    if reason := _immutable(order):
        return reason
    if order.status != "delivered" or not order.delivered_on:
        return f"order {order.id} is {order.status}; only delivered items can be returned"
    days = (today - date.fromisoformat(order.delivered_on)).days
    if days > RETURN_WINDOW_DAYS:
        return (f"order {order.id} was delivered {days} days ago; items can only be returned within "
                f"{RETURN_WINDOW_DAYS} days of delivery")
    ids = list(item_ids)
    unknown = sorted(set(ids) - {i.product_id for i in order.items})
    if not ids:
        return "no items given to return"
    if unknown:
        return f"order {order.id} has no item(s) {', '.join(unknown)[:80]}"
    return None


def refund_amount(order: Order, item_ids: Iterable[str] | None = None) -> float:
    """What goes back to the original payment method: the whole order, or the returned items."""
    wanted = None if item_ids is None else set(item_ids)
    return round(sum(i.price * i.quantity for i in order.items if wanted is None or i.product_id in wanted), 2)
