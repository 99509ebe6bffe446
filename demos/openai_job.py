"""`make demo-openai-job`: the worked example of a job brought from OpenAI, on this machine, end to end.

Starts an arbiter on loopback with a key of its own and the fine-tuning runner beside it, then runs
examples/openai_job/run_job.py (the official openai SDK, nothing else) against them: files uploaded, a reinforcement
job with a multi grader created, followed to its end, and the fine-tuned model asked a validation question through
the gateway. `--fast`: the tiny model (a minute or two; it learns nothing); default: the SmolLM2 base.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demos.openai_job", description=__doc__.split("\n")[0])
    parser.add_argument("--fast", action="store_true", help="the tiny model on the fast profile")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds to wait for the job")
    args = parser.parse_args(argv)

    from agent_rl.arbiter.config import ArbiterConfig
    from agent_rl.arbiter.keys import ApiKey
    from agent_rl.arbiter.server import running_arbiter

    token, key = ApiKey.create("openai-job-demo", "demo", ["*"])
    runner = subprocess.Popen([sys.executable, "-m", "pipelines.fine_tuning"], cwd=ROOT, env=dict(os.environ),
                              start_new_session=True)
    started = time.monotonic()
    sys.path.insert(0, str(ROOT / "examples" / "openai_job"))
    import run_job

    try:
        with running_arbiter(ArbiterConfig(api_keys=(key,)), log_level="warning") as url:
            status = run_job.main(["--base-url", f"{url}/v1", "--api-key", token, "--timeout", str(args.timeout),
                                   "--model", "tiny" if args.fast else "base"])
    finally:
        os.killpg(runner.pid, signal.SIGTERM)
        runner.wait(timeout=60)
    print(f"{time.monotonic() - started:.0f} s in all; the job's run is in the Dagster UI (`make ui`), its log under "
          f"{os.environ.get('AGENT_RL_HOME', '.data')}/jobs/<job id>/run.log")
    return status


if __name__ == "__main__":
    sys.exit(main())
