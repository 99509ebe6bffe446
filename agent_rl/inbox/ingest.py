"""Load a real mailbox export into an InboxStore: an Enron maildir folder, a .tar.gz of one, or the Kaggle CSV.

Which inbox an email belongs to is its mailbox owner's address, found per mailbox folder
(e.g. `allen-p`) in a first pass over the headers, so every email of one mailbox lands in the
same inbox:
  1. addresses that look like the folder's person (`allen-p` -> `p*.allen@...`, the surname
     matched loosely because Enron folders misspell some, e.g. `crandell-s` for sean.crandall)
     seen in From/To/Cc; a From in a sent folder counts twice. The most frequent one wins.
  2. otherwise the most frequent From address of the mailbox's sent folders (the owner sends those);
  3. otherwise the folder name itself if it is an address, else `<folder>@enron.com`.
A second pass parses and stores the emails; a file that cannot be read or parsed is reported in
`skipped` with the reason and never stops the run. Re-running adds nothing twice (store dedup).
"""

from __future__ import annotations

import csv
import os
import re
import sys
import tarfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from difflib import SequenceMatcher
from email.parser import BytesHeaderParser
from email.policy import compat32
from email.utils import getaddresses, parseaddr
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, Field
from tqdm import tqdm

from agent_rl.inbox.parse import ParseError, parse_email
from agent_rl.inbox.store import InboxStore
from agent_rl.records import Email

BATCH = 2000
ENRON_DOMAIN = "enron.com"
_TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz")


class IngestError(ValueError):
    """The path itself cannot be ingested (missing, unsupported format, wrong CSV columns)."""


class IngestReport(BaseModel):
    seen: int = 0
    inserted: int = 0
    duplicates: int = 0
    skipped: list[tuple[str, str]] = Field(default_factory=list, description="(file, reason) per skipped file")
    owners: dict[str, str] = Field(default_factory=dict, description="mailbox folder -> inbox address")


@dataclass(frozen=True)
class RawMessage:
    """One file of the export: where it sits and its bytes, or why it could not be read."""

    file: str
    mailbox: str
    folder: str
    data: bytes | None = None
    error: str = ""


def ingest(path: str | Path, store: InboxStore, progress: bool = True) -> IngestReport:
    """Ingest a maildir folder, a tarball of one, or a Kaggle `file,message` CSV into `store`."""
    messages = open_export(Path(path))
    owners = resolve_owners(messages())
    report = IngestReport(owners=owners)
    total = sum(1 for _ in messages()) if progress else None
    batch: list[Email] = []
    with tqdm(total=total, desc="ingest", unit="email", file=sys.stderr, disable=not progress) as bar:
        for raw in messages():
            report.seen += 1
            bar.update()
            email, reason = _to_email(raw, owners)
            if email is None:
                report.skipped.append((raw.file, reason))
                continue
            batch.append(email)
            if len(batch) >= BATCH:
                _store(store, batch, report)
                batch = []
    if batch:
        _store(store, batch, report)
    return report


def _to_email(raw: RawMessage, owners: dict[str, str]) -> tuple[Email | None, str]:
    if raw.data is None:
        return None, raw.error
    try:
        parsed = parse_email(raw.data, file=raw.file)
    except ParseError as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001 - one malformed file must never stop the ingest
        return None, f"{type(exc).__name__}: {exc}"
    inbox = owners.get(raw.mailbox) or fallback_owner(raw.mailbox)
    return parsed.for_inbox(inbox, folder=raw.folder or parsed.x_folder, file=raw.file), ""


def _store(store: InboxStore, batch: list[Email], report: IngestReport) -> None:
    added = store.add_emails(batch)
    report.inserted += added.inserted
    report.duplicates += added.duplicates


# -- sources -------------------------------------------------------------------------------------


def open_export(path: Path) -> Callable[[], Iterator[RawMessage]]:
    """A re-iterable reader for the export at `path` (ingest reads it twice: owners, then emails)."""
    if not path.exists():
        raise IngestError(f"{path}: no such file or directory")
    if path.is_dir():
        return lambda: _maildir_messages(path)
    name = path.name.lower()
    if name.endswith(_TAR_SUFFIXES):
        return lambda: _tar_messages(path)
    if name.endswith(".csv"):
        _check_csv_header(path)
        return lambda: _csv_messages(path)
    raise IngestError(f"{path}: unsupported export; expected a maildir folder, a .tar.gz/.tgz/.tar of one, or a .csv")


def _split_mailbox_path(parts: list[str]) -> tuple[str, str] | None:
    """`maildir/<user>/<folder...>/<n>.` -> (user, folder); None for files not inside a user folder."""
    if "maildir" in parts[:-1]:
        parts = parts[len(parts) - parts[::-1].index("maildir"):]
    if len(parts) < 2 or any(part.startswith(".") for part in parts):
        return None
    return parts[0], "/".join(parts[1:-1])


def _maildir_messages(root: Path) -> Iterator[RawMessage]:
    if (root / "maildir").is_dir():
        root = root / "maildir"
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        for name in sorted(files):
            full = Path(directory) / name
            rel = full.relative_to(root).as_posix()
            where = _split_mailbox_path(rel.split("/"))
            if where is None:
                if not name.startswith("."):
                    yield RawMessage(rel, "", "", error="not inside a mailbox folder (expected <user>/<folder>/<file>)")
                continue
            try:
                yield RawMessage(rel, where[0], where[1], data=full.read_bytes())
            except OSError as exc:
                yield RawMessage(rel, where[0], where[1], error=f"cannot read: {exc}")


def _tar_messages(path: Path) -> Iterator[RawMessage]:
    try:
        # Stream mode ("r|*"): members are read in archive order, nothing is extracted to disk.
        with tarfile.open(path, "r|*") as archive:
            for member in archive:
                if not member.isfile():
                    continue
                where = _split_mailbox_path(PurePosixPath(member.name).parts)
                if where is None:
                    continue
                try:
                    handle = archive.extractfile(member)
                    data = handle.read() if handle else b""
                except (tarfile.TarError, OSError) as exc:
                    yield RawMessage(member.name, where[0], where[1], error=f"cannot read from archive: {exc}")
                    continue
                yield RawMessage(member.name, where[0], where[1], data=data)
    except (tarfile.TarError, OSError, EOFError) as exc:
        yield RawMessage(str(path), "", "", error=f"archive unreadable from here on: {exc}")


def _open_csv(path: Path):
    csv.field_size_limit(2**31 - 1)  # Kaggle rows hold whole emails, far past the 128 KB default
    return path.open(newline="", encoding="utf-8", errors="surrogateescape")


def _check_csv_header(path: Path) -> None:
    with _open_csv(path) as handle:
        header = next(csv.reader(handle), [])
    if "file" not in header or "message" not in header:
        raise IngestError(f"{path}: CSV needs the Kaggle columns 'file' and 'message', found {header}")


def _csv_messages(path: Path) -> Iterator[RawMessage]:
    with _open_csv(path) as handle:
        for number, row in enumerate(csv.DictReader(handle), start=2):
            file = (row.get("file") or "").strip()
            where = _split_mailbox_path(file.split("/")) if file else None
            message = row.get("message")
            if where is None or message is None:
                reason = "CSV row without a <user>/<folder>/<n> file or without a message"
                yield RawMessage(file or f"{path.name} line {number}", "", "", error=reason)
                continue
            yield RawMessage(file, where[0], where[1], data=message.encode("utf-8", "surrogateescape"))


# -- owners --------------------------------------------------------------------------------------


def fallback_owner(mailbox: str) -> str:
    return mailbox.lower() if "@" in mailbox else f"{mailbox.lower()}@{ENRON_DOMAIN}"


def looks_like_owner(address: str, mailbox: str) -> bool:
    """Does `address` look like the person of an Enron folder name (`allen-p` ~ phillip.allen@...)?"""
    surname, _, initial = mailbox.lower().rpartition("-")
    initial = initial.rstrip("0123456789")[:1]
    local = address.partition("@")[0].lower()
    parts = [part for part in re.split(r"[._\-]+", local) if part]
    if not surname or not initial or len(parts) < 2 or not parts[0].startswith(initial):
        return False
    surnames = {surname, surname.replace("-", ""), *surname.split("-")}
    return any(SequenceMatcher(None, part, name).ratio() >= 0.8 for part in parts[1:] for name in surnames)


def _is_sent_folder(folder: str) -> bool:
    return "sent" in folder.lower()


def resolve_owners(messages: Iterator[RawMessage]) -> dict[str, str]:
    """Mailbox folder -> owner address, by the rules in the module docstring."""
    lookalikes: dict[str, Counter[str]] = defaultdict(Counter)
    sent_from: dict[str, Counter[str]] = defaultdict(Counter)
    mailboxes: set[str] = set()
    parser = BytesHeaderParser(policy=compat32)
    for raw in messages:
        if raw.data is None or not raw.mailbox:
            continue
        mailboxes.add(raw.mailbox)
        try:
            headers = parser.parsebytes(raw.data)
            sender = parseaddr(str(headers.get("From", "")))[1].lower()
            others = [a.lower() for _, a in getaddresses([str(v) for v in headers.get_all("To", []) + headers.get_all("Cc", [])])]
        except Exception:  # noqa: BLE001 - malformed headers only cost this file its vote
            continue
        sent = _is_sent_folder(raw.folder)
        if sent and sender:
            sent_from[raw.mailbox][sender] += 1
        for address, weight in [(sender, 2 if sent else 1), *((a, 1) for a in others)]:
            if address and looks_like_owner(address, raw.mailbox):
                lookalikes[raw.mailbox][address] += weight
    owners = {}
    for mailbox in sorted(mailboxes):
        for votes in (lookalikes[mailbox], sent_from[mailbox]):
            if votes:
                # Most votes first; ties go to the alphabetically first address, so runs agree.
                owners[mailbox] = min(votes.items(), key=lambda item: (-item[1], item[0]))[0]
                break
        else:
            owners[mailbox] = fallback_owner(mailbox)
    return owners
