"""One support episode's tools, on the episode's own copy of the store database.

Every public method is a tool. Tools answer with compact JSON; bad input and requests the policy forbids come back
as {"error": ...} (never an exception), and a refused write changes nothing. The session also records what the
episode did (identity confirmed, writes attempted and applied, tool errors) for judges and reports.
"""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Any

from agent_rl.environments.core import FinalAnswer
from agent_rl.environments.support.policy import can_cancel, can_change_address, can_return, refund_amount
from agent_rl.environments.support.store import RETURN_REQUESTED, Address, Customer, Database, Order, address_dict

ORDER_ID = re.compile(r"\bW\d{7}\b")
MAX_SHOWN = 40


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _text(value: Any) -> str:
    """Any argument as stripped text: a model may send numbers or nulls where strings belong."""
    return "" if value is None else str(value).strip()


def _order_id(value: Any) -> str:
    return _text(value).lstrip("#").upper()


def _ids(value: Any) -> list[str]:
    """A list of ids from a list, or from one id or comma-separated text sent where a list belongs."""
    items = value if isinstance(value, (list, tuple)) else _text(value).split(",")
    return [_text(i).upper() for i in items if _text(i)]


def _customer_json(customer: Customer, orders: list[Order]) -> dict[str, Any]:
    return {"customer_id": customer.id, "name": customer.name, "email": customer.email, "phone": customer.phone,
            "address": address_dict(customer.address), "payment_methods": list(customer.payment_methods),
            "order_ids": sorted(o.id for o in orders)}


def _order_json(order: Order) -> dict[str, Any]:
    out: dict[str, Any] = {
        "order_id": order.id, "customer_id": order.customer_id, "status": order.status,
        "items": [{"item_id": i.product_id, "name": i.name, "quantity": i.quantity, "price": i.price}
                  | ({"variant": i.variant} if i.variant else {}) for i in order.items],
        "total": order.total, "shipping_address": address_dict(order.shipping_address),
        "payment_method": order.payment_method, "placed_on": order.placed_on,
    }
    optional = {"tracking_number": order.tracking_number, "delivered_on": order.delivered_on,
                "returned_items": list(order.returned_items)}
    return out | {k: v for k, v in optional.items() if v}


class SupportSession:
    """The tools of one customer-support episode. Every public method is a tool the model can call."""

    def __init__(self, database: Database) -> None:
        self.db = database
        self.today = date.fromisoformat(database.today)
        self.customer_id: str | None = None  # the customer whose identity is confirmed
        self.answer: FinalAnswer | None = None
        self.writes_attempted: list[dict[str, Any]] = []
        self.writes_applied: list[dict[str, Any]] = []
        self.tool_errors = 0

    # -- helpers (not tools) ---------------------------------------------------------------------

    @property
    def identity_confirmed(self) -> bool:
        return self.customer_id is not None

    def _error(self, message: str) -> str:
        self.tool_errors += 1
        return _json({"error": message})

    def _confirm(self, customer: Customer | None, missing: str) -> str:
        if customer is None:
            return self._error(missing)
        self.customer_id = customer.id
        return _json(_customer_json(customer, self.db.orders_of(customer.id)))

    def _own_order(self, order_id: Any) -> Order | str:
        """The confirmed customer's order, or the error to show."""
        if self.customer_id is None:
            return self._error("confirm the customer's identity first (find_customer_by_email or "
                               "find_customer_by_name_zip)")
        key = _order_id(order_id)
        order = self.db.orders.get(key)
        if order is None:
            return self._error(f"no order {key[:MAX_SHOWN]!r}")
        if order.customer_id != self.customer_id:
            return self._error(f"order {key} does not belong to the confirmed customer")
        return order

    def _write(self, tool: str, order_id: Any, **arguments: Any) -> Order | str:
        """The order a write may change, or the error; every attempt is recorded."""
        self.writes_attempted.append({"tool": tool, "order_id": _order_id(order_id)} | arguments)
        return self._own_order(order_id)

    def _applied(self, tool: str, order: Order, result: dict[str, Any]) -> str:
        self.writes_applied.append({"tool": tool, "order_id": order.id})
        return _json(result)

    # -- tools -----------------------------------------------------------------------------------

    def find_customer_by_email(self, email: str) -> str:
        """Find a customer by email address; this confirms their identity.

        Args:
            email: The customer's email address.
        """
        wanted = _text(email).lower()
        found = next((c for c in self.db.customers.values() if c.email.lower() == wanted), None)
        return self._confirm(found, f"no customer with email {wanted[:MAX_SHOWN]!r}")

    def find_customer_by_name_zip(self, name: str, zip_code: str) -> str:
        """Find a customer by full name and the zip code of their address; this confirms their identity.

        Args:
            name: The customer's first and last name.
            zip_code: The zip code of the customer's address.
        """
        wanted, zip_wanted = " ".join(_text(name).lower().split()), _text(zip_code)
        found = next((c for c in self.db.customers.values()
                      if c.name.lower() == wanted and c.address.zip_code == zip_wanted), None)
        return self._confirm(found, "no customer with that name and zip code")

    def get_order(self, order_id: str) -> str:
        """Show one of the confirmed customer's orders: status, items, address, tracking.

        Args:
            order_id: The order id, like W1234567.
        """
        order = self._own_order(order_id)
        return order if isinstance(order, str) else _json(_order_json(order))

    def list_orders(self, customer_id: str) -> str:
        """List the confirmed customer's orders with their status and total.

        Args:
            customer_id: The customer id from find_customer_by_email or find_customer_by_name_zip.
        """
        key = _text(customer_id).upper()
        if self.customer_id is None or key != self.customer_id:
            return self._error("confirm this customer's identity first")
        return _json([{"order_id": o.id, "status": o.status, "total": o.total, "placed_on": o.placed_on}
                      for o in sorted(self.db.orders_of(key), key=lambda o: o.id)])

    def get_product(self, product_id: str) -> str:
        """Show a product of the catalog: name, price and variants.

        Args:
            product_id: The product id, like P201 (an order item's item_id).
        """
        product = self.db.products.get(_text(product_id).upper())
        if product is None:
            return self._error(f"no product {_text(product_id)[:MAX_SHOWN]!r}")
        return _json({"product_id": product.id, "name": product.name, "price": product.price,
                      "variants": list(product.variants)})

    def cancel_order(self, order_id: str, reason: str) -> str:
        """Cancel a pending order; the refund goes to the original payment method.

        Args:
            order_id: The order id, like W1234567.
            reason: Why the customer cancels, e.g. "no longer needed" or "ordered by mistake".
        """
        order = self._write("cancel_order", order_id, reason=_text(reason)[:MAX_SHOWN])
        if isinstance(order, str):
            return order
        if refused := can_cancel(order):
            return self._error(refused)
        if not _text(reason):
            return self._error("give the reason for the cancellation")
        order.status, order.cancel_reason = "cancelled", _text(reason)
        return self._applied("cancel_order", order, {"order_id": order.id, "status": order.status,
                                                     "refund": refund_amount(order),
                                                     "refund_to": order.payment_method})

    def return_items(self, order_id: str, item_ids: list[str]) -> str:
        """Request the return of delivered items; the refund goes to the original payment method.

        Args:
            order_id: The order id, like W1234567.
            item_ids: The item_id of each item to return, as get_order lists them.
        """
        ids = _ids(item_ids)
        order = self._write("return_items", order_id, item_ids=ids)
        if isinstance(order, str):
            return order
        if refused := can_return(order, ids, self.today):
            return self._error(refused)
        order.status, order.returned_items = RETURN_REQUESTED, tuple(sorted(set(ids)))
        return self._applied("return_items", order, {"order_id": order.id, "status": order.status,
                                                     "returned_items": list(order.returned_items),
                                                     "refund": refund_amount(order, ids),
                                                     "refund_to": order.payment_method})

    def change_address(self, order_id: str, street: str, city: str, zip_code: str) -> str:
        """Change the shipping address of a pending order.

        Args:
            order_id: The order id, like W1234567.
            street: House number and street of the new address.
            city: City of the new address.
            zip_code: Zip code of the new address (five digits).
        """
        new = Address(_text(street), _text(city), _text(zip_code))
        order = self._write("change_address", order_id, **address_dict(new))
        if isinstance(order, str):
            return order
        if refused := can_change_address(order):
            return self._error(refused)
        if not (new.street and new.city and re.fullmatch(r"\d{5}", new.zip_code)):
            return self._error("give a street, a city and a five-digit zip code")
        order.shipping_address = new
        return self._applied("change_address", order, {"order_id": order.id,
                                                       "shipping_address": address_dict(new)})

    def reply(self, message: str) -> str:
        """Send the final reply to the customer; this ends the conversation.

        Args:
            message: The message to the customer: what was done, or why it could not be done.
        """
        if self.answer is not None:
            return self._error("the reply was already sent")
        text = _text(message)
        self.answer = FinalAnswer(text, sorted(set(ORDER_ID.findall(text))))
        return "Reply sent."
