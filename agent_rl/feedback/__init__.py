"""Feedback nobody gave explicitly: implicit signals of live episodes, and labels learned from the few ratings.

Gateway traffic trains only when a user rated it, and few do. `signals.py` reads what every recorded
conversation shows anyway (re-asks, corrections, abandonment, tool errors, thanks and complaints);
`labeler.py` learns from the rated episodes how those signals predict a rating, checks itself on rated episodes
it did not learn from, and labels the unrated ones it is confident about. The simulated users that measure all of
this (bench/labels.py, tests/feedback/, the gateway demo) live apart, in agent_rl/simulated_users/.

Nothing is imported here: reading signals must not pay for scikit-learn, which only the labeler needs.
"""
