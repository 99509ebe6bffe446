"""`agent-rl arbiter serve` refuses bad settings before it binds a port, naming what was wrong."""

from __future__ import annotations

from typer.testing import CliRunner

from agent_rl.cli import app


def test_a_turn_limit_below_one_is_refused_with_the_setting_named():
    result = CliRunner().invoke(app, ["arbiter", "serve", "--max-new-tokens", "0", "--port", "1"])
    assert result.exit_code == 2
    assert "invalid arbiter configuration" in result.output and "max_new_tokens" in result.output


def test_bad_default_routing_json_is_refused():
    result = CliRunner().invoke(app, ["arbiter", "serve", "--default-routing", "{heuristic", "--port", "1"])
    assert result.exit_code == 2 and "not valid JSON" in result.output


def test_vllm_serving_without_an_adapter_folder_is_refused():
    result = CliRunner().invoke(app, ["arbiter", "serve", "--vllm", '{"base_url": "http://gpu:8000/v1"}', "--port", "1"])
    assert result.exit_code == 2
    assert "invalid arbiter configuration" in result.output and "adapter_dir" in result.output
