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

Ingest reads only regular files inside the export: symbolic links (to files or folders), hard links,
devices, fifos and archive members with absolute or `..` names are reported and skipped, so an export
cannot make ingest store a file from elsewhere on the machine. A report names the file and the reason,
never the file's contents or where a link points. In a CSV a row with a quote left open (or a stray
quote) is reported with its line number, and reading resumes at the next line that starts a row.
"""

from __future__ import annotations

import csv
import errno
import os
import re
import stat
import sys
import tarfile
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from difflib import SequenceMatcher
from email.parser import BytesHeaderParser
from email.policy import compat32
from email.utils import getaddresses, parseaddr
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, Field, ValidationError
from tqdm import tqdm

from agent_rl.environments.email.inbox.parse import ParseError, parse_email
from agent_rl.environments.email.inbox.store_interface import InboxStore
from agent_rl.environments.email.records import Email

BATCH = 2000
ENRON_DOMAIN = "enron.com"
_TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz")


class IngestError(ValueError):
    """The path itself cannot be ingested (missing, unsupported format, wrong CSV columns)."""


class IngestReport(BaseModel):
    seen: int = 0
    inserted: int = 0
    duplicates: int = 0
    skipped: list[tuple[str, str]] = Field(
        default_factory=list,
        description="(where, reason) per skipped file, link, archive member or CSV row; never its contents",
    )
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
    except ValidationError as exc:  # its text quotes the input: name the fields only
        fields = sorted({".".join(str(part) for part in error["loc"]) for error in exc.errors()})
        return None, f"not a valid email (fields: {', '.join(fields)})"
    except Exception as exc:  # noqa: BLE001 - one malformed file must never stop the ingest
        return None, f"cannot parse ({type(exc).__name__})"  # not str(exc): it may quote the contents
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


def _split_mailbox_path(parts: list[str] | tuple[str, ...]) -> tuple[str, str] | None:
    """`maildir/<user>/<folder...>/<n>.` -> (user, folder); None for files not inside a user folder."""
    parts = list(parts)
    if "maildir" in parts[:-1]:
        parts = parts[len(parts) - parts[::-1].index("maildir"):]
    if len(parts) < 2 or any(not part or part.startswith(".") for part in parts):
        return None
    return parts[0], "/".join(parts[1:-1])


_NOT_IN_MAILBOX = "not inside a mailbox folder (expected <user>/<folder>/<file>)"
_LINK_NOT_FOLLOWED = "links are not followed, only regular files are read"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "symbolic link"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "unknown file type"


def _not_regular(kind: str) -> str:
    return f"not a regular file ({kind}); only regular files are read"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _link_reason(link: str, root: str) -> str:
    """Why a symbolic link is skipped; says whether it leaves the export, never where it points."""
    if _inside(os.path.realpath(link), root):
        return f"symbolic link; {_LINK_NOT_FOLLOWED}"
    return "symbolic link pointing outside the export; links are not followed"


def _maildir_messages(export: Path) -> Iterator[RawMessage]:
    # The folder named on the command line is taken as it resolves; nothing below it is followed.
    root = Path(os.path.realpath(export))
    inner = root / "maildir"
    if inner.is_dir() and not inner.is_symlink():
        root = inner
    top = str(root)
    # fwalk hands out a descriptor per folder: files are opened relative to it, so no folder on the way
    # can be swapped for a link between the check and the read.
    for directory, subdirs, files, dir_fd in os.fwalk(top):
        rel_dir = os.path.relpath(directory, top)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        kept = []
        for name in sorted(subdirs):
            if name.startswith("."):
                continue
            try:
                is_link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            except OSError:
                continue  # gone since it was listed
            if is_link:
                yield RawMessage(rel_dir + name, "", "", error=_link_reason(os.path.join(directory, name), top))
            else:
                kept.append(name)
        subdirs[:] = kept
        for name in sorted(files):
            if name.startswith("."):
                continue
            rel = rel_dir + name
            try:
                mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
            except OSError as exc:
                yield RawMessage(rel, "", "", error=f"cannot read: {exc.strerror}")
                continue
            if stat.S_ISLNK(mode):
                yield RawMessage(rel, "", "", error=_link_reason(os.path.join(directory, name), top))
                continue
            if not stat.S_ISREG(mode):
                yield RawMessage(rel, "", "", error=_not_regular(_kind(mode)))
                continue
            where = _split_mailbox_path(rel.split("/"))
            if where is None:
                yield RawMessage(rel, "", "", error=_NOT_IN_MAILBOX)
                continue
            data, error = _read_regular(name, dir_fd)
            yield RawMessage(rel, where[0], where[1], data=data, error=error)


def _read_regular(name: str, dir_fd: int) -> tuple[bytes | None, str]:
    """The bytes of a regular file, refusing one that became a link or a fifo since it was listed."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, f"symbolic link; {_LINK_NOT_FOLLOWED}"
        return None, f"cannot read: {exc.strerror}"
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, _not_regular(_kind(info.st_mode))
        if info.st_nlink > 1:  # another name may lie outside the export: the file is not the export's alone
            return None, f"hard link (a file with {info.st_nlink} names); {_LINK_NOT_FOLLOWED}"
        try:
            return handle.read(), ""
        except OSError as exc:
            return None, f"cannot read: {exc.strerror}"


def _member_problem(member: tarfile.TarInfo) -> str:
    """Why an archive member is not read ("" for a regular file or a folder inside the archive's root)."""
    name = PurePosixPath(member.name)
    if member.name.startswith("/") or name.is_absolute():
        return "absolute member name; only paths inside the archive's root are read"
    if ".." in name.parts:
        return "member name climbs out of the archive's root ('..'); only paths inside it are read"
    if member.issym():
        return f"symbolic link; {_LINK_NOT_FOLLOWED}"
    if member.islnk():
        return f"hard link; {_LINK_NOT_FOLLOWED}"
    if member.isfile() or member.isdir():
        return ""
    kinds = {tarfile.CHRTYPE: "character device", tarfile.BLKTYPE: "block device", tarfile.FIFOTYPE: "fifo"}
    return _not_regular(kinds.get(member.type, "unknown member type"))


def _tar_messages(path: Path) -> Iterator[RawMessage]:
    try:
        # Stream mode ("r|*"): members are read in archive order, nothing is extracted to disk.
        with tarfile.open(path, "r|*") as archive:
            for member in archive:
                problem = _member_problem(member)
                if problem:
                    yield RawMessage(member.name, "", "", error=problem)
                    continue
                if member.isdir():
                    continue
                parts = PurePosixPath(member.name).parts
                where = _split_mailbox_path(parts)
                if where is None:
                    if not any(part.startswith(".") for part in parts):  # hidden files are not mail, as on disk
                        yield RawMessage(member.name, "", "", error=_NOT_IN_MAILBOX)
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
        try:
            header = next(csv.reader(handle, strict=True), [])
        except csv.Error as exc:
            raise IngestError(f"{path}: the CSV header row is malformed: {exc}") from exc
    if "file" not in header or "message" not in header:
        raise IngestError(f"{path}: CSV needs the Kaggle columns 'file' and 'message', found {header}")


# Where a Kaggle row starts: a `<user>/<folder>/<n>` file, a comma, then the message's first header line.
_CSV_ROW_START = re.compile(r'^"?[^\s",/.][^\s",]*/[^\s",]*"?,"?[!-9;-~]+:')


class _NumberedLines:
    """The file's lines as csv.reader pulls them, remembering the lines of the row being read.

    After a broken row its lines past the first are handed back and skipped up to the next line that starts
    a row, so one unterminated quote costs one email, not every email up to the next stray quote.
    """

    def __init__(self, lines: Iterable[str]) -> None:
        self._numbered = enumerate(lines, start=1)
        self._again: deque[tuple[int, str]] = deque()
        self.taken: list[tuple[int, str]] = []

    def __iter__(self) -> _NumberedLines:
        return self

    def __next__(self) -> str:
        item = self._again.popleft() if self._again else next(self._numbered)
        self.taken.append(item)
        return item[1]

    def row_lines(self) -> list[tuple[int, str]]:
        taken, self.taken = self.taken, []
        return taken

    def skip_to_row_start(self, lines: list[tuple[int, str]], pattern: re.Pattern | None) -> int | None:
        """Hand `lines` back, then drop lines up to one that matches `pattern`; the number of the last dropped."""
        self._again.extendleft(reversed(lines))
        last = None
        while True:
            item = self._again.popleft() if self._again else next(self._numbered, None)
            if item is None:
                return last
            if pattern is not None and pattern.match(item[1]):
                self._again.appendleft(item)
                return last
            last = item[0]


def _csv_messages(path: Path) -> Iterator[RawMessage]:
    with _open_csv(path) as handle:
        lines = _NumberedLines(handle)
        # strict: a quote left open or a stray quote is an error here, not a body cut short or merged silently.
        reader = csv.reader(lines, strict=True)
        header = next(reader, [])
        lines.row_lines()
        resync = _CSV_ROW_START if header[:1] == ["file"] else None
        while True:
            try:
                row = next(reader)
                problem = "" if len(row) in (0, len(header)) else f"{len(row)} columns, the header has {len(header)}"
            except StopIteration:
                return
            except csv.Error as exc:
                row, problem = [], str(exc)
            taken = lines.row_lines()
            if not taken:
                return
            start = taken[0][0]
            if problem:
                last = lines.skip_to_row_start(taken[1:], resync)
                span = f"line {start}" if last is None else f"lines {start}-{last}"
                reason = f"malformed CSV row at line {start}: {problem} (a quote left open, or a stray one); " \
                         f"{span} skipped"
                yield RawMessage(f"{path.name} line {start}", "", "", error=reason)
                continue
            if not row:
                continue  # a blank line
            fields = dict(zip(header, row))
            file = (fields.get("file") or "").strip()
            where = _split_mailbox_path(file.split("/")) if file else None
            message = fields.get("message")
            if where is None or message is None:
                reason = "CSV row without a <user>/<folder>/<n> file or without a message"
                yield RawMessage(file or f"{path.name} line {start}", "", "", error=reason)
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
