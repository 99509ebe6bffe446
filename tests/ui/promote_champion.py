"""Make the model the fast demo registered the `champion`, as an operator would after an A/B test.

The tiny random model of the fast profile cannot win an A/B test, so the demo leaves it as `challenger`
(or rolls it back); this moves the `champion` alias onto it with `agent_rl.registry.set_alias` and
clears `challenger`, the same registry change the rollout controller makes on a promotion. Run it
with MLFLOW_TRACKING_URI (or AGENT_RL_HOME) pointing at the demo's store; prints one JSON line.
"""

from __future__ import annotations

import json
import sys

from agent_rl import registry


def promote() -> dict:
    try:
        champion = registry.get_version("champion")
        return {"version": champion.version, "promoted_by": "demo"}  # the A/B test promoted it already
    except LookupError:
        pass
    try:
        version = registry.get_version("challenger").version
    except LookupError:
        # Rolled back: the alias is gone, the version is still registered; take the newest one.
        from mlflow import MlflowClient

        from agent_rl import settings

        client = MlflowClient(tracking_uri=settings.mlflow_uri(), registry_uri=settings.mlflow_uri())
        versions = client.search_model_versions(f"name='{registry.MODEL_NAME}'")
        if not versions:
            raise SystemExit(f"no version of {registry.MODEL_NAME!r} is registered at {settings.mlflow_uri()}")
        version = str(max(int(v.version) for v in versions))
    registry.set_alias("champion", version)
    registry.delete_alias("challenger")
    registry.tag_version(version, {"rollout": "promoted", "rollout.cause": "manual (browser test)"})
    return {"version": version, "promoted_by": "registry.set_alias"}


if __name__ == "__main__":
    print(json.dumps(promote()))
    sys.exit(0)
