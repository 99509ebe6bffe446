"""Resource settings per profile, chosen with AGENT_RL_PROFILE: `default` (production gates), `demo`
(the laptop demo: same gates, A/B steps small enough to decide in minutes on CPU), `fast` (the tiny
model: shows the whole loop's mechanics in a few minutes; it cannot learn the task)."""

import json
import os

from resources.compute import TrainingCompute
from resources.curation import CurationResource
from resources.evaluation import EvaluationResource
from resources.registry import MlflowResource
from resources.rollout import RolloutResource
from resources.stores import InboxStoreResource, PoolResource
from resources.training import TrainingResource

PROFILES = ("default", "demo", "fast")


def resources_for(profile: str | None = None) -> dict:
    profile = profile or os.environ.get("AGENT_RL_PROFILE", "default")
    if profile not in PROFILES:
        raise ValueError(f"AGENT_RL_PROFILE={profile!r}: expected one of {', '.join(PROFILES)}")
    resources = {
        "inbox_store": InboxStoreResource(),
        "pool": PoolResource(),
        "curation": CurationResource(),
        "mlflow": MlflowResource(),
        "rollout": RolloutResource(),
        "compute": TrainingCompute(),
        "training": TrainingResource(),
        "evaluation": EvaluationResource(),
    }
    if profile == "demo":
        # A 135M model serves on 2 CPU cores: decide on tens of episodes per arm, expecting a large lift.
        resources["rollout"] = RolloutResource(min_samples_per_arm=20, min_samples_per_step=20, tau_squared=0.09)
        # Three models are evaluated on CPU: 30 held-out questions each keep validation to minutes, on every core
        # (it runs alone, like training below).
        resources["evaluation"] = EvaluationResource(max_scenarios=30, torch_threads=max(1, os.cpu_count() or 1))
        # Training runs alone on the demo machine (the arbiter idles meanwhile): give it every core. Production
        # keeps one thread, where a busy neighbour makes a multi-threaded torch 40-350x slower.
        resources["compute"] = TrainingCompute(omp_num_threads=max(1, os.cpu_count() or 1))
        # The library's training defaults (SFT 96 steps, GRPO 10 steps of ~55-100 s: bench/quality.py's model, ~17 min
        # on 2 AMX cores) would push `make demo` past its 30 minutes: SFT 48 steps (~6-7 min) and 2 GRPO steps here.
        resources["training"] = TrainingResource(
            sft_overrides=json.dumps({"max_steps": 48}),
            grpo_overrides=json.dumps({"max_steps": 2, "prompt_filter": {"mode": "none"}}))
    elif profile == "fast":
        resources.update(
            curation=CurationResource(min_points=300),
            training=TrainingResource(
                base_model="tiny",
                sft_overrides=json.dumps({"max_steps": 4, "save_steps": 2}),
                grpo_overrides=json.dumps({"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 4,
                                           "gradient_accumulation_steps": 1, "max_completion_length": 256,
                                           "prompt_filter": {"mode": "none"}}),
            ),
            # A random tiny model cannot beat anything: let it through to show registry and A/B.
            evaluation=EvaluationResource(max_scenarios=20, min_relative_improvement=-1.0, max_forgetting_drop=1.0),
            # A round of 100 replayed requests gives the 10% arm ~7 episodes in ~45 s: 10 per arm decide by the
            # statistics within two or three rounds (20 per arm with a 72 s limit always ended in a timeout).
            rollout=RolloutResource(min_samples_per_arm=10, min_samples_per_step=10, base_spec="tiny",
                                    max_step_hours=0.05),
        )
    return resources
