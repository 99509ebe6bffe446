"""The LLM judge: asks an OpenAI-compatible model for a structured verdict on an agent's answer.

The `Judge` interface, its `Verdict`, `is_idk` and the embedded default `DeterministicJudge` live on the ground floor
(agent_rl/environments/answers.py, where environments judge with them) and are importable here under their old names.
"""

from __future__ import annotations

import json

from agent_rl.chat_client import ChatClient, ChatEndpoint, ChatEndpointError, ChatReply, extract_json
from agent_rl.environments.answers import DeterministicJudge, Judge, Verdict, contains_answer, is_idk

__all__ = ["DeterministicJudge", "Judge", "JudgeError", "LLMJudge", "Verdict", "contains_answer", "is_idk"]


# --- LLM judge ---------------------------------------------------------------------------------

_ANY_SUBJECT = "what its tools can look up"  # an environment that names no subject of its own
_JUDGE_SYSTEM = (
    "You grade an agent's answers to questions about {subject}. Compare the candidate answer with the "
    "golden answer. Accept it when it states the same facts (formats may differ: dates, amounts, name "
    "order). Reject it when a fact is missing, contradicted or hedged among several candidates. If the "
    "golden answer is \"I don't know\", accept only answers that say they don't know. Reply with JSON "
    'only: {"accept": true or false, "reasoning": "one or two sentences"}.'
)


class JudgeError(RuntimeError):
    """The LLM judge's endpoint kept failing or never returned a usable verdict."""


class LLMJudge:
    """Asks an OpenAI-compatible model for {"accept": bool, "reasoning": str}, retrying bad replies."""

    def __init__(self, endpoint: ChatEndpoint, *, subject: str = _ANY_SUBJECT,
                 client: ChatClient | None = None) -> None:
        """`subject`: what the questions are about, in the judge's instructions (an environment's own words, e.g.
        "a user's email inbox" or "a customer's orders"); the rest of the instructions hold for any environment."""
        self.endpoint = endpoint
        self.system = _JUDGE_SYSTEM.replace("{subject}", subject.strip() or _ANY_SUBJECT)
        self._client = client or ChatClient(endpoint)

    def close(self) -> None:
        self._client.close()

    @staticmethod
    def _parse(reply: ChatReply) -> Verdict:
        data = extract_json(reply.content)
        if not isinstance(data, dict) or not isinstance(data.get("accept"), bool):
            raise ValueError(f'expected {{"accept": bool, "reasoning": str}}, got {reply.content[:120]!r}')
        return Verdict(data["accept"], str(data.get("reasoning", "")).strip() or "no reasoning given")

    def judge(self, question: str, golden: str, answer: str) -> Verdict:
        # Unanswerable questions need no model: the rule is mechanical and the model adds noise.
        if is_idk(golden):
            return DeterministicJudge().judge(question, golden, answer)
        prompt = json.dumps({"question": question, "golden_answer": golden, "candidate_answer": answer}, indent=1)
        messages = [{"role": "system", "content": self.system}, {"role": "user", "content": prompt}]
        try:
            return self._client.complete(messages, self._parse)
        except ChatEndpointError as exc:
            raise JudgeError(f"LLM judge gave no verdict: {exc}") from exc
