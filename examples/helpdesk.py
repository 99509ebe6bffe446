"""A help desk small enough for a tiny model to learn: the fast profile's world for the loop's promotion path.

A customer writes about one of a few kinds of request; the agent looks up the policy for that kind and replies
with what the policy says. The answer depends on the kind of request only, never on copying a value out of a
long context, which is what a tiny model trained from scratch cannot learn in minutes (docs/experiments.md,
2026-11-29). Requests outside the desk's policies should get "I don't know". Use it as
`--env examples.helpdesk:HelpdeskEnvironment`.
"""

from __future__ import annotations

import hashlib
import re

from agent_rl.environments import Environment, FinalAnswer, Judgement, Task, Trajectory, World
from agent_rl.environments.policy import Policy, PolicyTurn, ToolCall
from agent_rl.records import Outcome, Split

# topic -> (what the policy says, the words a right reply must hold)
POLICIES = {
    "refund": ("Refunds go back to the card within 14 days.", "14 days"),
    "delivery": ("Orders ship within 3 working days.", "3 working days"),
    "password": ("Use the reset link on the sign-in page.", "reset link"),
    "invoice": ("Invoices are under Billing in your account.", "Billing"),
    "cancel": ("Orders can be cancelled under My orders until they ship.", "My orders"),
}
ASKS = {
    "refund": ("When do I get my money back for the {p}?", "I returned the {p}, where is my refund?",
               "How long does a refund for a {p} take?", "Can I have a refund on my {p}?"),
    "delivery": ("When will my {p} arrive?", "How long does shipping take for a {p}?",
                 "Has my {p} been sent yet?", "How fast do you deliver a {p}?"),
    "password": ("I cannot sign in to order a {p}, I forgot my password.", "How do I reset my password?",
                 "My password does not work when I buy a {p}.", "I am locked out of my account."),
    "invoice": ("Where is the invoice for my {p}?", "I need a receipt for the {p} I bought.",
                "Can you send the bill for my {p}?", "Where do I find my invoices?"),
    "cancel": ("I want to cancel my order of a {p}.", "Please stop the order for the {p}.",
               "How do I cancel the {p} I ordered?", "I changed my mind about the {p}, cancel it."),
    "out_of_scope": ("What is the weather like today?", "Can you recommend a good film?",
                     "Is the {p} made in Europe?", "What colour is the {p} in the photo?"),
}
PRODUCTS = ("lamp", "kettle", "chair", "desk", "blender", "toaster", "jacket", "backpack", "monitor", "keyboard",
            "mouse", "printer", "camera", "tent", "bicycle", "helmet", "watch", "speaker", "sofa", "mirror")
IDK = "I don't know"


def _held_out(key: str) -> bool:
    """A fixed fifth of the tasks, by a hash of the task's text: the same split on every machine."""
    return hashlib.sha256(key.encode()).digest()[0] % 5 == 0


class HelpdeskSession:
    """One episode's tools. Every public method is a tool the model can call."""

    def __init__(self) -> None:
        self.answer: FinalAnswer | None = None
        self.looked_up: list[str] = []

    def lookup_policy(self, topic: str) -> str:
        """Read the desk's policy on one kind of request.

        Args:
            topic: One of refund, delivery, password, invoice, cancel.
        """
        topic = str(topic).strip().lower()
        self.looked_up.append(topic)
        if topic not in POLICIES:
            return f"No policy for {topic[:20]!r}. Topics: {', '.join(POLICIES)}."
        return POLICIES[topic][0]

    def reply(self, answer: str, topic: str) -> str:
        """Give the final answer to the customer; this ends the task.

        Args:
            answer: The answer, or "I don't know" if no policy covers the request.
            topic: The topic of the policy the answer comes from (empty if none).
        """
        self.answer = FinalAnswer(str(answer).strip(), [str(topic).strip().lower()] if topic else [])
        return "Reply sent."


class HelpdeskTeacher(Policy):
    """Knows which words mean which kind of request: the rule-based agent the desk runs before any training."""

    version = "teacher"

    def act(self, conversations, tools, max_new_tokens=256):
        return [self._turn(messages) for messages in conversations]

    def _turn(self, messages):
        question = next(m["content"] for m in messages if m["role"] == "user")
        topic = topic_of(question)
        if topic is None:
            return PolicyTurn(tool_calls=[ToolCall("reply", {"answer": IDK, "topic": ""})])
        if not any(m["role"] == "tool" for m in messages):
            return PolicyTurn(tool_calls=[ToolCall("lookup_policy", {"topic": topic})])
        return PolicyTurn(tool_calls=[ToolCall("reply", {"answer": POLICIES[topic][0], "topic": topic})])


def topic_of(question: str) -> str | None:
    """The kind of request a question is, by the templates it was written from (None: out of scope)."""
    for topic, asks in ASKS.items():
        for ask in asks:
            pattern = re.escape(ask).replace(re.escape("{p}"), r"\w+")
            if re.fullmatch(pattern, question):
                return None if topic == "out_of_scope" else topic
    return None


class HelpdeskWorld(World):
    """The help desk comes with the environment; the world adds the teacher that plays production first."""

    def teacher(self, **options: object) -> Policy:
        return HelpdeskTeacher()


class HelpdeskEnvironment(Environment):
    name = "helpdesk"
    categories = tuple(ASKS)
    system_prompt = ("You answer customers of an online shop. Look up the policy for their request, then call reply "
                     "with what it says and its topic. If no policy covers the request, answer \"I don't know\".")

    def tasks(self, split: Split) -> list[Task]:
        tasks = []
        for topic, asks in ASKS.items():
            for a, ask in enumerate(asks):
                products = PRODUCTS if "{p}" in ask else ("",)
                for product in products:
                    prompt = ask.format(p=product)
                    held_out = _held_out(prompt)
                    if (split == Split.TEST) != held_out:
                        continue
                    tasks.append(Task(
                        id=f"hd-{topic}-{a}-{product or 'any'}", environment=self.name, context="helpdesk",
                        prompt=prompt, reference=IDK if topic == "out_of_scope" else POLICIES[topic][1],
                        category=topic, split=split, metadata={"topic": "" if topic == "out_of_scope" else topic}))
        return tasks

    def world(self) -> HelpdeskWorld:
        return HelpdeskWorld(self)

    def open(self, task: Task) -> HelpdeskSession:
        return HelpdeskSession()

    def session_type(self) -> type:
        return HelpdeskSession

    def final_answer(self, session: HelpdeskSession) -> FinalAnswer | None:
        return session.answer

    def judge(self, task: Task, session: HelpdeskSession, trajectory: Trajectory) -> Judgement:
        if trajectory.format_error:
            return Judgement(Outcome.FORMAT_ERROR, -1.0, {"format": -1.0})
        answer = trajectory.answer
        if answer is None:
            return Judgement(Outcome.RAN_OUT, 0.0, {})
        says_idk = "don't know" in answer.text.lower()
        topic = task.metadata.get("topic", "")
        if task.category == "out_of_scope":
            outcome = Outcome.CORRECT if says_idk else Outcome.WRONG
        elif says_idk:
            outcome = Outcome.IDK
        else:
            right = (task.reference or "").lower() in answer.text.lower() and topic in session.looked_up
            outcome = Outcome.CORRECT if right else Outcome.WRONG
        cited = float(answer.citations == ([topic] if topic else []))
        reward = {Outcome.CORRECT: 1.0, Outcome.IDK: 0.0, Outcome.WRONG: -1.0}[outcome] + 0.2 * cited
        return Judgement(outcome, reward, {"answer": reward - 0.2 * cited, "citations": 0.2 * cited})
