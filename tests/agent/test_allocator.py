"""The allocator setting that lets decoding reuse freed cache blocks: set on Linux, switchable off."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = "from agent_rl.agent.allocator import keep_freed_memory; print(keep_freed_memory(), keep_freed_memory())"


def _run(env: dict[str, str]) -> str:
    import os

    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_thresholds_are_set_once_per_process_and_can_be_switched_off():
    assert _run({"AGENT_RL_KEEP_FREED_MEMORY": "1"}) == "True True"
    assert _run({"AGENT_RL_KEEP_FREED_MEMORY": "0"}) == "False False"
