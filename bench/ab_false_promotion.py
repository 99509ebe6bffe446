"""A/B rollout benchmark: false-promotion rate of A/A tests under continuous monitoring (mSPRT vs the
naive peeking z-test), power and samples to decision of the always-valid procedure.

Usage: OMP_NUM_THREADS=1 python bench/ab_false_promotion.py [--runs 1000] [--seed 0]
The last printed line is one JSON object; meets_target is true when the A/A false-promotion rate
of the real rollout procedure is <= alpha.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta

from agent_rl.ab.rollout import RolloutConfig
from agent_rl.ab.simulate import Arm, peeking_false_positive_rates, simulate_rollouts
from agent_rl.ab.stats import fixed_horizon_z_test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1000, help="simulated A/A rollouts per method")
    parser.add_argument("--power-runs", type=int, default=500)
    parser.add_argument("--p", type=float, default=0.55, help="champion success rate")
    parser.add_argument("--lift", type=float, default=0.10, help="challenger lift for the power figure")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    # 100 episodes an hour, a decision after every hour, each step may last 3 days.
    config = RolloutConfig(max_step_duration=timedelta(days=3))
    traffic = {"config": config, "batch_size": 100, "batch_interval": timedelta(hours=1)}
    started = time.perf_counter()

    same = Arm(args.p)
    aa_msprt = simulate_rollouts(same, same, n_runs=args.runs, seed=args.seed, **traffic)
    aa_naive = simulate_rollouts(
        same, same, n_runs=args.runs, seed=args.seed, significance_test=fixed_horizon_z_test, **traffic
    )
    better = simulate_rollouts(Arm(args.p), Arm(args.p + args.lift), n_runs=args.power_runs, seed=args.seed + 1, **traffic)
    worse = simulate_rollouts(Arm(args.p), Arm(args.p - args.lift), n_runs=args.power_runs, seed=args.seed + 2, **traffic)
    # The test alone at a 50/50 split, 100 looks of 100 episodes: the textbook peeking picture.
    peeking = peeking_false_positive_rates(
        args.p, n_runs=10_000, n_checks=100, batch_size=100, alpha=config.alpha,
        tau_squared=config.tau_squared, min_samples_per_arm=config.min_samples_per_arm, seed=args.seed,
    )

    report = {
        "benchmark": "ab_false_promotion",
        "alpha": config.alpha,
        "tau_squared": config.tau_squared,
        "steps": list(config.steps),
        "traffic": "100 episodes/hour, decide hourly, <= 3 days per step",
        "aa_runs": args.runs,
        "p": args.p,
        "aa_false_promotion_rate_msprt": aa_msprt.promotion_rate,
        "aa_false_promotion_rate_peeking_z": aa_naive.promotion_rate,
        "aa_false_verdict_rate_msprt": aa_msprt.significant_decision_rate,
        "aa_false_verdict_rate_peeking_z": aa_naive.significant_decision_rate,
        "aa_guardrail_rollback_rate": aa_msprt.cause_rate("guardrail_breach"),
        "test_only_50_50_100_looks": peeking,
        "power_runs": args.power_runs,
        "lift": args.lift,
        "power_promote": better.promotion_rate,
        "median_episodes_to_promotion": better.median_episodes_to("promote"),
        "rollback_rate_when_worse": worse.rollback_rate,
        "significantly_worse_rate_when_worse": worse.cause_rate("significantly_worse"),
        "median_episodes_to_rollback_when_worse": worse.median_episodes_to("rollback"),
        "seconds": round(time.perf_counter() - started, 1),
        "target": "A/A false-promotion rate <= alpha under continuous monitoring",
        "meets_target": aa_msprt.promotion_rate <= config.alpha,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
