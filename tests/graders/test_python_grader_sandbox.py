"""Python graders run untrusted code: off by default; when enabled, hostile graders score 0 with a reason."""

from __future__ import annotations

import time

import pytest

from agent_rl.graders import GraderConfigError, GraderContext, PythonSandboxConfig, grade, make_sample, validate

ENABLED = GraderContext(python=PythonSandboxConfig(enabled=True, timeout_s=5.0, memory_mb=512))
SHORT = GraderContext(python=PythonSandboxConfig(enabled=True, timeout_s=2.0, memory_mb=512))


def python_grader(body: str) -> dict:
    source = "import os\n\ndef grade(sample, item):\n" + "".join(f"    {line}\n" for line in body.splitlines())
    return {"type": "python", "name": "code", "source": source}


def run(body: str, context: GraderContext = ENABLED, output: str = "Paris", item: dict | None = None):
    return grade(python_grader(body), make_sample(output), item or {"answer": "Paris"}, context)


def test_python_graders_are_refused_unless_the_operator_enables_them():
    grader = python_grader("return 1.0")
    with pytest.raises(GraderConfigError, match="python graders run code from the job and are off"):
        validate(grader, {})
    with pytest.raises(GraderConfigError, match="PythonSandboxConfig\\(enabled=True\\)"):
        grade(grader, make_sample("x"), {})
    validate(grader, {}, ENABLED)


def test_a_grader_gets_the_sample_and_the_item():
    body = "return 1.0 if sample['output_text'] == item['answer'] else 0.25"
    assert run(body).score == 1.0 and run(body).reason is None
    assert run(body, output="Lyon").score == 0.25
    assert run("return sample['output_json']['n'] / 10", output='{"n": 7}').score == pytest.approx(0.7)


def test_an_infinite_loop_times_out():
    started = time.monotonic()
    result = run("while True:\n    pass", SHORT)
    assert time.monotonic() - started < 8
    assert result.score == 0.0
    assert "timed out after 2 s" in result.reason


def test_opening_a_socket_fails():
    result = run("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.connect(('127.0.0.1', 9))\nreturn 1.0")
    assert result.score == 0.0
    assert "network access is disabled" in result.reason


def test_allocating_ten_gigabytes_fails_with_a_memory_error():
    result = run("block = bytearray(10 * 1024 ** 3)\nreturn 1.0")
    assert result.score == 0.0
    assert "MemoryError" in result.reason and "512 MB" in result.reason


def test_the_parents_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent-secret")
    visible = "return 0.0 if 'OPENAI_API_KEY' in os.environ or 'AGENT_RL_HOME' in os.environ else 1.0"
    assert run(visible).score == 1.0
    # nor through /proc, where the parent's environment can be read by the same user
    result = run("return 1.0 if b'sk-parent-secret' in open(f'/proc/{os.getppid()}/environ', 'rb').read() else 0.5")
    assert result.score == 0.0
    assert "reading /proc is disabled" in result.reason


def test_the_working_directory_is_fresh_and_empty():
    assert run("return 1.0 if os.listdir('.') == [] else 0.5").score == 1.0


def test_starting_a_process_fails():
    result = run("import subprocess\nsubprocess.run(['true'])\nreturn 1.0")
    assert result.score == 0.0
    assert "starting processes is disabled" in result.reason


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("return 1 / 0", "ZeroDivisionError: division by zero"),
        ("return 'high'", "grade returned str, not a number"),
        ("return None", "grade returned NoneType, not a number"),
        ("return float('nan')", "not a finite number"),
        ("raise SystemExit(3)", "SystemExit: 3"),
        ("os._exit(0)", "exited with code 0 without a verdict"),
    ],
)
def test_exceptions_and_non_numeric_results_score_zero_with_the_reason(body, why):
    result = run(body)
    assert result.score == 0.0
    assert why in result.reason


def test_a_source_without_grade_is_refused_at_validation():
    with pytest.raises(GraderConfigError, match="defines no top-level grade"):
        validate({"type": "python", "name": "code", "source": "def score(sample, item):\n    return 1\n"}, {}, ENABLED)
    with pytest.raises(GraderConfigError, match="does not parse"):
        validate({"type": "python", "name": "code", "source": "def grade(:"}, {}, ENABLED)


def test_the_pools_files_and_anything_outside_its_folder_are_out_of_reach(tmp_path):
    """A hostile grader that knows where the pool lives (its database, the keys file, another tenant's upload)
    reads nothing of it, lists nothing and writes nothing outside its own folder; imports still work."""
    pool = tmp_path / "pool.db"
    pool.write_text("tenant-b's episodes")
    for body in (f"return len(open({str(pool)!r}).read())",
                 f"return len(os.listdir({str(tmp_path)!r}))",
                 f"open({str(tmp_path / 'planted.txt')!r}, 'w').write('x')\nreturn 1.0",
                 "return len(open(os.path.expanduser('~/.bashrc')).read())"):
        result = run(body)
        assert result.score == 0.0 and "out of reach" in (result.reason or ""), (body, result)
    assert not (tmp_path / "planted.txt").exists()
    own = run("import json, statistics\nopen('notes.txt', 'w').write('ok')\nreturn float(open('notes.txt').read() == 'ok')")
    assert own.score == 1.0, own.reason
