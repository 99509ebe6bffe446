"""The comparison behind `evaluation_report`: candidate vs champion vs base on the same held-out tasks, which
trained model is the candidate, and the table and chart people look at (the gates are in gates.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent_rl.evaluate.metrics import EvalMetrics

TABLE_COLUMNS = ("accuracy", "source_accuracy", "hallucination_rate", "idk_rate", "valid_tool_call_rate",
                 "avg_turns", "avg_tokens", "latency_ms_p50", "cost_per_1k_usd")


def relative_improvement(candidate: float, champion: float) -> float:
    """(candidate − champion) / champion; a champion at 0 makes any gain infinite and no gain 0."""
    if champion <= 0:
        return float("inf") if candidate > 0 else 0.0
    return (candidate - champion) / champion


@dataclass
class CandidateChoice:
    """Which trained model ships, and why (SFT alone or SFT + GRPO)."""

    name: str
    reason: str


def choose_candidate(sft: EvalMetrics, grpo: EvalMetrics | None, disqualified: str | None = None,
                     skipped: str | None = None) -> CandidateChoice:
    """SFT + GRPO ships only when it is not worse than SFT alone on the same held-out tasks: accuracy (the primary
    metric) at least SFT's and the failures users feel (wrong + format errors + ran out) at most SFT's. Otherwise
    SFT alone ships, so GRPO can never make the registered model worse than the warmup it started from. GRPO
    that was `disqualified` (its rollouts hacked the reward) is not a candidate at all; GRPO that was `skipped`
    (nothing to roll out in) neither."""
    if skipped:
        return CandidateChoice("sft", f"SFT alone ships: {skipped}")
    if disqualified or grpo is None:
        why = disqualified or "no SFT+GRPO adapter"
        return CandidateChoice("sft", f"SFT alone ships: SFT+GRPO is disqualified ({why}) and was not evaluated")
    shown = (f"SFT+GRPO accuracy {grpo.accuracy:.1%}, failures {grpo.failure_rate:.1%}; "
             f"SFT alone {sft.accuracy:.1%}, {sft.failure_rate:.1%}")
    if grpo.accuracy >= sft.accuracy and grpo.failure_rate <= sft.failure_rate:
        return CandidateChoice("grpo", f"SFT+GRPO ships: not worse than SFT alone ({shown})")
    worse = "accuracy" if grpo.accuracy < sft.accuracy else "failures"
    return CandidateChoice("sft", f"SFT alone ships: GRPO made {worse} worse ({shown})")


def comparison_markdown(results: dict[str, EvalMetrics], probes: dict[str, float | None] | None = None) -> str:
    probes = probes or {}
    header = ["model", *TABLE_COLUMNS, "forgetting_probe"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, metrics in results.items():
        values = [getattr(metrics, c) for c in TABLE_COLUMNS]
        probe = probes.get(name)
        lines.append("| " + " | ".join([name, *(f"{v:.3g}" for v in values), "-" if probe is None else f"{probe:.2f}"]) + " |")
    return "\n".join(lines)


def category_markdown(metrics: EvalMetrics) -> str:
    """One row per task category: how many episodes and the share of each outcome (where a model goes wrong)."""
    if not metrics.by_category:
        return "no per-category figures (the tasks were not known)"
    outcomes = [key for key in next(iter(metrics.by_category.values())) if key != "n"]
    lines = ["| category | n | " + " | ".join(outcomes) + " |", "|" + "---|" * (len(outcomes) + 2)]
    for category, row in metrics.by_category.items():
        lines.append(f"| {category} | {int(row['n'])} | " + " | ".join(f"{row[o]:.0%}" for o in outcomes) + " |")
    return "\n".join(lines)


def comparison_chart(results: dict[str, EvalMetrics], path: str | Path) -> Path:
    """Grouped bars of the rates (accuracy, sources, hallucination, I-don't-know, valid calls) per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = ("accuracy", "source_accuracy", "hallucination_rate", "idk_rate", "valid_tool_call_rate")
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=110)
    width = 0.8 / max(1, len(results))
    for i, (name, metrics) in enumerate(results.items()):
        xs = [j + i * width for j in range(len(rates))]
        ax.bar(xs, [getattr(metrics, r) for r in rates], width=width, label=name)
    ax.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(rates))])
    ax.set_xticklabels([r.replace("_", " ") for r in rates], fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_title("Held-out evaluation")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write the PNG (creating its folder) and free the figure: charts are made in long-lived processes."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
