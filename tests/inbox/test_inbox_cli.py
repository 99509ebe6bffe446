"""`agent-rl inbox ...` through typer's CliRunner, on real SQLite stores."""

from __future__ import annotations

import json
import pytest
from tests.conftest import ENRON_CSV
from typer.testing import CliRunner

from agent_rl.environments.email.inbox.cli import app
from agent_rl.environments.email.inbox.store import open_inbox_store

runner = CliRunner()


def test_ingest_then_search_json(sqlite_url):
    result = runner.invoke(app, ["ingest", str(ENRON_CSV), "--db", sqlite_url, "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "seen 103, inserted 103, duplicates 0, skipped 0, inboxes 58" in result.output

    result = runner.invoke(
        app, ["search", "--inbox", "vince.kaminski@enron.com", "--db", sqlite_url, "--json", "intelligent", "insight"]
    )
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)
    assert [hit["message_id"] for hit in hits] == ["<1507470.1075856344785.JavaMail.evans@thyme>"]
    hit = hits[0]
    assert set(hit) == {"message_id", "subject", "sender", "date", "snippet"}
    assert hit["subject"] == "Seeking Intelligent Insight" and hit["sender"] == "vince.kaminski@enron.com"
    assert hit["date"] == "2000-08-22T07:48:00-07:00"
    assert "insight" in hit["snippet"].lower()

    again = runner.invoke(app, ["ingest", str(ENRON_CSV), "--db", sqlite_url, "--no-progress"])
    assert again.exit_code == 0 and "inserted 0, duplicates 103" in again.output


def test_search_text_output_and_no_hits(sqlite_url):
    runner.invoke(app, ["ingest", str(ENRON_CSV), "--db", sqlite_url, "--no-progress"])
    text = runner.invoke(app, ["search", "--inbox", "vince.kaminski@enron.com", "--db", sqlite_url, "insight"])
    assert text.exit_code == 0 and "Seeking Intelligent Insight" in text.output
    none = runner.invoke(app, ["search", "--inbox", "nobody@enron.com", "--db", sqlite_url, "--json", "insight"])
    assert none.exit_code == 0 and json.loads(none.output) == []


def test_search_rejects_bad_max_results(sqlite_url):
    result = runner.invoke(app, ["search", "--inbox", "a@b.c", "--db", sqlite_url, "--max-results", "11", "gas"])
    assert result.exit_code == 2
    assert "max_results must be between 1 and 10" in result.output


def test_ingest_skips_bad_files_but_succeeds(tmp_path, sqlite_url):
    folder = tmp_path / "maildir" / "allen-p" / "inbox"
    folder.mkdir(parents=True)
    (folder / "1.").write_text("From: a@enron.com\nSubject: fine\n\nhello")
    (folder / "2.").write_bytes(b"")
    result = runner.invoke(app, ["ingest", str(tmp_path / "maildir"), "--db", sqlite_url, "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "inserted 1" in result.output and "skipped allen-p/inbox/2.: empty file" in result.output


@pytest.mark.parametrize("name", ["missing", "notes.txt"])
def test_ingest_missing_or_unsupported_path_fails_clearly(tmp_path, sqlite_url, name):
    (tmp_path / "notes.txt").write_text("hello")
    result = runner.invoke(app, ["ingest", str(tmp_path / name), "--db", sqlite_url])
    assert result.exit_code != 0
    assert "error:" in result.output and name in result.output


def test_build_demo_fills_the_store(sqlite_url):
    pytest.importorskip("agent_rl.environments.email.inbox.demo_corpus")
    result = runner.invoke(app, ["build-demo", "--db", sqlite_url, "--seed", "3"])
    assert result.exit_code == 0, result.output
    store = open_inbox_store(sqlite_url)
    try:
        assert store.count() > 0 and len(store.inboxes()) > 1
        assert f"holds {store.count()} emails" in result.output
    finally:
        store.close()


def test_ingest_report_names_each_skipped_item_without_its_contents(tmp_path, sqlite_url):
    outside = tmp_path / "outside.txt"
    outside.write_text("From: hr@enron.com\nSubject: pins\n\nthe vault pin is 4321\n")
    folder = tmp_path / "maildir" / "allen-p" / "inbox"
    folder.mkdir(parents=True)
    (folder / "1.").write_text("From: a@enron.com\nSubject: fine\n\nhello")
    (folder / "2.").write_text("Dear diary, the door code is 8765\n\nmore")
    (folder / "3.").symlink_to(outside)
    result = runner.invoke(app, ["ingest", str(tmp_path / "maildir"), "--db", sqlite_url, "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "inserted 1" in result.output and "skipped 2," in result.output
    assert "skipped allen-p/inbox/2.: does not start with an RFC 822 header line" in result.output
    assert "skipped allen-p/inbox/3.: symbolic link pointing outside the export" in result.output
    for secret in ("8765", "Dear diary", "4321", str(outside)):
        assert secret not in result.output


def test_ingest_report_escapes_control_characters_in_member_names(tmp_path, sqlite_url):
    import io
    import tarfile

    tarball = tmp_path / "export.tar"
    with tarfile.open(tarball, "w") as archive:
        info = tarfile.TarInfo("maildir/allen-p/inbox/\x1b[2K\rskipped nothing.")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(info, io.BytesIO(b""))
    result = runner.invoke(app, ["ingest", str(tarball), "--db", sqlite_url, "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "skipped 1," in result.output and "\x1b" not in result.output and "\r" not in result.output
    assert "skipped maildir/allen-p/inbox/\\x1b[2K\\rskipped nothing.: symbolic link" in result.output
