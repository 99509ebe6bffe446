"""The arbiter's serving figures in Prometheus text format (`GET /metrics`), next to the JSON of `/healthz`.

Operators watch memory and queues with whatever scrapes Prometheus; the figures are this worker process's:
versions loaded, the shared bases' and adapters' memory, the turn caches' memory against their budget, resident
memory and the requests waiting for a batch.
"""

from __future__ import annotations

from typing import Any

PREFIX = "agent_rl_arbiter"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(stats: dict[str, Any]) -> str:
    """`stats` as returned by ArbiterService.serving_metrics, one gauge per figure (with HELP and TYPE lines)."""
    lines: list[str] = []

    def gauge(name: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# HELP {PREFIX}_{name} {help_text}")
        lines.append(f"# TYPE {PREFIX}_{name} gauge")
        for labels, value in samples:
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{PREFIX}_{name}{{{label_text}}} {value:g}" if label_text else f"{PREFIX}_{name} {value:g}")

    gauge("policies_loaded", "routed specs with a loaded policy", [({}, len(stats.get("policies_loaded", [])))])
    gauge("version_loaded", "a version served as an adapter on a shared base (1 per version)",
          [({"base": base["base"], "version": version}, 1) for base in stats.get("bases", [])
           for version in base["versions"]])
    gauge("base_bytes", "weights of the shared base models", [({"base": b["base"]}, b["base_bytes"])
                                                              for b in stats.get("bases", [])])
    gauge("adapter_bytes", "adapter weights loaded on the shared bases", [({}, stats.get("adapter_bytes", 0))])
    gauge("cache_bytes", "earlier turns' attention caches of all versions", [({}, stats.get("cache_bytes", 0))])
    gauge("cache_budget_bytes", "the byte budget of those caches", [({}, stats.get("cache_budget_bytes", 0) or 0)])
    gauge("resident_bytes", "resident memory of this worker process", [({}, stats.get("resident_bytes", 0))])
    gauge("peak_resident_bytes", "peak resident memory of this worker process",
          [({}, stats.get("peak_resident_bytes", 0))])
    engines = stats.get("engines", {})
    gauge("engine_serving", "1 while a version's engine serves, 0 while it is down (died, resting, restart failed)",
          [({"version": v}, 1 if e.get("state") == "serving" else 0) for v, e in engines.items()])
    gauge("engine_restarts", "restarts in a row of a version's engine", [({"version": v}, e.get("restarts", 0))
                                                                         for v, e in engines.items()])
    queue = stats.get("queue", {})
    gauge("queue_waiting", "requests waiting for a batch", [({}, queue.get("waiting", 0))])
    gauge("batches_running", "batches being played", [({}, queue.get("running_batches", 0))])
    return "\n".join(lines) + "\n"
