"""Labels from implicit feedback: how well the labeler (agent_rl/feedback/) labels the episodes nobody rated.

A simulated week of an outside agent's traffic is labeled from its own ratings, and the labels are scored against
the simulation's hidden truth. Two worlds, one model of users' behaviour (agent_rl/simulated_users/behaviour.py):
  - `--world population` (default): agent_rl/simulated_users/population.py, a scripted agent's conversations, for the
    default noise and the two noisier presets, each with `--seeds` independent weeks (seconds each);
  - `--world gateway`: the gateway demo's own week (bench/gateway_week.py: the outside program's users through the
    arbiter's gateway to the simulated o3), at `--noise`, `--seeds` weeks (~2-3 minutes each on 2 cores): what
    `make demo ENV=gateway` labels, without its training.
By default the labeler is fitted on the rows curation fits it on (`--fit curation`: agent_rl/curation/live.py
`labeler_fit_rows`, every rated episode but those the validation hash holds out, good or bad), so the figures are
those of the labels the demo trains on; `--fit all` fits it on every rating, `--fit good-out` on every rating but the
held-out good ones (curation's fit before 2026-11-29, a fifth of the good ratings missing: its labels came out low)
(several, comma-separated, are compared on the same weeks). `--episodes` defaults to the full
demo profile's 6,000 users a week. Reported per preset (means over the seeds, and the per-seed figures):
  - auc_truth / ece_truth: the labeler's probabilities on the unrated episodes against the HIDDEN truth, which no
    rating shows; ECE with 10 equal-width bins (labeler.py `against_truth`, the function the demo reports with);
    mean_probability / truth_share: the labels' mean against the truth's share (a prior shift shows here);
  - auc_ratings_oof / ece_ratings_oof / ece_floor_ratings: the labeler's own check, out of fold on the rated
    episodes, and the ECE a perfectly calibrated labeler would still show on that many (sampling noise);
  - auc_ratings_ceiling: the AUC the hidden truth itself reaches against the same ratings, where users rate against
    how it went (rating noise): no labeler's out-of-fold AUC can exceed it, so the check's AUC bar must sit below;
  - auc_signals_ceiling (population world): what the signals themselves allow, lower still: a logistic model fitted
    on the hidden truth of `--ceiling-weeks` other weeks (not on ratings: the signals' best, no labeler's), scored
    against each week's ratings (`_ratings`) and its truth (`_truth`); the check's AUC bar must sit below the first;
  - check_passed: in how many weeks the check passed (when it fails the week trains on its ratings alone);
  - rows_ratings_only vs rows_with_labels: training rows from the ratings alone vs ratings plus confident labels
    (had the labels been used), their ratio, and good rows alone (what SFT takes);
  - wrong_label_share: labeled episodes whose label contradicts the hidden truth (rows and wrong labels per seed too).
`meets_target`: at the default noise, mean AUC >= 0.85 and mean ECE <= 0.05 against the hidden truth;
`meets_rows_target`: ratings plus labels give >= 10x the rows of ratings alone.

    OMP_NUM_THREADS=1 .venv/bin/python bench/labels.py [--world population|gateway] [--episodes 6000]
        [--rated-share 0.05] [--seeds 3] [--fit curation,good-out,all] [--noise default]
        [--calibration none|sigmoid|isotonic]   (sigmoid: the labeler as it was before 2026-11-28 afternoon)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from sklearn.metrics import roc_auc_score  # noqa: E402

from agent_rl.curation.live import held_out  # noqa: E402
from agent_rl.feedback.labeler import LabelerConfig, against_truth, label_episodes  # noqa: E402
from agent_rl.simulated_users.population import NOISE_PRESETS, PopulationConfig, simulate  # noqa: E402
from agent_rl.feedback.signals import Signals, episode_signals  # noqa: E402

MIN_AUC, MAX_ECE, MIN_ROWS_RATIO = 0.85, 0.05, 10.0


def fit_rows(signals: list[Signals], fit: str) -> list[Signals]:
    """What the labeler is fitted on: "curation", the rows curation's `labeler_fit_rows` gives it (every rated
    episode the validation hash holds out left out, good or not, by the same hash); "good-out", only the held-out
    rated-good ones left out (curation's fit before 2026-11-29); "all", every episode."""
    if fit == "all":
        return signals
    if fit == "good-out":
        return [s for s in signals if not (s.rated and (s.rating or 0) > 0 and held_out(str(s.episode_id)))]
    return [s for s in signals if not (s.rated and held_out(str(s.episode_id)))]


def population_week(preset: str, seed: int, episodes: int, rated_share: float
                    ) -> tuple[list[Signals], dict[str, bool]]:  # fmt: skip
    week = simulate(PopulationConfig(n_episodes=episodes, rated_share=rated_share, noise=NOISE_PRESETS[preset],
                                     seed=seed))
    return [episode_signals(e.episode) for e in week], {e.episode.episode_id: e.satisfied for e in week}


def gateway_week(preset: str, seed: int, episodes: int, rated_share: float
                 ) -> tuple[list[Signals], dict[str, bool]]:  # fmt: skip
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:  # run as a script: the repository's demos/ and bench/ packages
        sys.path.insert(0, root)
    from bench.gateway_week import gateway_week as run_week

    rows, truth, _ = run_week(episodes, seed, noise=preset, rated_share=rated_share)
    return [episode_signals(r) for r in rows], truth


def signals_ceiling(preset: str, weeks: int, episodes: int, rated_share: float) -> Any:
    """A logistic model of the hidden truth from the signals, fitted on `weeks` population weeks no bench week uses
    (seeds from 1000): the most the signals tell, which no labeler fitted on ratings can beat."""
    from sklearn.linear_model import LogisticRegression

    from agent_rl.feedback.labeler import _matrix

    rows: list[Signals] = []
    truth: dict[str, bool] = {}
    for seed in range(1000, 1000 + weeks):
        signals, week_truth = population_week(preset, seed, episodes, rated_share)
        rows += signals
        truth.update(week_truth)
    model = LogisticRegression(max_iter=2000).fit(_matrix(rows), [int(truth[s.episode_id]) for s in rows])
    return lambda signals: model.predict_proba(_matrix(signals))[:, 1]


def score_week(signals: list[Signals], truth: dict[str, bool], config: LabelerConfig, fit: str,
               ceiling: Any = None) -> dict[str, float]:
    """Label a week and score the labels against the hidden truth."""
    result = label_episodes(fit_rows(signals, fit), config)
    report = result.report
    scored = against_truth(result.scored, truth, config.ece_bins)
    confident = [s for s in result.scored if s.good is not None]  # the labels, had the check passed
    rated = [s for s in fit_rows(signals, fit) if s.rated and s.episode_id in truth]
    ratings_good = [int((s.rating or 0) > 0) for s in rated]
    ceiling_auc = (roc_auc_score(ratings_good, [float(truth[s.episode_id]) for s in rated])
                   if 0 < sum(ratings_good) < len(ratings_good) else None)
    good_labels = sum(bool(s.good) for s in confident)
    nan = float("nan")
    signals_ratings = signals_truth = nan
    if ceiling is not None and 0 < sum(ratings_good) < len(ratings_good):
        signals_ratings = roc_auc_score(ratings_good, ceiling(rated))
        signals_truth = roc_auc_score([int(truth[s.episode_id]) for s in signals], ceiling(signals))
    return {
        "auc_truth": scored["auc"] if scored["auc"] is not None else nan,
        "ece_truth": scored["ece"] if scored["ece"] is not None else nan,
        "mean_probability": scored["mean_probability"] if scored["mean_probability"] is not None else nan,
        "truth_share": scored["truth_share"] if scored["truth_share"] is not None else nan,
        "auc_ratings_oof": report.auc if report.auc is not None else nan,
        "auc_ratings_ceiling": ceiling_auc if ceiling_auc is not None else nan,
        "auc_signals_ceiling_ratings": signals_ratings,
        "auc_signals_ceiling_truth": signals_truth,
        "ece_ratings_oof": report.ece if report.ece is not None else nan,
        "ece_floor_ratings": report.ece_floor if report.ece_floor is not None else nan,
        "check_passed": float(report.passed),
        "rows_ratings_only": report.n_rated,
        "rows_with_labels": report.n_rated + len(confident),
        "good_rows_ratings_only": report.n_rated_good,
        "good_rows_with_labels": report.n_rated_good + good_labels,
        "wrong_labels": scored["confident_wrong"],
        "labeled": len(confident),
    }


WORLDS = {"population": population_week, "gateway": gateway_week}
FITS = ("curation", "good-out", "all")


def summarize(weeks: list[dict[str, float]]) -> dict[str, object]:
    """Means over the weeks, the per-week AUC and ECE against the truth, and the row counts as ratios."""
    mean = {k: statistics.fmean(w[k] for w in weeks) for k in weeks[0]}
    return {
        "auc_truth": round(mean["auc_truth"], 3),
        "ece_truth": round(mean["ece_truth"], 3),
        "mean_probability": round(mean["mean_probability"], 3),
        "truth_share": round(mean["truth_share"], 3),
        "auc_truth_per_seed": [round(w["auc_truth"], 3) for w in weeks],
        "ece_truth_per_seed": [round(w["ece_truth"], 3) for w in weeks],
        "auc_ratings_oof": round(mean["auc_ratings_oof"], 3),
        "auc_ratings_ceiling": round(mean["auc_ratings_ceiling"], 3),
        "auc_signals_ceiling_ratings": round(mean["auc_signals_ceiling_ratings"], 3),
        "auc_signals_ceiling_truth": round(mean["auc_signals_ceiling_truth"], 3),
        "auc_ratings_oof_per_seed": [round(w["auc_ratings_oof"], 3) for w in weeks],
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
    parser.add_argument("--world", choices=tuple(WORLDS), default="population",
                        help="population: the scripted agent's conversations; gateway: the demo's week of traffic")
    parser.add_argument("--episodes", type=int, default=6000,
                        help="simulated episodes (users) per week: the full gateway demo's 6,000 by default")
    parser.add_argument("--rated-share", type=float, default=0.05)
    parser.add_argument("--seeds", type=int, default=3, help="independent simulated weeks per noise preset")
    parser.add_argument("--first-seed", type=int, default=0, help="the first week's seed (then the next ones)")
    parser.add_argument("--noise", default=None, choices=tuple(NOISE_PRESETS),
                        help="one preset only (default: all three for the population, 'default' for the gateway)")
    parser.add_argument("--fit", default="curation",
                        help="the labeler's rows, comma-separated to compare on the same weeks: curation (curation's: "
                             "the rated episodes validation holds out left out, good or not), good-out (only the "
                             "held-out good ones left out: curation's fit before 2026-11-29), all")
    parser.add_argument("--ceiling-weeks", type=int, default=6,
                        help="population world: weeks of hidden truth the signals' ceiling is fitted on (0: none)")
    parser.add_argument("--calibration", choices=("none", "sigmoid", "isotonic"), default=LabelerConfig.calibration,
                        help="the labeler's calibration (LabelerConfig.calibration), to compare against the default")
    args = parser.parse_args()
    config = LabelerConfig(calibration=args.calibration)
    names = [args.noise] if args.noise else list(NOISE_PRESETS) if args.world == "population" else ["default"]
    started = time.perf_counter()
    fits = args.fit.split(",")
    if not fits or any(fit not in FITS for fit in fits):
        parser.error(f"--fit: a comma-separated list of {', '.join(FITS)}")
    scores: dict[str, dict[str, list]] = {fit: {name: [] for name in names} for fit in fits}
    for name in names:
        ceiling = (signals_ceiling(name, args.ceiling_weeks, args.episodes, args.rated_share)
                   if args.world == "population" and args.ceiling_weeks > 0 else None)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            signals, truth = WORLDS[args.world](name, seed, args.episodes, args.rated_share)
            for fit in fits:
                scores[fit][name].append(score_week(signals, truth, config, fit, ceiling))
    by_fit = {fit: {name: summarize(weeks) for name, weeks in per.items()} for fit, per in scores.items()}
    presets = by_fit[fits[0]]
    default = presets.get("default")
    report = {
        "benchmark": "labels",
        "world": args.world,
        "fit": fits[0],
        "episodes_per_week": args.episodes,
        "rated_share": args.rated_share,
        "seeds": list(range(args.first_seed, args.first_seed + args.seeds)),
        "thresholds": [config.negative_threshold, config.positive_threshold],
        "calibration": config.calibration,
        "labeler_bars": {"min_auc": config.min_auc, "max_ece": config.max_ece},
        "presets": presets,
        **{f"presets_fit_{fit}": by_fit[fit] for fit in fits[1:]},
        "seconds": round(time.perf_counter() - started, 1),
        "target": f"default noise: AUC >= {MIN_AUC} and ECE <= {MAX_ECE} against the hidden truth; "
                  f"ratings + labels >= {MIN_ROWS_RATIO:g}x the rows of ratings alone",
        "meets_target": bool(default) and default["auc_truth"] >= MIN_AUC and default["ece_truth"] <= MAX_ECE,
        "meets_rows_target": bool(default) and default["rows_ratio"] >= MIN_ROWS_RATIO,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
