"""Turn one raw RFC 822 message (an Enron maildir file, a CSV cell, any mailbox export) into an Email.

Parsing is forgiving where real mail is messy (odd dates, bad charsets, HTML-only bodies) and strict
only where the input is not an email at all: that raises ParseError with the reason.
"""

from __future__ import annotations

import codecs
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from email import message_from_bytes
from email.header import Header, decode_header
from email.message import Message
from email.policy import compat32
from email.utils import getaddresses, parseaddr, parsedate_to_datetime
from html.parser import HTMLParser

from agent_rl.environments.email.records import Email

# A header line: a field name of printable ASCII except ':' and space, then ':'.
_HEADER_LINE = re.compile(rb"^[!-9;-~]+:")
_KNOWN_HEADERS = ("message-id", "from", "to", "date", "subject")
_WHITESPACE = re.compile(r"\s+")


class ParseError(ValueError):
    """The input is not a parseable email; the message says why."""


@dataclass(frozen=True)
class ParsedEmail:
    """The Email (its `inbox` still empty) plus the Enron X- headers ingest uses to find the mailbox owner."""

    email: Email
    x_from: str = ""
    x_to: str = ""
    x_origin: str = ""
    x_folder: str = ""

    def for_inbox(self, inbox: str, folder: str | None = None, file: str | None = None) -> Email:
        update: dict[str, str] = {"inbox": inbox}
        if folder is not None:
            update["folder"] = folder
        if file is not None:
            update["file"] = file
        return self.email.model_copy(update=update)


def parse_email(raw: bytes | str, file: str = "") -> ParsedEmail:
    """Parse one message; `file` is only used to label the result and errors."""
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
    data = data.replace(b"\r\n", b"\n")
    _check_looks_like_email(data)
    msg = message_from_bytes(data, policy=compat32)
    if not any(msg.get(name) for name in _KNOWN_HEADERS):
        raise ParseError("no From, To, Date, Subject or Message-ID header")

    message_id = _header(msg, "Message-ID").strip() or _stable_id(data)
    email = Email(
        message_id=message_id,
        inbox="",
        date=parse_date(_header(msg, "Date")),
        subject=_WHITESPACE.sub(" ", _header(msg, "Subject")).strip(),
        sender=_address(_header(msg, "From")),
        to=_addresses(msg, "To"),
        cc=_addresses(msg, "Cc"),
        bcc=_addresses(msg, "Bcc"),
        body=_body(msg).replace("\x00", ""),
        folder=_header(msg, "X-Folder").strip(),
        file=file,
    )
    return ParsedEmail(
        email=email,
        x_from=_header(msg, "X-From").strip(),
        x_to=_header(msg, "X-To").strip(),
        x_origin=_header(msg, "X-Origin").strip(),
        x_folder=email.folder,
    )


def parse_date(value: str) -> datetime | None:
    """RFC 2822 date (Enron's trailing "(PDT)" comments are fine); None when missing or unparseable."""
    value = value.strip()
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    # A date without zone ("-0000" or none) is taken as UTC so every stored date is comparable.
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _check_looks_like_email(data: bytes) -> None:
    if not data.strip():
        raise ParseError("empty file")
    head, sep, _ = data.lstrip(b"\n").partition(b"\n\n")
    if b"\x00" in head:
        raise ParseError("binary data (NUL bytes) in the header section")
    first = head.split(b"\n", 1)[0]
    if not (_HEADER_LINE.match(first) or first.startswith(b"From ")):
        # The reason names the problem, not the bytes: reports and logs must not quote a file's contents.
        raise ParseError("does not start with an RFC 822 header line")
    if not sep:
        raise ParseError("header-only message: no blank line and no body after the headers")


def _stable_id(data: bytes) -> str:
    """A Message-ID for messages without one: the same content always gets the same id."""
    digest = hashlib.sha256(data.strip()).hexdigest()[:32]
    return f"<{digest}@agent-rl.generated>"


def _header(msg: Message, name: str) -> str:
    value = msg.get(name)
    if value is None:
        return ""
    if isinstance(value, Header):  # raw 8-bit bytes in the header: decode them first
        value = "".join(_decode_chunk(chunk, charset) for chunk, charset in decode_header(value))
    try:
        chunks = decode_header(value)  # RFC 2047 encoded words
    except (ValueError, TypeError, LookupError):  # pragma: no cover - malformed encoded words
        chunks = [(str(value), None)]
    return "".join(_decode_chunk(chunk, charset) for chunk, charset in chunks).replace("\x00", "")


def _decode_chunk(chunk: bytes | str, charset: str | None) -> str:
    if isinstance(chunk, str):
        return chunk
    if charset and charset != "unknown-8bit":
        try:
            return chunk.decode(charset, errors="replace")
        except LookupError:
            pass  # an unknown charset name: guess below like raw 8-bit bytes
    # Raw 8-bit header bytes: most often UTF-8, else a Windows code page.
    try:
        return chunk.decode("utf-8")
    except UnicodeDecodeError:
        return chunk.decode("cp1252", errors="replace")


def _address(value: str) -> str:
    _, address = parseaddr(value)
    return (address or value).strip().lower()


def _addresses(msg: Message, name: str) -> tuple[str, ...]:
    values = [_header(msg, name)] if msg.get(name) is not None else []
    seen: dict[str, None] = {}
    for _, address in getaddresses(values):
        address = address.strip().lower()
        if address:
            seen.setdefault(address, None)
    return tuple(seen)


def _body(msg: Message) -> str:
    """The text/plain part (first one that is not an attachment); stripped HTML when there is none."""
    plain: str | None = None
    html: str | None = None
    for part in msg.walk():
        if part.is_multipart():
            continue
        if (part.get("Content-Disposition") or "").lower().startswith("attachment"):
            continue
        content_type = part.get_content_type()
        if content_type == "text/plain" and plain is None:
            plain = _decode_part(part)
        elif content_type == "text/html" and html is None:
            html = _decode_part(part)
    if plain is not None:
        return plain
    if html is not None:
        return html_to_text(html)
    return ""


def _decode_part(part: Message) -> str:
    payload = part.get_payload(decode=True)
    if payload is None:
        return ""
    if isinstance(payload, str):  # pragma: no cover - compat32 returns bytes for leaf parts
        return payload
    charset = part.get_content_charset() or "utf-8"
    try:
        codecs.lookup(charset)
    except LookupError:
        charset = "utf-8"  # an unknown charset name: decode as UTF-8 and replace what does not fit
    try:
        return payload.decode(charset, errors="replace")
    except (LookupError, UnicodeError):  # pragma: no cover - codecs that reject errors="replace"
        return payload.decode("utf-8", errors="replace")


class _TextExtractor(HTMLParser):
    _BLOCKS = {"p", "br", "div", "tr", "li", "h1", "h2", "h3", "h4", "h5", "h6", "table", "blockquote"}
    _SKIP = {"script", "style", "head"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in self._SKIP:
            self._skipping += 1
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP and self._skipping:
            self._skipping -= 1
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """Visible text of an HTML body, one line per block element."""
    extractor = _TextExtractor()
    extractor.feed(html)
    extractor.close()
    lines = (_WHITESPACE.sub(" ", line).strip() for line in "".join(extractor.parts).split("\n"))
    return "\n".join(line for line in lines if line)
