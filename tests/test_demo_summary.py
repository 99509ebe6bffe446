"""The demo's summary says why a check failed, from the check's own findings, and how much memory the arbiter
took serving the week's versions."""

from __future__ import annotations

import dagster as dg

from demos.demo import arbiter_memory
from demos.run import _flagged_examples


def test_failed_check_examples_are_printed_for_triggered_findings_only():
    metadata = {
        "unsupported_answer": dg.MetadataValue.json({"triggered": True, "examples": [
            {"why": "only 0% of the answer's words are in the emails seen", "question": "Who approved it?",
             "final_answer": "Sherry"},
            {"why": "answered without seeing any email", "question": "When?", "final_answer": "Monday"},
            {"why": "third", "question": "q", "final_answer": "a"}]}),
        "tool_call_spam": dg.MetadataValue.json({"triggered": False, "examples": [{"why": "x"}]}),
        "note": dg.MetadataValue.text("not a finding"),
    }
    lines = _flagged_examples(metadata)
    assert len(lines) == 2 and all(line.startswith("unsupported_answer: ") for line in lines)
    assert "Who approved it?" in lines[0] and "'Sherry'" in lines[0]


def test_the_arbiter_memory_line_reads_healthz():
    """A real HTTP server answering /healthz as the arbiter does (the arbiter itself is tested in
    tests/arbiter/test_shared_serving.py)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    mb = 1024 * 1024

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "ok", "serving": {
                "versions": ["challenger", "champion"], "policies_loaded": ["api-sim:o3", "mlflow:challenger"],
                "resident_bytes": 900 * mb, "peak_resident_bytes": 1200 * mb, "adapter_bytes": 37 * mb,
                "cache_bytes": 12.5 * mb}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        memory = arbiter_memory(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert memory == {"versions": ["challenger", "champion"], "policies": ["api-sim:o3", "mlflow:challenger"],
                      "resident_mb": 900, "peak_mb": 1200, "adapter_mb": 37.0, "cache_mb": 12.5}
    assert arbiter_memory("http://127.0.0.1:9") is None  # nothing listening: no figure, no crash


def test_each_week_has_its_held_out_line_and_a_week_without_validation_says_so():
    from demos.demo import held_out_line

    report = {"metrics": {"sft": {"accuracy": 0.723, "hallucination_rate": 0.117},
                          "incumbent": {"accuracy": 0.872, "hallucination_rate": 0.074}},
              "choice": {"candidate": "sft"}}
    assert held_out_line(report) == "sft 72.3% / 11.7%, grpo -, incumbent 87.2% / 7.4% | sft"
    assert "before validation" in held_out_line(None)


def test_a_week_stopped_by_a_gate_prints_that_gate_and_no_evaluation_table(capsys):
    """The summary shows what this run did: a week stopped at a curation gate names the gate with its figures
    and prints no held-out table, not even an earlier week's."""
    from demos.demo import print_summary

    class Pool:
        def routing_history(self):
            return []

    earlier = {"incumbent": {"version": "o3-sim", "spec": "api-sim:o3", "simulation": True},
               "metrics": {"sft": {"accuracy": 0.681, "hallucination_rate": 0.2}}, "forgetting_probe": {},
               "choice": {"reason": "sft", "candidate": "sft"},
               "gates": {}}
    gate = "stopped before validation by validated_episodes.clean_ratio: 50.0% of 10800 exported episodes are clean"
    weeks = [{"week": 1, "served_by": "heuristic 100%", "traffic": {}, "decision": "not registered", "report": earlier},
             {"week": 2, "served_by": "heuristic 100%", "traffic": {}, "decision": gate, "report": None}]
    print_summary(Pool(), weeks, started=0.0)
    out = capsys.readouterr().out
    assert "held-out evaluation, week" not in out and "o3-sim" not in out and "accuracy  " not in out
    assert "week 2: no held-out evaluation (stopped before validation by validated_episodes.clean_ratio: 50.0%" in out


def test_the_summary_reads_the_report_of_its_own_run_only(tmp_path):
    import json

    from agent_rl import settings
    from demos.run import read_report

    path = settings.artifact_dir("evaluation_report", "2026-11-23") / "report.json"
    path.write_text(json.dumps({"dagster_run_id": "email-run", "metrics": {}}))
    assert read_report("2026-11-23", "email-run") == {"dagster_run_id": "email-run", "metrics": {}}
    assert read_report("2026-11-23", "support-run") is None  # another run's leftover, maybe another agent's
    assert read_report("2026-11-30", "email-run") is None
