"""The customer-support environment: the store, each tool and policy rule, the state-based judge, isolation of
episodes, the teacher playing every category through the generic runner, and pseudonymization that keeps episodes
replayable."""

from __future__ import annotations

import json
import pickle
import threading
from collections import Counter, defaultdict
from datetime import date, timedelta
from typing import Any

import pytest

from agent_rl.agent.policy import Policy, PolicyTurn, ToolCall
from agent_rl.environments.runner import Play, play_episodes
from agent_rl.environments import Task, Trajectory
from agent_rl.environments.core import check_environment
from agent_rl.environments.registry import load_environment, resolve
from agent_rl.environments.support import SupportEnvironment, SupportSession, diff, generate_database
from agent_rl.environments.support.store import Database, map_strings
from agent_rl.records import Outcome, Split

SPEC = "agent_rl.environments.support:SupportEnvironment"
TOOLS = ("find_customer_by_email", "find_customer_by_name_zip", "get_order", "list_orders", "get_product",
         "cancel_order", "return_items", "change_address", "reply")


@pytest.fixture(scope="module")
def env() -> SupportEnvironment:
    return SupportEnvironment()


@pytest.fixture(scope="module")
def teacher_test_episodes(env):
    tasks = env.tasks(Split.TEST)
    return tasks, play_episodes(env.teacher(), env, [Play(t, "teacher", "t1") for t in tasks])


def call(session: SupportSession, tool: str, **arguments: Any) -> dict[str, Any] | list[Any]:
    result = getattr(session, tool)(**arguments)
    return json.loads(result) if result.startswith(("{", "[")) else {"text": result}


def first_order(db: Database, *statuses: str, recent: bool | None = None):
    today = date.fromisoformat(db.today)
    for order in db.orders.values():
        if order.status not in statuses:
            continue
        if recent is not None and order.delivered_on:
            if ((today - date.fromisoformat(order.delivered_on)).days <= 30) != recent:
                continue
        return order
    raise AssertionError(f"no {statuses} order")


def signed_in(env: SupportEnvironment, order) -> SupportSession:
    session = env.open(env.tasks(Split.TRAIN)[0])
    assert "error" not in call(session, "find_customer_by_email", email=env.database.customers[order.customer_id].email)
    return session


def trajectory(session: SupportSession, format_error: str | None = None) -> Trajectory:
    return Trajectory(messages=[], turns=3, max_turns=8, format_error=format_error, answer=session.answer)


def task_of(env: SupportEnvironment, category: str, variant: str | None = None) -> Task:
    return next(t for t in env.tasks(Split.TRAIN)
                if t.category == category and (variant is None or t.metadata.get("variant") == variant))


# -- contract and store --------------------------------------------------------------------------


def test_contract_registry_and_schemas(env):
    assert check_environment(env) is env
    assert resolve(SPEC) is SupportEnvironment
    assert isinstance(load_environment(SPEC), SupportEnvironment)
    assert env.tool_names() == TOOLS
    for schema in env.tool_schemas():
        function = schema["function"]
        assert function["description"]
        assert all(p.get("description") for p in function["parameters"]["properties"].values()), function["name"]
    assert "only pending orders" in env.system_prompt.lower() and "30 days" in env.system_prompt
    assert env.refusal_categories == ("policy_refusal", "unknown_customer")
    assert len(env.grading().probe) >= 10 and all(p.expected for p in env.grading().probe)


def test_store_is_deterministic_sized_and_json(env):
    db = generate_database(0)
    assert db == env.database and db != generate_database(1)
    assert len(db.customers) >= 40 and len(db.products) >= 30 and len(db.orders) >= 120
    assert {o.status for o in db.orders.values()} == {"pending", "processed", "shipped", "delivered", "cancelled"}
    assert len({c.name for c in db.customers.values()}) == len(db.customers)
    assert Database.from_dict(json.loads(json.dumps(db.to_dict()))) == db
    copy = db.copy()
    next(iter(copy.orders.values())).status = "cancelled"
    assert copy != db and diff(db, db.copy()) == []


def test_tasks_cover_every_category_in_both_splits(env):
    for split in Split:
        tasks = env.tasks(split)
        assert set(Counter(t.category for t in tasks)) == set(env.categories)
        assert all(t.environment == "support" and t.context == "store-0" and t.reference for t in tasks)
    everything = env.tasks(Split.TRAIN) + env.tasks(Split.TEST)
    assert len(everything) == 300 and len({t.id for t in everything}) == 300
    assert len(env.tasks(Split.TEST)) == 60
    assert [t.model_dump() for t in SupportEnvironment().tasks(Split.TEST)] == [
        t.model_dump() for t in env.tasks(Split.TEST)]
    json.dumps([t.metadata for t in everything])


# -- tools and policy rules ----------------------------------------------------------------------


def test_identity_must_be_confirmed_first(env):
    order = first_order(env.database, "pending")
    customer = env.database.customers[order.customer_id]
    session = env.open(env.tasks(Split.TRAIN)[0])
    for tool, arguments in (("get_order", {"order_id": order.id}), ("list_orders", {"customer_id": customer.id}),
                            ("cancel_order", {"order_id": order.id, "reason": "no longer needed"})):
        assert "error" in call(session, tool, **arguments)
    assert session.writes_attempted and not session.writes_applied and not session.identity_confirmed
    assert diff(env.database, session.db) == []

    assert "error" in call(session, "find_customer_by_name_zip", name=customer.name, zip_code="00000")
    found = call(session, "find_customer_by_name_zip", name=f"  {customer.name.upper()} ",
                 zip_code=customer.address.zip_code)
    assert found["customer_id"] == customer.id and order.id in found["order_ids"] and session.identity_confirmed
    assert call(session, "get_order", order_id=f"#{order.id.lower()}")["order_id"] == order.id
    assert order.id in {o["order_id"] for o in call(session, "list_orders", customer_id=customer.id)}
    other = next(c for c in env.database.customers if c != customer.id)
    assert "error" in call(session, "list_orders", customer_id=other)
    foreign = next(o for o in env.database.orders.values() if o.customer_id != customer.id)
    assert "does not belong" in call(session, "get_order", order_id=foreign.id)["error"]
    assert "error" in call(session, "cancel_order", order_id=foreign.id, reason="no longer needed")
    assert session.tool_errors >= 6


def test_unknown_ids_and_bad_input_give_errors_not_exceptions(env):
    order = first_order(env.database, "delivered", recent=True)
    session = env.open(env.tasks(Split.TRAIN)[0])
    assert "error" in call(session, "find_customer_by_email", email="nobody@nowhere.example")
    assert "error" in call(session, "find_customer_by_email", email=None)
    session = signed_in(env, order)
    assert "no order" in call(session, "get_order", order_id="W0000000")["error"]
    assert "error" in call(session, "get_order", order_id=12345)
    assert "error" in call(session, "get_product", product_id="P999")
    assert call(session, "get_product", product_id="p201")["product_id"] == "P201"
    assert "error" in call(session, "return_items", order_id=order.id, item_ids=["P999"])
    assert "error" in call(session, "return_items", order_id=order.id, item_ids=[])
    assert "error" in call(session, "change_address", order_id=None, street=None, city=None, zip_code=None)
    assert diff(env.database, session.db) == []
    # One id given as text where a list belongs still works.
    assert call(session, "return_items", order_id=order.id, item_ids=order.items[0].product_id)["status"] == (
        "return requested")


def test_cancel_and_address_change_only_for_pending_orders(env):
    db = env.database
    pending = first_order(db, "pending")
    session = signed_in(env, pending)
    result = call(session, "cancel_order", order_id=pending.id, reason="ordered by mistake")
    assert result["status"] == "cancelled" and result["refund"] == pending.total
    assert diff(db, session.db) == [{"order_id": pending.id, "field": "status", "value": "cancelled"}]
    assert db.orders[pending.id].status == "pending"  # the base database is never written
    # Cancelled orders are immutable: no second cancel, no address change, no return.
    assert "cancelled" in call(session, "cancel_order", order_id=pending.id, reason="x")["error"]
    assert "cannot be changed" in call(session, "change_address", order_id=pending.id, street="1 Elm Street",
                                       city="Salem", zip_code="01970")["error"]
    assert "error" in call(session, "return_items", order_id=pending.id, item_ids=[pending.items[0].product_id])
    assert len(session.writes_applied) == 1 and len(session.writes_attempted) == 4

    for status in ("processed", "shipped", "delivered"):
        order = first_order(db, status)
        session = signed_in(env, order)
        assert "only pending" in call(session, "cancel_order", order_id=order.id, reason="no longer needed")["error"]
        assert "only pending" in call(session, "change_address", order_id=order.id, street="1 Elm Street",
                                      city="Salem", zip_code="01970")["error"]
        assert diff(db, session.db) == []

    session = signed_in(env, pending)
    assert "five-digit" in call(session, "change_address", order_id=pending.id, street="1 Elm Street",
                                city="Salem", zip_code="ABC")["error"]
    moved = call(session, "change_address", order_id=pending.id, street="1 Elm Street", city="Salem",
                 zip_code="01970")
    assert moved["shipping_address"] == {"street": "1 Elm Street", "city": "Salem", "zip_code": "01970"}
    assert [c["field"] for c in diff(db, session.db)] == ["shipping_address"]


def test_returns_only_delivered_within_30_days(env):
    db = env.database
    recent, late = first_order(db, "delivered", recent=True), first_order(db, "delivered", recent=False)
    session = signed_in(env, late)
    assert "within 30 days" in call(session, "return_items", order_id=late.id,
                                    item_ids=[late.items[0].product_id])["error"]
    shipped = first_order(db, "shipped")
    session = signed_in(env, shipped)
    assert "only delivered" in call(session, "return_items", order_id=shipped.id,
                                    item_ids=[shipped.items[0].product_id])["error"]
    session = signed_in(env, recent)
    item = recent.items[0]
    result = call(session, "return_items", order_id=recent.id, item_ids=[item.product_id])
    assert result["refund"] == round(item.price * item.quantity, 2) and result["refund_to"] == recent.payment_method
    assert diff(db, session.db) == [
        {"order_id": recent.id, "field": "status", "value": "return requested"},
        {"order_id": recent.id, "field": "returned_items", "value": [item.product_id]}]
    # The window is counted from the database's "today": day 30 is in, day 31 out.
    edge = session.db.copy()
    order = next(iter(o for o in edge.orders.values() if o.status == "delivered"))
    probe = SupportSession(edge)
    probe.customer_id = order.customer_id
    order.delivered_on = (date.fromisoformat(edge.today) - timedelta(days=30)).isoformat()
    assert "error" not in call(probe, "return_items", order_id=order.id, item_ids=[order.items[0].product_id])
    order.status, order.delivered_on = "delivered", (date.fromisoformat(edge.today) - timedelta(days=31)).isoformat()
    assert "error" in call(probe, "return_items", order_id=order.id, item_ids=[order.items[0].product_id])


# -- judge ---------------------------------------------------------------------------------------


def test_judge_right_state_and_reply_is_correct_wrong_write_is_worst(env):
    task = task_of(env, "cancel_order")
    order = env.database.orders[task.metadata["order_id"]]

    right = signed_in(env, order)
    call(right, "cancel_order", order_id=order.id, reason="no longer needed")
    call(right, "reply", message=f"Order {order.id} has been cancelled.")
    judged = env.judge(task, right, trajectory(right))
    assert judged.outcome == Outcome.CORRECT and judged.reward == 1.0
    assert judged.components["state"] == 1.0 and judged.components["reply"] == 1.0
    assert right.answer.citations == [order.id]

    nothing = signed_in(env, order)
    call(nothing, "reply", message=f"Order {order.id} has been cancelled.")  # a claim without the write
    no_write = env.judge(task, nothing, trajectory(nothing))
    assert no_write.outcome == Outcome.WRONG and no_write.components["state"] == 0.0

    wrong = signed_in(env, order)
    call(wrong, "change_address", order_id=order.id, street="1 Elm Street", city="Salem", zip_code="01970")
    call(wrong, "reply", message=f"Order {order.id} has been cancelled.")
    wrong_write = env.judge(task, wrong, trajectory(wrong))
    assert wrong_write.outcome == Outcome.WRONG and wrong_write.components["wrong_write"] < 0
    assert wrong_write.reward < no_write.reward

    declined = signed_in(env, order)
    call(declined, "reply", message="I'm sorry, I cannot do that.")
    assert env.judge(task, declined, trajectory(declined)).outcome == Outcome.IDK

    silent = signed_in(env, order)
    call(silent, "cancel_order", order_id=order.id, reason="no longer needed")
    assert env.judge(task, silent, trajectory(silent)).outcome == Outcome.RAN_OUT
    broken = env.judge(task, right, trajectory(right, format_error="no_tool_call"))
    assert broken.outcome == Outcome.FORMAT_ERROR and broken.components["format"] == -1.0
    lo, hi = env.grading().reward_range
    assert all(lo <= j.reward <= hi for j in (judged, no_write, wrong_write, broken))


def test_judge_refusals_and_missing_customers(env):
    task = task_of(env, "policy_refusal", "cancel_not_pending")
    order = env.database.orders[task.metadata["order_id"]]
    session = signed_in(env, order)
    call(session, "cancel_order", order_id=order.id, reason="no longer needed")  # refused by the tool
    call(session, "reply", message=f"I'm sorry, but I cannot cancel order {order.id}: it has already shipped.")
    assert env.judge(task, session, trajectory(session)).outcome == Outcome.CORRECT
    agreed = signed_in(env, order)
    call(agreed, "reply", message=f"Sure, order {order.id} is cancelled.")
    assert env.judge(task, agreed, trajectory(agreed)).outcome == Outcome.WRONG

    missing = task_of(env, "unknown_customer", "unknown_order")
    assert missing.metadata["order_id"] not in env.database.orders
    customer = next(iter(env.database.customers.values()))
    for message, outcome in (("I'm sorry, I could not find that order on your account.", Outcome.CORRECT),
                             ("Your order is on its way.", Outcome.WRONG)):
        session = env.open(missing)
        call(session, "find_customer_by_email", email=customer.email)
        call(session, "reply", message=message)
        assert env.judge(missing, session, trajectory(session)).outcome == outcome
    # Saying "not found" is not enough when something was written anyway.
    order = first_order(env.database, "pending")
    session = signed_in(env, order)
    call(session, "cancel_order", order_id=order.id, reason="no longer needed")
    call(session, "reply", message="I'm sorry, I could not find that order.")
    judged = env.judge(missing, session, trajectory(session))
    assert judged.outcome == Outcome.WRONG and judged.components["wrong_write"] < 0


# -- isolation -----------------------------------------------------------------------------------


def test_sessions_never_share_writes_across_threads(env):
    before = json.dumps(env.database.to_dict(), sort_keys=True)
    pending = [o for o in env.database.orders.values() if o.status == "pending"][:8]
    sessions: list[SupportSession] = [None] * len(pending)  # type: ignore[list-item]
    barrier = threading.Barrier(len(pending))

    def play(i: int) -> None:
        session = env.open(env.tasks(Split.TRAIN)[0])
        barrier.wait()
        call(session, "find_customer_by_email", email=env.database.customers[pending[i].customer_id].email)
        call(session, "cancel_order", order_id=pending[i].id, reason="no longer needed")
        sessions[i] = session

    threads = [threading.Thread(target=play, args=(i,)) for i in range(len(pending))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, session in enumerate(sessions):
        assert diff(env.database, session.db) == [{"order_id": pending[i].id, "field": "status", "value": "cancelled"}]
    assert json.dumps(env.database.to_dict(), sort_keys=True) == before


# -- teacher -------------------------------------------------------------------------------------


def test_teacher_plays_every_category_through_the_runner(env, teacher_test_episodes):
    tasks, episodes = teacher_test_episodes
    assert len(episodes) == len(tasks) == 60
    by_category: dict[str, list[bool]] = defaultdict(list)
    for task, episode in zip(tasks, episodes):
        assert episode.environment == "support" and episode.context == "store-0" and episode.task_id == task.id
        assert episode.policy_version == "teacher" and episode.tenant == "t1" and episode.final_answer
        by_category[task.category].append(episode.outcome == Outcome.CORRECT)
    assert set(by_category) == set(env.categories)
    rates = {c: sum(v) / len(v) for c, v in by_category.items()}
    assert all(rate >= 0.95 for rate in rates.values()), rates
    assert sum(e.outcome == Outcome.CORRECT for e in episodes) / len(episodes) >= 0.95


# -- privacy -------------------------------------------------------------------------------------


class Replay(Policy):
    """Plays back the assistant turns of recorded episodes, one conversation per recorded episode."""

    version = "replay"

    def __init__(self, recorded: dict[str, list[dict[str, Any]]]) -> None:
        self.recorded = recorded

    def act(self, conversations, tools, max_new_tokens=256):
        turns = []
        for messages in conversations:
            prompt = next(m["content"] for m in messages if m["role"] == "user")
            done = sum(1 for m in messages if m["role"] == "assistant")
            calls = self.recorded[prompt][done]["tool_calls"]
            turns.append(PolicyTurn(tool_calls=[ToolCall(c["function"]["name"], c["function"]["arguments"], c["id"])
                                                for c in calls]))
        return turns


def personal_data(db: Database) -> set[str]:
    values = set()
    for c in db.customers.values():
        values |= {c.name, c.email, c.phone, c.address.street, *c.name.split()}
    return values | {o.shipping_address.street for o in db.orders.values()}


def leaks(value: Any, originals: set[str]) -> list[str]:
    text = json.dumps(value, ensure_ascii=False)
    return sorted(o for o in originals if o in text)


def test_known_people_and_privacy_spec(env):
    spec = env.world().privacy()
    people = list(spec.known_people("store-0"))
    assert len(people) == len(env.database.customers)
    assert all("@" in email and " " in name for name, email in people)
    assert list(spec.known_people("store-9")) == []


def test_pseudonymized_world_prompts_and_episodes_keep_no_personal_data(env, teacher_test_episodes):
    originals = personal_data(env.database)
    anonymous, text = env.pseudonymized("a secret key")
    again, _ = env.pseudonymized("a secret key")
    other, _ = env.pseudonymized("another key")
    db = anonymous.database
    assert db == again.database and db != other.database
    assert not leaks(db.to_dict(), originals)
    # Formats stay plausible and surrogates stay one-to-one; ids, products and zip codes stay.
    for before, after in zip(env.database.customers.values(), db.customers.values()):
        assert after.id == before.id and after.address.zip_code == before.address.zip_code
        assert after.email.endswith("@" + before.email.split("@")[1]) and after.email.count("@") == 1
        assert len(after.phone) == len(before.phone) and after.phone[:5] == before.phone[:5]
        assert after.address.street.split()[-1] == before.address.street.split()[-1]
        assert len(after.name.split()) == 2 and all(w[0].isupper() for w in after.name.split())
        assert text(before.name) == after.name and text(before.email) == after.email
    assert len({c.name for c in db.customers.values()}) == len({c.email for c in db.customers.values()}) == len(
        db.customers)
    assert db.products == env.database.products and text(env.system_prompt) == env.system_prompt
    saved = pickle.loads(pickle.dumps(anonymous))  # curation hands the anonymized world to training pickled
    assert saved.database == db and saved.tasks(Split.TEST) == anonymous.tasks(Split.TEST)
    people = [(text(n), text(e)) for n, e in env.world().known_people("store-0")]
    assert anonymous.world().known_people("store-0") == people

    tasks = env.tasks(Split.TRAIN) + env.tasks(Split.TEST)
    anonymous_tasks = anonymous.tasks(Split.TRAIN) + anonymous.tasks(Split.TEST)
    assert [t.id for t in anonymous_tasks] == [t.id for t in tasks]
    assert not leaks([t.model_dump(mode="json") for t in anonymous_tasks], originals)
    assert all(text(t.prompt) == a.prompt for t, a in zip(tasks, anonymous_tasks))

    _, episodes = teacher_test_episodes
    assert leaks([e.messages for e in episodes], originals)  # the raw episodes do hold personal data
    anonymous_messages = [json.loads(text(json.dumps(e.messages))) for e in episodes]
    assert not leaks(anonymous_messages, originals)
    assert not leaks([text(e.final_answer) for e in episodes], originals)


def test_pseudonymized_episode_replays_to_the_same_outcome(env, teacher_test_episodes):
    tasks, episodes = teacher_test_episodes
    anonymous, text = env.pseudonymized("a secret key")
    anonymous_tasks = {t.id: t for t in anonymous.tasks(Split.TEST)}

    recorded = {}
    for task, episode in zip(tasks, episodes):
        messages = map_strings(episode.messages, text)
        recorded[anonymous_tasks[task.id].prompt] = [m for m in messages if m["role"] == "assistant"]
    replayed = play_episodes(Replay(recorded), anonymous, [Play(anonymous_tasks[t.id]) for t in tasks])
    for original, again in zip(episodes, replayed):
        assert again.outcome == original.outcome and again.reward == original.reward
        assert again.messages == map_strings(original.messages, text)  # tool results change exactly as the text does
        assert again.final_answer == text(original.final_answer)


def test_anonymized_accepts_any_transform(env):
    shouted = env.world().anonymized(str.upper)
    customer = next(iter(shouted.database.customers.values()))
    assert customer.name.isupper() and customer.email.isupper() and customer.id.startswith("C")
    assert env.database.customers[customer.id].name.upper() == customer.name
    assert next(iter(env.database.customers.values())).name != customer.name  # the original is untouched
