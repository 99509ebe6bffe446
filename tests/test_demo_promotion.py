"""The loop closes end to end, on models that learn: `make demo-fast` (profile `learn`: the help desk and a tiny
model fitted to it, production on v0) promotes the week's candidate through the superiority gate and the A/B test,
10% -> 50% -> 100%, and the `champion` alias moves; a candidate worse than production is rolled back by the same
A/B test and production stays where it was."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl.arbiter.server import free_port

ROOT = Path(__file__).resolve().parents[1]
LEARN = ROOT / "pipelines" / "profiles" / "learn.toml"

pytestmark = pytest.mark.slow


def run_demo(tmp_path: Path, *args: str) -> tuple[str, dict]:
    home = tmp_path / "home"
    env = {**os.environ, "AGENT_RL_HOME": str(home), "DAGSTER_HOME": str(tmp_path / "dagster"),
           "MLFLOW_TRACKING_URI": "", "AGENT_RL_POOL_URL": "", "AGENT_RL_ENV": "", "INCUMBENT": ""}
    (tmp_path / "dagster").mkdir()
    done = subprocess.run([sys.executable, "-m", "demos.demo", "--fast", "--incumbent", "ours",
                           "--port", str(free_port()), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1500)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-3000:]}"
    return done.stdout, env


def aliases(env: dict) -> dict[str, str]:
    """The registry's aliases as the demo left them, read the way an operator would (agent_rl.registry)."""
    script = ("import json; from agent_rl import registry\n"
              "out = {}\n"
              "for alias in ('champion', 'challenger'):\n"
              "    try: out[alias] = str(registry.get_version(alias, name='agent-rl-helpdesk').version)\n"
              "    except LookupError: pass\n"
              "print(json.dumps(out))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_make_demo_fast_promotes_the_weeks_candidate_over_v0(tmp_path):
    out, env = run_demo(tmp_path, "--profile", "learn")
    summary = out.split("================ summary ================")[1]
    v0 = re.search(r"v0: v1 of agent-rl-helpdesk, .*held-out accuracy ([\d.]+)%", summary)
    assert v0 and float(v0.group(1)) <= 80, summary  # weak: half the training (15-46% in runs so far)
    gate = re.search(r"gate improvement: passed - superiority on \d+ paired tasks: accuracy ([\d.]+)%.*"
                     r"McNemar (\d+) vs (\d+) discordant, one-sided p = (\S+);", summary)
    assert gate, summary
    assert float(gate.group(1)) >= float(v0.group(1)) + 20 and float(gate.group(4)) < 0.05
    routing = [line for line in summary.splitlines() if line.startswith("routing ")]
    assert any("{'v1': 1.0}" in line and "v0 shipped" in line for line in routing), routing
    assert [re.search(r"\{.*?\}", line).group(0) for line in routing[-3:]] == [
        "{'v1': 0.9, 'v2': 0.1}", "{'v1': 0.5, 'v2': 0.5}", "{'v2': 1.0}"], routing
    assert re.search(r"^\s+1 \| v1 100% \| .* \| promote \(significantly_better\)", summary, re.M), summary
    assert re.search(r"deployment success rate 100%", summary), summary
    assert aliases(env) == {"champion": "2"}


def test_a_worse_candidate_is_rolled_back_and_production_stays_on_v0(tmp_path):
    # The same world and model; v0 trained in full (400 steps) and the week's candidate from the base with a
    # quarter of that, let through the open gate so that the A/B test is what stops it.
    profile = tmp_path / "worse-week.toml"
    text = LEARN.read_text()
    text = text.replace("max_steps = 400, save_steps = 200", "max_steps = 100, save_steps = 100")
    text = text.replace("[evaluation]\n", "[evaluation]\ngate = \"open\"\n")
    text = text.replace('[training]\n', '[training]\nstart_from = "base"\ngrpo_enabled = false\n')
    profile.write_text(text)
    out, env = run_demo(tmp_path, "--profile", str(profile), "--v0-steps", "400")
    summary = out.split("================ summary ================")[1]
    assert re.search(r"^\s+1 \| v1 100% \| .* \| rollback", summary, re.M), summary
    routing = [line for line in summary.splitlines() if line.startswith("routing ")]
    assert "{'v1': 0.9, 'v2': 0.1}" in routing[-2] and "{'v1': 1.0} (rollback" in routing[-1], routing
    assert aliases(env) == {"champion": "1"}
