"""API key configuration: `arbiter new-key` writes only hashes, and a bad key list is refused before serving,
naming the source and the entry (never a token)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agent_rl.arbiter.keys import ApiKey, KeyConfigError, KeyRing, hash_token
from agent_rl.cli import app


def test_new_key_adds_a_hashed_entry_and_prints_the_token_once(tmp_path):
    keys_file = tmp_path / "conf" / "keys.json"
    runner = CliRunner()
    first = runner.invoke(app, ["arbiter", "new-key", "--id", "support-bot", "--tenant", "acme",
                                "--context", "alice@acme.example", "--context", "bob@acme.example", "--keys-file", str(keys_file)])
    assert first.exit_code == 0, first.output
    token = first.stdout.strip().splitlines()[-1]
    second = runner.invoke(app, ["arbiter", "new-key", "--id", "replayer", "--tenant", "ops", "--context", "*",
                                 "--replay", "--keys-file", str(keys_file)])
    assert second.exit_code == 0, second.output

    text = keys_file.read_text()
    assert token not in text  # only the hash is kept
    ring = KeyRing.load(path=keys_file)
    key = ring.find(token)
    assert key is not None and key.id == "support-bot" and key.tenant == "acme" and not key.replay
    assert key.may_use("alice@acme.example") and not key.may_use("carol@acme.example")
    replayer = next(k for k in ring.keys() if k.id == "replayer")
    assert replayer.replay and replayer.may_use("anyone@anywhere.example")

    again = runner.invoke(app, ["arbiter", "new-key", "--id", "replayer", "--tenant", "ops", "--context", "*",
                                "--keys-file", str(keys_file)])
    assert again.exit_code == 2 and "'replayer' is given twice" in again.output
    assert keys_file.read_text() == text  # nothing half-written


def test_new_key_refuses_a_bad_entry_naming_the_field(tmp_path):
    result = CliRunner().invoke(app, ["arbiter", "new-key", "--id", "bad id!", "--tenant", "acme", "--context", "a@b.example",
                                      "--keys-file", str(tmp_path / "keys.json")])
    assert result.exit_code == 2 and "id:" in result.output
    assert not (tmp_path / "keys.json").exists()


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("{not json", "not valid JSON"),
        ('{"id": "x"}', "expected a list"),
        ('[{"id": "a", "sha256": "abc", "tenant": "t", "contexts": ["*"]}]', "0.sha256"),
        ('[{"id": "a", "sha256": "' + "0" * 64 + '", "tenant": "t", "contexts": []}]', "0.contexts"),
        ('[{"id": "a", "sha256": "' + "0" * 64 + '", "tenant": " ", "contexts": ["*"]}]', "0.tenant"),
        ('[{"id": "a", "sha256": "' + "0" * 64 + '", "tenant": "t", "contexts": ["*"], "admin": true}]', "0.admin"),
    ],
)
def test_a_bad_key_file_is_refused_naming_the_file_and_entry(tmp_path, content, named):
    path = tmp_path / "keys.json"
    path.write_text(content)
    with pytest.raises(KeyConfigError, match=named) as raised:
        KeyRing.load(path=path)
    assert str(path) in str(raised.value)


def test_duplicate_tokens_are_refused():
    entry = {"sha256": hash_token("same-token"), "tenant": "t", "contexts": ["*"]}
    with pytest.raises(KeyConfigError, match="same sha256"):
        KeyRing([ApiKey(id="a", **entry), ApiKey(id="b", **entry)])


def test_environment_keys_and_precedence(tmp_path):
    token, key = ApiKey.create("env-key", "acme", ["a@b.example"])
    environ = {"AGENT_RL_API_KEYS": json.dumps([key.model_dump(mode="json")])}
    assert KeyRing.load(environ=environ).find(token) == key
    assert KeyRing.load(keys=(), environ=environ).find(token) is None  # explicit keys win
    missing = tmp_path / "absent.json"
    with pytest.raises(KeyConfigError, match="cannot be read"):
        KeyRing.load(environ={**environ, "AGENT_RL_API_KEYS_FILE": str(missing)})
    assert len(KeyRing.load(environ={})) == 0


def test_serve_refuses_a_bad_key_file_before_binding(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text('[{"id": "a"}]')
    result = CliRunner().invoke(app, ["arbiter", "serve", "--api-keys", str(path), "--port", "1"])
    assert result.exit_code == 2 and str(path) in result.output and "sha256" in result.output


def test_a_revoked_key_is_refused_by_the_running_arbiter_without_a_restart(tmp_path, sqlite_url):
    import time

    import httpx

    from agent_rl.arbiter.config import ArbiterConfig
    from agent_rl.arbiter.server import running_arbiter

    keys_file = tmp_path / "keys.json"
    runner = CliRunner()
    tokens = {}
    for key_id in ("bot", "other"):
        made = runner.invoke(app, ["arbiter", "new-key", "--id", key_id, "--tenant", "acme", "--context", "*",
                                   "--keys-file", str(keys_file)])
        assert made.exit_code == 0, made.output
        tokens[key_id] = made.stdout.strip().splitlines()[-1]

    def models(token: str, url: str) -> int:
        return httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {token}"}, timeout=30).status_code

    with running_arbiter(ArbiterConfig(pool_url=sqlite_url, api_keys_file=keys_file), log_level="warning") as url:
        assert models(tokens["bot"], url) == 200 and models(tokens["other"], url) == 200
        revoked = runner.invoke(app, ["arbiter", "revoke-key", "--id", "bot", "--keys-file", str(keys_file)])
        assert revoked.exit_code == 0, revoked.output
        assert tokens["bot"] not in keys_file.read_text()
        deadline = time.monotonic() + 10
        while models(tokens["bot"], url) != 401 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert models(tokens["bot"], url) == 401 and models(tokens["other"], url) == 200
        keys_file.write_text("{not json")  # a hand edit gone wrong keeps the last good keys
        time.sleep(1.2)
        assert models(tokens["other"], url) == 200 and models(tokens["bot"], url) == 401
    missing = runner.invoke(app, ["arbiter", "revoke-key", "--id", "nobody", "--keys-file", str(tmp_path / "k2.json")])
    assert missing.exit_code == 2 and "cannot be read" in missing.output
