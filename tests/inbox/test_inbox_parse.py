"""RFC 822 parsing: the messy parts of real mail, and clear errors for what is not mail at all."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta, timezone

import pytest

from agent_rl.environments.email.inbox.parse import ParseError, html_to_text, parse_date, parse_email

ENRON = b"""Message-ID: <8069939.1075855675628.JavaMail.evans@thyme>
Date: Mon, 14 May 2001 16:39:00 -0700 (PDT)
From: phillip.allen@enron.com
To: brad.mcsherry@enron.com, 
\tkeith.holst@enron.com
Subject: Re: Tori
Cc: john.lavorato@enron.com
Mime-Version: 1.0
Content-Type: text/plain; charset=us-ascii
Content-Transfer-Encoding: 7bit
Bcc: john.lavorato@enron.com
X-From: Phillip K Allen
X-To: Brad McSherry, Keith Holst
X-cc: John J Lavorato
X-bcc: 
X-Folder: \\Phillip_Allen_Jan2002_1\\Allen, Phillip K.\\'Sent Mail
X-Origin: Allen-P
X-FileName: pallen (Non-Privileged).pst

Brad, let us promote Tori.

 -----Original Message-----
From: \tMcSherry, Brad  
Sent:\tMonday, May 14, 2001 9:00 AM
Subject:\tTori

Should we convert Tori to associate?
"""


def test_enron_message_headers_and_body():
    parsed = parse_email(ENRON, file="allen-p/sent/1.")
    email = parsed.email
    assert email.message_id == "<8069939.1075855675628.JavaMail.evans@thyme>"
    assert email.date == datetime(2001, 5, 14, 16, 39, tzinfo=timezone(timedelta(hours=-7)))
    assert email.subject == "Re: Tori"
    assert email.sender == "phillip.allen@enron.com"
    assert email.to == ("brad.mcsherry@enron.com", "keith.holst@enron.com")
    assert email.cc == email.bcc == ("john.lavorato@enron.com",)
    assert email.file == "allen-p/sent/1."
    # Replied and forwarded text is part of the body.
    assert "Brad, let us promote Tori." in email.body and "Should we convert Tori to associate?" in email.body
    assert parsed.x_from == "Phillip K Allen" and parsed.x_to == "Brad McSherry, Keith Holst"
    assert parsed.x_origin == "Allen-P"
    assert parsed.x_folder.endswith("'Sent Mail")
    assert parsed.for_inbox("phillip.allen@enron.com", folder="sent").inbox == "phillip.allen@enron.com"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Mon, 14 May 2001 16:39:00 -0700 (PDT)", datetime(2001, 5, 14, 23, 39, tzinfo=timezone.utc)),
        ("Wed, 31 Dec 1969 16:00:00 -0800 (PST)", datetime(1970, 1, 1, tzinfo=timezone.utc)),
        ("14 May 2001 16:39:00", datetime(2001, 5, 14, 16, 39, tzinfo=timezone.utc)),  # no zone: UTC
        ("", None),
        ("sometime last week", None),
        ("Mon, 99 Foo 2001 99:99:99", None),
    ],
)
def test_dates(text, expected):
    assert parse_date(text) == expected


def test_missing_or_bad_date_is_none_not_an_error():
    assert parse_email(b"From: a@x.com\nSubject: hi\n\nbody").email.date is None
    assert parse_email(b"From: a@x.com\nDate: not a date\n\nbody").email.date is None


def test_message_without_message_id_gets_a_stable_id():
    raw = b"From: a@x.com\nSubject: hello\n\nsame body\n"
    first = parse_email(raw).email.message_id
    assert first == parse_email(raw.replace(b"\n", b"\r\n")).email.message_id
    assert first != parse_email(raw.replace(b"same", b"other")).email.message_id
    assert first.startswith("<") and first.endswith("@agent-rl.generated>")


def test_multipart_prefers_plain_text_and_skips_attachments():
    raw = b"""From: a@x.com
Subject: parts
MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="b1"

--b1
Content-Type: multipart/alternative; boundary="b2"

--b2
Content-Type: text/html; charset=utf-8

<p>html version</p>
--b2
Content-Type: text/plain; charset=utf-8
Content-Transfer-Encoding: quoted-printable

plain version with caf=C3=A9 and a soft=
 break
--b2--
--b1
Content-Type: text/plain; name="notes.txt"
Content-Disposition: attachment; filename="notes.txt"

attached notes must not be the body
--b1--
"""
    body = parse_email(raw).email.body
    assert "plain version with café and a soft break" in body
    assert "html version" not in body and "attached notes" not in body


def test_html_only_body_is_stripped_to_text():
    raw = (
        b"From: a@x.com\nContent-Type: text/html; charset=utf-8\n\n"
        b"<html><head><style>p {color: red}</style></head><body><p>Price is <b>$42</b></p>"
        b"<div>Second&nbsp;line &amp; more</div><script>var x;</script></body></html>"
    )
    assert parse_email(raw).email.body == "Price is $42\nSecond line & more"
    assert html_to_text("<p>a</p><p>b</p>") == "a\nb"


def test_base64_and_charsets():
    encoded = base64.encodebytes("Grüße aus Köln".encode("utf-8"))
    raw = b"From: a@x.com\nContent-Type: text/plain; charset=utf-8\nContent-Transfer-Encoding: base64\n\n" + encoded
    assert parse_email(raw).email.body.strip() == "Grüße aus Köln"
    latin = b"From: a@x.com\nContent-Type: text/plain; charset=iso-8859-1\n\nK\xf6ln"
    assert parse_email(latin).email.body == "Köln"


def test_unknown_charset_and_bad_bytes_are_replaced_not_fatal():
    raw = b"From: a@x.com\nContent-Type: text/plain; charset=x-no-such-charset\n\nok \xff\xfe bytes"
    body = parse_email(raw).email.body
    assert body.startswith("ok ") and body.endswith(" bytes") and "\ufffd" in body
    ascii_lie = b"From: a@x.com\nContent-Type: text/plain; charset=us-ascii\n\nna\xefve"
    assert parse_email(ascii_lie).email.body == "na\ufffdve"


def test_encoded_and_raw_8bit_headers():
    raw = "Subject: =?utf-8?q?na=C3=AFve?= =?iso-8859-1?q?=E9t=E9?= plan\nFrom: \"Jürgen\" <JU@Example.com>\n\nx"
    email = parse_email(raw.encode("utf-8")).email
    assert email.subject == "naïveété plan"
    assert email.sender == "ju@example.com"
    assert parse_email(b"From: a@x.com\nSubject: caf\xe9\n\nx").email.subject == "café"


def test_str_input_and_nul_bytes_in_body():
    email = parse_email("From: a@x.com\nSubject: s\n\nbody with \x00 nul")
    assert email.email.body == "body with  nul"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "empty file"),
        (b"  \n\n \n", "empty file"),
        (bytes(range(256)) * 4, "NUL"),
        (b"\x89PNG\r\n\x1a\nrest of an image", "does not start with an RFC 822 header"),
        (b"just some words\nwithout headers\n\nbody", "does not start with an RFC 822 header"),
        (b"From: a@x.com\nTo: b@x.com\nSubject: truncated", "header-only message"),
        (b"X-Custom: 1\nX-Other: 2\n\nbody", "no From, To, Date, Subject or Message-ID"),
    ],
)
def test_what_is_not_an_email_raises_parse_error_with_reason(raw, reason):
    with pytest.raises(ParseError, match=reason):
        parse_email(raw)
