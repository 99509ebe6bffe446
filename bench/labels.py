"""Labels from implicit feedback: how well the labeler (agent_rl/feedback/) labels the episodes nobody rated.

A simulated week of an outside agent's traffic (agent_rl/feedback/population.py: `--episodes` conversations, a 5%
share of users rating) is labeled from its own ratings, for the default noise and the two noisier presets, each
with `--seeds` independent weeks. Reported per preset (means over the seeds, and the per-seed figures):
  - auc_truth / ece_truth: the labeler's probabilities on the unrated episodes against the simulation's HIDDEN
    truth (satisfied or not), which no rating shows; ECE with 10 equal-width bins (labeler.py);
  - auc_ratings_oof / ece_ratings_oof / ece_floor_ratings: the labeler's own check, out of fold on the rated
    episodes, and the ECE a perfectly calibrated labeler would still show on that many (sampling noise);
  - check_passed: in how many weeks the check passed (when it fails the week trains on its ratings alone);
  - rows_ratings_only vs rows_with_labels: training rows from the ratings alone vs ratings plus confident labels
    (had the labels been used), their ratio, and good rows alone (what SFT takes);
  - wrong_label_share: labeled episodes whose label contradicts the hidden truth (rows and wrong labels per seed too).
`meets_target`: at the default noise, mean AUC >= 0.85 and mean ECE <= 0.05 against the hidden truth;
`meets_rows_target`: ratings plus labels give >= 10x the rows of ratings alone.

    OMP_NUM_THREADS=1 .venv/bin/python bench/labels.py [--episodes 4000] [--rated-share 0.05] [--seeds 3]
        [--calibration none|sigmoid|isotonic]   (sigmoid: the labeler as it was before 2026-11-28 afternoon)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from agent_rl.feedback.labeler import LabelerConfig, expected_calibration_error, label_episodes  # noqa: E402
from agent_rl.feedback.population import NOISE_PRESETS, PopulationConfig, simulate  # noqa: E402
from agent_rl.feedback.signals import episode_signals  # noqa: E402

MIN_AUC, MAX_ECE, MIN_ROWS_RATIO = 0.85, 0.05, 10.0


def one_week(preset: str, seed: int, episodes: int, rated_share: float, config: LabelerConfig) -> dict[str, float]:
    """Simulate a week, label it, and score the labels against the hidden truth."""
    week = simulate(PopulationConfig(n_episodes=episodes, rated_share=rated_share, noise=NOISE_PRESETS[preset],
                                     seed=seed))
    truth = {e.episode.episode_id: e.satisfied for e in week}
    result = label_episodes([episode_signals(e.episode) for e in week], config)
    report = result.report
    y = np.array([truth[s.episode_id] for s in result.scored], dtype=int)
    p = np.array([s.probability for s in result.scored])
    confident = [s for s in result.scored if s.good is not None]  # the labels, had the check passed
    good_labels = sum(bool(s.good) for s in confident)
    return {
        "auc_truth": float(roc_auc_score(y, p)) if len(set(y)) == 2 else float("nan"),
        "ece_truth": expected_calibration_error(y, p) if len(y) else float("nan"),
        "auc_ratings_oof": report.auc if report.auc is not None else float("nan"),
        "ece_ratings_oof": report.ece if report.ece is not None else float("nan"),
        "ece_floor_ratings": report.ece_floor if report.ece_floor is not None else float("nan"),
        "check_passed": float(report.passed),
        "rows_ratings_only": report.n_rated,
        "rows_with_labels": report.n_rated + len(confident),
        "good_rows_ratings_only": report.n_rated_good,
        "good_rows_with_labels": report.n_rated_good + good_labels,
        "wrong_labels": sum(s.good != truth[s.episode_id] for s in confident),
        "labeled": len(confident),
    }


def summarize(weeks: list[dict[str, float]]) -> dict[str, object]:
    """Means over the weeks, the per-week AUC and ECE against the truth, and the row counts as ratios."""
    mean = {k: statistics.fmean(w[k] for w in weeks) for k in weeks[0]}
    return {
        "auc_truth": round(mean["auc_truth"], 3),
        "ece_truth": round(mean["ece_truth"], 3),
        "auc_truth_per_seed": [round(w["auc_truth"], 3) for w in weeks],
        "ece_truth_per_seed": [round(w["ece_truth"], 3) for w in weeks],
        "auc_ratings_oof": round(mean["auc_ratings_oof"], 3),
        "ece_ratings_oof": round(mean["ece_ratings_oof"], 3),
        "ece_floor_ratings": round(mean["ece_floor_ratings"], 3),
        "check_passed": f"{int(sum(w['check_passed'] for w in weeks))}/{len(weeks)}",
        "rows_ratings_only": round(mean["rows_ratings_only"], 1),
        "rows_with_labels": round(mean["rows_with_labels"], 1),
        "rows_ratio": round(mean["rows_with_labels"] / max(mean["rows_ratings_only"], 1), 2),
        "good_rows_ratio": round(mean["good_rows_with_labels"] / max(mean["good_rows_ratings_only"], 1), 2),
        "wrong_label_share": round(sum(w["wrong_labels"] for w in weeks) / max(sum(w["labeled"] for w in weeks), 1), 3),
        "rows_ratio_per_seed": [round(w["rows_with_labels"] / max(w["rows_ratings_only"], 1), 2) for w in weeks],
        "wrong_label_share_per_seed": [round(w["wrong_labels"] / max(w["labeled"], 1), 3) for w in weeks],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=4000, help="simulated episodes per week")
    parser.add_argument("--rated-share", type=float, default=0.05)
    parser.add_argument("--seeds", type=int, default=3, help="independent simulated weeks per noise preset")
    parser.add_argument("--calibration", choices=("none", "sigmoid", "isotonic"), default=LabelerConfig.calibration,
                        help="the labeler's calibration (LabelerConfig.calibration), to compare against the default")
    args = parser.parse_args()
    config = LabelerConfig(calibration=args.calibration)
    started = time.perf_counter()
    presets = {name: summarize([one_week(name, seed, args.episodes, args.rated_share, config)
                                for seed in range(args.seeds)]) for name in NOISE_PRESETS}
    default = presets["default"]
    report = {
        "benchmark": "labels",
        "episodes_per_week": args.episodes,
        "rated_share": args.rated_share,
        "seeds": args.seeds,
        "thresholds": [config.negative_threshold, config.positive_threshold],
        "calibration": config.calibration,
        "labeler_bars": {"min_auc": config.min_auc, "max_ece": config.max_ece},
        "presets": presets,
        "seconds": round(time.perf_counter() - started, 1),
        "target": f"default noise: AUC >= {MIN_AUC} and ECE <= {MAX_ECE} against the hidden truth; "
                  f"ratings + labels >= {MIN_ROWS_RATIO:g}x the rows of ratings alone",
        "meets_target": default["auc_truth"] >= MIN_AUC and default["ece_truth"] <= MAX_ECE,
        "meets_rows_target": default["rows_ratio"] >= MIN_ROWS_RATIO,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
