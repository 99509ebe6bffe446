"""Where the world's store lives by default: its variable, its first name (warned), and a home made before."""

import pytest

from agent_rl import settings


def test_the_store_url_comes_from_its_variable_else_sqlite_under_the_home(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENT_RL_HOME", str(tmp_path))
    assert settings.store_url() == f"sqlite:///{tmp_path / 'world.db'}"
    monkeypatch.setenv("AGENT_RL_STORE_URL", "postgresql://db/world")
    assert settings.store_url() == "postgresql://db/world"


def test_the_old_variable_and_function_still_work_warned(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENT_RL_HOME", str(tmp_path))
    monkeypatch.setenv("AGENT_RL_INBOX_URL", "postgresql://db/inboxes")
    with pytest.warns(DeprecationWarning, match="AGENT_RL_INBOX_URL is now AGENT_RL_STORE_URL"):
        assert settings.store_url() == "postgresql://db/inboxes"
    monkeypatch.setenv("AGENT_RL_STORE_URL", "postgresql://db/world")  # the new name wins, nothing to warn about
    with pytest.warns(DeprecationWarning, match=r"now settings.store_url\(\)"):
        assert settings.inbox_url() == "postgresql://db/world"


def test_a_home_made_before_the_rename_keeps_its_store(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENT_RL_HOME", str(tmp_path))
    (tmp_path / "inbox.db").write_bytes(b"")
    assert settings.store_url() == f"sqlite:///{tmp_path / 'inbox.db'}"
    (tmp_path / "world.db").write_bytes(b"")
    assert settings.store_url() == f"sqlite:///{tmp_path / 'world.db'}"
