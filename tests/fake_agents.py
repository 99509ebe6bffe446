"""What the simulated users' stand-in agents (tests/feedback) share: the end of a conversation, with nothing owed,
nothing to end and ratings dropped; a closing user message gets one short reply."""

from __future__ import annotations

from agent_rl.simulated_users.outside_agent import Turn


class QuietEnding:
    def owe_result(self, messages, turn) -> None:
        pass

    def close(self, messages, turn, session, user_text) -> Turn:
        if user_text:
            messages.append({"role": "user", "content": user_text})
            messages.append({"role": "assistant", "content": "Anything else?"})
        return Turn(calls=1 if user_text else 0, ended=True)

    def end(self, episode_id) -> None:
        pass

    def rate(self, episode_id, verdict) -> None:
        pass
