"""Ingest of the real Enron sample (Kaggle CSV, annotated JSON) and of maildir trees and tarballs built from it."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import tarfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from tests.conftest import ENRON_ANNOTATED, ENRON_CSV

from agent_rl.environments.email.inbox.ingest import IngestError, ingest, looks_like_owner, resolve_owners, RawMessage
from agent_rl.environments.email.inbox.parse import parse_email
from agent_rl.environments.email.inbox.store import open_inbox_store

csv.field_size_limit(2**31 - 1)
MALFORMED = {
    "garbage": bytes(range(256)) * 8,
    "empty": b"",
    "header_only": b"Message-ID: <cut@x>\nFrom: someone@enron.com\nSubject: cut off here",
}


def csv_rows() -> list[dict[str, str]]:
    with ENRON_CSV.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture
def store(store_url):
    opened = open_inbox_store(store_url)
    yield opened
    opened.close()


@pytest.fixture
def sqlite_store(sqlite_url):
    opened = open_inbox_store(sqlite_url)
    yield opened
    opened.close()


def distinctive_word(body: str) -> str | None:
    """A long plain word from the start of the body (space-delimited, so every tokenizer sees it whole)."""
    words = [w for w in body[:3000].split() if w.isascii() and w.isalpha() and len(w) >= 7]
    return max(words, key=len) if words else None


def test_kaggle_csv_lands_with_correct_headers_and_is_searchable(store):
    rows = csv_rows()
    report = ingest(ENRON_CSV, store, progress=False)
    assert (report.seen, report.inserted, report.duplicates, report.skipped) == (len(rows), len(rows), 0, [])
    assert len(report.owners) == 58
    assert report.owners["kaminski-v"] == "vince.kaminski@enron.com"
    assert report.owners["crandell-s"] == "sean.crandall@enron.com"  # folder name misspells him
    assert report.owners["skilling-j"] == "skilling-j@enron.com"  # nothing in his one email names him

    kaminski = store.read("vince.kaminski@enron.com", "<1507470.1075856344785.JavaMail.evans@thyme>")
    assert kaminski.subject == "Seeking Intelligent Insight"
    assert kaminski.sender == "vince.kaminski@enron.com"
    assert kaminski.to == ("vkaminski@aol.com",)
    assert kaminski.date == datetime(2000, 8, 22, 7, 48, tzinfo=timezone(timedelta(hours=-7)))
    assert kaminski.folder == "discussion_threads" and kaminski.file == "kaminski-v/discussion_threads/790."

    dinner = store.read("jeff.dasovich@enron.com", "<1310258.1075843013191.JavaMail.evans@thyme>")
    assert dinner.subject == "VC dinner update - delete if not attending"
    assert dinner.sender == "owner-evmba_social@haas.berkeley.edu"
    assert dinner.cc == ("tibbetts@haas.berkeley.edu", "engel@haas.berkeley.edu")
    assert dinner.date == datetime(2000, 10, 31, 2, 21, tzinfo=timezone.utc)
    assert "Sevin Rosen Funds" in dinner.body

    # Every email is found again by searching its inbox for a distinctive word of it.
    checked = 0
    for row in rows:
        parsed = parse_email(row["message"]).email
        word = distinctive_word(parsed.body)
        if word is None:
            continue
        inbox = report.owners[row["file"].split("/")[0]]
        hits = store.search(inbox, [word])
        assert parsed.message_id in {hit.message_id for hit in hits}, (row["file"], word)
        checked += 1
    assert checked > 80

    again = ingest(ENRON_CSV, store, progress=False)
    assert (again.inserted, again.duplicates) == (0, len(rows))
    assert store.count() == len(rows)


def write_maildir(root: Path) -> list[dict[str, str]]:
    """The CSV's messages as maildir/<user>/<folder>/<n>. files, plus three malformed files."""
    rows = csv_rows()
    for row in rows:
        target = root / "maildir" / row["file"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(row["message"], encoding="utf-8")
    for name, data in MALFORMED.items():
        (root / "maildir" / "allen-p" / "broken").mkdir(parents=True, exist_ok=True)
        (root / "maildir" / "allen-p" / "broken" / f"{name}.").write_bytes(data)
    (root / "maildir" / ".DS_Store").write_bytes(b"\x00\x01")  # hidden files are not mail
    return rows


def assert_malformed_skipped(report, prefix: str) -> None:
    reasons = dict(report.skipped)
    assert set(reasons) == {f"{prefix}allen-p/broken/{name}." for name in MALFORMED}
    assert "NUL" in reasons[f"{prefix}allen-p/broken/garbage."]
    assert reasons[f"{prefix}allen-p/broken/empty."] == "empty file"
    assert "header-only" in reasons[f"{prefix}allen-p/broken/header_only."]


def test_maildir_folder_with_malformed_files(tmp_path, sqlite_store):
    rows = write_maildir(tmp_path / "export")
    report = ingest(tmp_path / "export", sqlite_store, progress=False)
    assert report.seen == len(rows) + len(MALFORMED)
    assert report.inserted == len(rows)
    assert_malformed_skipped(report, prefix="")
    sent = sqlite_store.read("richard.sanders@enron.com", parse_email(rows[3]["message"]).email.message_id)
    assert sent is not None and sent.folder == "sent" and sent.file == "sanders-r/sent/807."
    # Pointing at the maildir folder itself works the same; nothing is added twice.
    assert ingest(tmp_path / "export" / "maildir", sqlite_store, progress=False).inserted == 0


def test_tarball_of_maildir_streams_the_same_emails(tmp_path, store):
    rows = write_maildir(tmp_path / "export")
    tarball = tmp_path / "enron_mail.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        archive.add(tmp_path / "export" / "maildir", arcname="enron_mail_20150507/maildir")
    report = ingest(tarball, store, progress=True)
    assert report.inserted == len(rows)
    assert_malformed_skipped(report, prefix="enron_mail_20150507/maildir/")
    assert report.owners["sanders-r"] == "richard.sanders@enron.com"
    assert store.count() == len(rows)
    assert ingest(tarball, store, progress=False).inserted == 0


def test_corrupt_tarball_reports_instead_of_crashing(tmp_path, sqlite_store):
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00 definitely not gzip")
    report = ingest(broken, sqlite_store, progress=False)
    assert report.inserted == 0 and len(report.skipped) == 1
    assert "archive unreadable" in report.skipped[0][1]


def test_annotated_enron_emails_keep_their_answers(tmp_path, store):
    """The 48 annotated emails, filed by X-Origin: extractive answers from the body survive ingest."""
    documents = [p for item in json.loads(ENRON_ANNOTATED.read_text())["data"] for p in item["paragraphs"]]
    assert len(documents) == 48
    for doc in documents:
        origin = re.search(r"^X-Origin: (.+)$", doc["context"], re.M).group(1).strip().lower()
        target = tmp_path / "maildir" / origin / "annotated" / f"{doc['document_id']}."
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(doc["context"], encoding="utf-8")
    report = ingest(tmp_path / "maildir", store, progress=False)
    assert report.skipped == [] and report.inserted + report.duplicates == 48

    answers_checked = 0
    for doc in documents:
        context = doc["context"]
        parsed = parse_email(context).email
        owner = report.owners[re.search(r"^X-Origin: (.+)$", context, re.M).group(1).strip().lower()]
        stored = store.read(owner, parsed.message_id)
        assert stored is not None and stored.subject == parsed.subject and stored.date == parsed.date
        body_start = context.index("\n\n")
        for qa in doc["qas"]:
            for answer in qa["answers"]:
                if answer["answer_start"] <= body_start or context[answer["answer_start"]:answer["answer_end"]] != answer["text"]:
                    continue
                assert " ".join(answer["text"].split()) in " ".join(stored.body.split())
                answers_checked += 1
    assert answers_checked > 150


def test_owner_rules():
    assert looks_like_owner("phillip.allen@enron.com", "allen-p")
    assert looks_like_owner("sean.crandall@enron.com", "crandell-s")
    assert looks_like_owner("patrice.mims@enron.com", "mims-thurston-p")
    assert looks_like_owner("w.williams.iii@enron.com", "williams-w3")
    assert not looks_like_owner("brad.mcsherry@enron.com", "allen-p")
    assert not looks_like_owner("allen@enron.com", "allen-p")

    def raw(mailbox, folder, headers):
        return RawMessage(f"{mailbox}/{folder}/1.", mailbox, folder, data=(headers + "\n\nbody").encode())

    owners = resolve_owners(iter([
        # An assistant's address in a sent folder, but the owner's look-alike address wins.
        raw("lay-k", "sent", "From: rosalee.fleming@enron.com\nTo: kenneth.lay@enron.com"),
        raw("lay-k", "inbox", "From: x@y.com\nTo: kenneth.lay@enron.com"),
        # No look-alike: the sent folder's From.
        raw("symes-k", "sent_items", "From: kate.symes@enron.com\nTo: a@b.com"),
        raw("zz-q", "inbox", "From: a@b.com\nTo: c@d.com"),
        raw("ops@example.org", "inbox", "From: a@b.com\nTo: ops@example.org"),
    ]))
    assert owners == {
        "lay-k": "kenneth.lay@enron.com",
        "symes-k": "kate.symes@enron.com",
        "zz-q": "zz-q@enron.com",
        "ops@example.org": "ops@example.org",
    }


def test_unsupported_paths_are_clear_errors(tmp_path, sqlite_store):
    with pytest.raises(IngestError, match="no such file or directory"):
        ingest(tmp_path / "missing", sqlite_store, progress=False)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(IngestError, match="unsupported export"):
        ingest(tmp_path / "notes.txt", sqlite_store, progress=False)
    (tmp_path / "wrong.csv").write_text("path,body\na,b\n")
    with pytest.raises(IngestError, match="'file' and 'message'"):
        ingest(tmp_path / "wrong.csv", sqlite_store, progress=False)


def test_csv_with_bad_rows_keeps_the_good_ones(tmp_path, sqlite_store):
    rows = csv_rows()[:5]
    path = tmp_path / "emails.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "message"])
        for row in rows:
            writer.writerow([row["file"], row["message"]])
        writer.writerow(["allen-p/inbox/9.", "not an email at all"])
        writer.writerow(["no-folder", rows[0]["message"]])
    report = ingest(path, sqlite_store, progress=False)
    assert report.inserted == 5 and report.seen == 7
    assert [file for file, _ in report.skipped] == ["allen-p/inbox/9.", "no-folder"]


# -- ingest reads only the export ----------------------------------------------------------------

GOOD = "Message-ID: <good@inside>\nFrom: phillip.allen@enron.com\nTo: a@enron.com\nSubject: hi\n\nhello\n"
SECRET = "Message-ID: <secret@outside>\nFrom: hr@enron.com\nTo: x@enron.com\nSubject: salary table\n\nconfidential-payload-7731\n"


def test_maildir_links_out_of_the_export_are_reported_not_followed(tmp_path, sqlite_store):
    outside = tmp_path / "outside"
    (outside / "inbox").mkdir(parents=True)
    (outside / "secret.").write_text(SECRET)
    (outside / "inbox" / "1.").write_text(SECRET)
    box = tmp_path / "export" / "maildir" / "allen-p"
    (box / "inbox").mkdir(parents=True)
    (box / "inbox" / "1.").write_text(GOOD)
    (box / "inbox" / "2.").symlink_to(outside / "secret.")  # a file link leaving the export
    (box / "stolen").symlink_to(outside)  # a folder link leaving the export
    (tmp_path / "export" / "maildir" / "hr-x").symlink_to(outside)  # a whole "mailbox" outside
    (box / "inbox" / "3.").symlink_to(box / "inbox" / "1.")  # inside, but links are never followed

    report = ingest(tmp_path / "export", sqlite_store, progress=False)
    reasons = dict(report.skipped)
    assert set(reasons) == {"allen-p/inbox/2.", "allen-p/stolen", "hr-x", "allen-p/inbox/3."}
    for name in ("allen-p/inbox/2.", "allen-p/stolen", "hr-x"):
        assert "symbolic link" in reasons[name] and "outside the export" in reasons[name], reasons[name]
    assert "symbolic link" in reasons["allen-p/inbox/3."] and "outside" not in reasons["allen-p/inbox/3."]
    assert report.inserted == 1 and sqlite_store.count() == 1
    assert "hr-x" not in report.owners
    assert not any("confidential" in reason or str(outside) in reason for reason in reasons.values())


def test_maildir_hard_links_are_reported_not_read(tmp_path, sqlite_store):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.").write_text(SECRET)
    box = tmp_path / "export" / "maildir" / "allen-p" / "inbox"
    box.mkdir(parents=True)
    (box / "1.").write_text(GOOD)
    os.link(outside / "secret.", box / "2.")  # the same file under a second name, inside the export

    report = ingest(tmp_path / "export", sqlite_store, progress=False)
    reasons = dict(report.skipped)
    assert set(reasons) == {"allen-p/inbox/2."} and "hard link" in reasons["allen-p/inbox/2."]
    assert report.inserted == 1 and sqlite_store.count() == 1
    assert not any("confidential" in reason or str(outside) in reason for reason in reasons.values())


def test_maildir_whose_maildir_folder_is_a_link_outside_reads_nothing_from_there(tmp_path, sqlite_store):
    real = tmp_path / "elsewhere" / "allen-p" / "inbox"
    real.mkdir(parents=True)
    (real / "1.").write_text(SECRET)
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "maildir").symlink_to(tmp_path / "elsewhere")
    report = ingest(tmp_path / "export", sqlite_store, progress=False)
    assert report.inserted == 0 and sqlite_store.count() == 0
    assert [file for file, _ in report.skipped] == ["maildir"]


@pytest.mark.timeout(60)
def test_maildir_fifo_is_reported_instead_of_blocking(tmp_path, sqlite_store):
    box = tmp_path / "maildir" / "allen-p" / "inbox"
    box.mkdir(parents=True)
    (box / "1.").write_text(csv_rows()[0]["message"])
    os.mkfifo(box / "2.")
    report = ingest(tmp_path / "maildir", sqlite_store, progress=False)
    assert report.inserted == 1
    assert report.skipped == [("allen-p/inbox/2.", "not a regular file (fifo); only regular files are read")]


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, linkname, len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def test_tarball_members_that_are_not_regular_files_inside_the_root_are_reported(tmp_path, sqlite_store):
    members = [
        _member("export/maildir/allen-p/inbox/", tarfile.DIRTYPE),
        _member("export/maildir/allen-p/inbox/1.", data=GOOD.encode()),
        _member("/allen-p/inbox/2.", data=SECRET.encode()),  # absolute: once stored in inbox "/@enron.com"
        _member("export/maildir/../../etc/inbox/3.", data=SECRET.encode()),
        _member("export/maildir/allen-p/inbox/4.", tarfile.SYMTYPE, linkname="/etc/passwd"),
        _member("export/maildir/allen-p/inbox/5.", tarfile.LNKTYPE, linkname="/etc/shadow"),
        _member("export/maildir/allen-p/inbox/6.", tarfile.CHRTYPE),
        _member("export/maildir/allen-p/inbox/7.", tarfile.BLKTYPE),
        _member("export/maildir/allen-p/inbox/8.", tarfile.FIFOTYPE),
        _member("/abs-dir", tarfile.DIRTYPE),
    ]
    tarball = tmp_path / "export.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data))

    report = ingest(tarball, sqlite_store, progress=False)
    assert report.inserted == 1 and sqlite_store.count() == 1
    assert sqlite_store.inboxes() == ["phillip.allen@enron.com"]
    assert set(report.owners) == {"allen-p"}
    reasons = dict(report.skipped)
    assert len(report.skipped) == 8
    assert "absolute" in reasons["/allen-p/inbox/2."] and "absolute" in reasons["/abs-dir"]
    assert "'..'" in reasons["export/maildir/../../etc/inbox/3."]
    assert "symbolic link" in reasons["export/maildir/allen-p/inbox/4."]
    assert "hard link" in reasons["export/maildir/allen-p/inbox/5."]
    assert "character device" in reasons["export/maildir/allen-p/inbox/6."]
    assert "block device" in reasons["export/maildir/allen-p/inbox/7."]
    assert "fifo" in reasons["export/maildir/allen-p/inbox/8."]
    assert not any("passwd" in r or "shadow" in r or "confidential" in r for r in reasons.values())


def _kaggle_csv(path: Path, rows: list[dict[str, str]], break_row: int | None = None) -> int | None:
    """Write rows the way the Kaggle file has them; `break_row` loses its closing quote. Returns its line."""
    line, broken_at = 2, None
    with path.open("w", newline="", encoding="utf-8") as handle:
        handle.write("file,message\n")
        for index, row in enumerate(rows):
            quoted = '"' + row["message"].replace('"', '""') + ('' if index == break_row else '"')
            if index == break_row:
                broken_at = line
            handle.write(f"{row['file']},{quoted}\n")
            line += quoted.count("\n") + 1
    return broken_at


@pytest.mark.parametrize("break_row", [1, 4])
def test_csv_row_with_an_unterminated_quote_is_reported_and_the_rest_ingests(tmp_path, sqlite_store, break_row):
    rows = csv_rows()[:5]
    path = tmp_path / "emails.csv"
    line = _kaggle_csv(path, rows, break_row=break_row)
    report = ingest(path, sqlite_store, progress=False)
    assert [file for file, _ in report.skipped] == [f"emails.csv line {line}"]
    assert f"line {line}" in report.skipped[0][1] and "quote" in report.skipped[0][1]
    assert report.inserted == 4 and sqlite_store.count() == 4
    for index, row in enumerate(rows):
        if index == break_row:
            continue
        expected = parse_email(row["message"]).email
        stored = sqlite_store.read(report.owners[row["file"].split("/")[0]], expected.message_id)
        # every other email whole: nothing of a neighbour merged into its body
        assert stored is not None and stored.body == expected.body, row["file"]


def test_csv_stray_quote_does_not_cut_a_body_silently(tmp_path, sqlite_store):
    rows = csv_rows()[:3]
    path = tmp_path / "emails.csv"
    _kaggle_csv(path, rows)
    text = path.read_text(encoding="utf-8")
    row_start = text.index(f"\n{rows[1]['file']},") + 1
    after_message_id = text.index("\n", row_start) + 1
    path.write_text(text[:after_message_id] + 'Date: "odd" quote\n' + text[after_message_id:], encoding="utf-8")
    report = ingest(path, sqlite_store, progress=False)
    line = text[:row_start].count("\n") + 1
    assert [file for file, _ in report.skipped] == [f"emails.csv line {line}"]
    assert report.inserted == 2 and sqlite_store.count() == 2
