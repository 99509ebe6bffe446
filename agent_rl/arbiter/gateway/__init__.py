"""The OpenAI-compatible gateway, split by concern: `service` (live episodes, their writes and the upstream calls),
`wire` (the request schema and errors), `sessions` (which episode a request continues), `shared` (live episodes
shared by every worker through the pool's `gateway_live` table), `messages` (the assistant messages it answers
with), `stream` (server-sent events) and `routes` (the endpoints)."""
