"""The turn budget of one episode, shared by serving (the runner), evaluation and GRPO: the rubric's turn efficiency
(1 - turns / max_turns) then means the same thing in training as in the evaluation that gates it. Likewise the
tokens one turn may generate: a turn cut there is a truncated call, a format error, and it must be cut at the same
place in serving, in evaluation and in GRPO's rollouts."""

# Assistant turns before an unanswered episode has run out: its tool rounds plus the answer's turn. Demo episodes
# take about 3 (docs/experiments.md); 8 leaves room to search again and read several emails.
DEFAULT_MAX_TURNS = 8

# Tokens one assistant turn may generate: three parallel `read_email` calls take ~140 (docs/experiments.md).
DEFAULT_TURN_TOKENS = 256
