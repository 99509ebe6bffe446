"""The turn budget of one episode, shared by serving (the runner), evaluation and GRPO: the rubric's turn efficiency
(1 - turns / max_turns) then means the same thing in training as in the evaluation that gates it."""

# Assistant turns before an unanswered episode has run out: its tool rounds plus the answer's turn. Demo episodes
# take about 3 (docs/experiments.md); 8 leaves room to search again and read several emails.
DEFAULT_MAX_TURNS = 8
