#!/usr/bin/env python3
"""An SMTP server for the tests: `aiosmtpd` (from PyPI) on 127.0.0.1, never
a mock of SMTP. It parses every message it keeps with Python's own `email`
package, never with stagehand's code, and answers DATA the way the test
set.

    python3 smtp_server.py     # prints "SMTP_PORT CONTROL_PORT" on the first line

What DATA gets depends on the mode (`accept` at first):

- `accept`: kept, answered `250 Message accepted for delivery`. The
  normal case.
- `tempfail_once`: not kept, answered `451 4.3.0 Try again later`; the
  mode goes back to `accept`, so the next attempt goes through. For
  retries after a temporary failure.
- `reject`: not kept, answered `550 5.1.1 Mailbox unavailable`; the mode
  stays. For permanent failures (no retry).
- `drop_after_data`: kept (the message arrived whole), then the
  connection is closed with no answer at all; the mode goes back to
  `accept`. For the case where the sender cannot know whether the mail
  went: a retry may send it twice.
- `hold`: kept, and not answered until `POST /release`, which answers 250
  to every message waiting then; the mode stays, so later ones are held
  too. For mail in flight while something else happens (a shutdown, a
  timeout, a second send).

The control server, on the second port:

- `POST /control`: `{"mode": "..."}` sets the mode (204).
- `POST /release`: lets every held message have its 250 (204).
- `GET /received`: every message kept, in the order they came:
  `{"mail_from", "rcpt_tos", "outcome" (accepted, dropped or held),
  "message_id", "subject", "from", "to", "date", "content_language",
  "text", "html", "inline_images": [{"content_id" (no <>),
  "content_type", "size", "width", "height"}], "attachments":
  [{"filename", "content_type", "size"}], "structure", "raw_size",
  "header_names", "part_header_names", "defects"}`. `structure` is the
  MIME tree: a leaf is its content type, a multipart a list of its
  content type then its parts' structures, e.g. `["multipart/mixed",
  ["multipart/related", ["multipart/alternative", "text/plain",
  "text/html"], "image/jpeg"], "application/pdf"]`. `header_names` are
  the top-level header names as they came (in order, repeats kept);
  `part_header_names` those of every part below, sorted, once each;
  `defects` what the parser found wrong.
- `GET /attempts`: every DATA, in order: `{"outcome" (accepted,
  tempfail, rejected, dropped or held), "message_id"}`.
"""

import asyncio
import email
import email.policy
import json
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aiosmtpd.controller import Controller

MODES = ("accept", "tempfail_once", "reject", "drop_after_data", "hold")
STATE = {"mode": "accept"}
RECEIVED = []
ATTEMPTS = []
LOCK = threading.Lock()


def image_size(data):
    """(width, height) from a JPEG's SOF marker or a PNG's IHDR, else
    (None, None)."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 4 <= len(data):
            if data[i] != 0xFF:
                return None, None
            marker = data[i + 1]
            if marker == 0xFF:  # fill byte
                i += 1
                continue
            if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # no length
                i += 2
                continue
            if marker in (0xD9, 0xDA):  # end of image, start of scan
                return None, None
            (length,) = struct.unpack(">H", data[i + 2 : i + 4])
            sof = 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC)
            if sof and i + 9 <= len(data):
                height, width = struct.unpack(">HH", data[i + 5 : i + 9])
                return width, height
            i += 2 + length
    return None, None


def structure(part):
    if part.is_multipart():
        return [part.get_content_type()] + [structure(p) for p in part.iter_parts()]
    return part.get_content_type()


def header(msg, name):
    value = msg.get(name)
    return None if value is None else str(value)


def parse(raw, envelope, outcome):
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    text = html = None
    inline_images, attachments, part_headers, defects = [], [], set(), []
    for part in msg.walk():
        defects.extend(f"{type(d).__name__}: {d}" for d in part.defects)
        if part is not msg:
            part_headers.update(part.keys())
        if part.is_multipart():
            continue
        ctype = part.get_content_type()
        disposition = part.get_content_disposition()  # lower case or None
        if disposition == "attachment":
            attachments.append(
                {
                    "filename": part.get_filename(),
                    "content_type": ctype,
                    "size": len(part.get_payload(decode=True) or b""),
                }
            )
            continue
        content_id = part.get("Content-ID")
        if part.get_content_maintype() == "image" and (content_id or disposition == "inline"):
            data = part.get_payload(decode=True) or b""
            width, height = image_size(data)
            inline_images.append(
                {
                    "content_id": str(content_id).strip().strip("<>") if content_id else None,
                    "content_type": ctype,
                    "size": len(data),
                    "width": width,
                    "height": height,
                }
            )
        elif ctype == "text/plain" and text is None:
            text = part.get_content()
        elif ctype == "text/html" and html is None:
            html = part.get_content()
    return {
        "mail_from": envelope.mail_from,
        "rcpt_tos": list(envelope.rcpt_tos),
        "outcome": outcome,
        "message_id": header(msg, "Message-ID"),
        "subject": header(msg, "Subject"),
        "from": header(msg, "From"),
        "to": header(msg, "To"),
        "date": header(msg, "Date"),
        "content_language": header(msg, "Content-Language"),
        "text": text,
        "html": html,
        "inline_images": inline_images,
        "attachments": attachments,
        "structure": structure(msg),
        "raw_size": len(raw),
        "header_names": list(msg.keys()),
        "part_header_names": sorted(part_headers),
        "defects": defects,
    }


def message_id_of(raw):
    try:
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        return header(msg, "Message-ID")
    except Exception:  # noqa: BLE001 - a broken message has none
        return None


class Handler:
    """aiosmtpd's handler: its DATA hook, on the Controller's loop."""

    def __init__(self):
        self.release_event = None  # the held messages' (made on the loop)

    def release(self):
        """On the loop: wakes every held message; later ones wait anew."""
        if self.release_event is not None:
            self.release_event.set()
            self.release_event = None

    async def handle_DATA(self, server, session, envelope):
        raw = bytes(envelope.original_content or b"")
        with LOCK:
            mode = STATE["mode"]
            outcome = {
                "accept": "accepted",
                "tempfail_once": "tempfail",
                "reject": "rejected",
                "drop_after_data": "dropped",
                "hold": "held",
            }[mode]
            if mode in ("tempfail_once", "drop_after_data"):
                STATE["mode"] = "accept"
        message_id = message_id_of(raw)
        kept = outcome in ("accepted", "dropped", "held")
        record = None
        if kept:
            try:
                record = parse(raw, envelope, outcome)
            except Exception as e:  # noqa: BLE001 - keep what we can
                record = {
                    "mail_from": envelope.mail_from,
                    "rcpt_tos": list(envelope.rcpt_tos),
                    "outcome": outcome,
                    "message_id": message_id,
                    "raw_size": len(raw),
                    "parse_error": f"{type(e).__name__}: {e}",
                }
        with LOCK:
            ATTEMPTS.append({"outcome": outcome, "message_id": message_id})
            if record is not None:
                RECEIVED.append(record)
        if outcome == "tempfail":
            return "451 4.3.0 Try again later"
        if outcome == "rejected":
            return "550 5.1.1 Mailbox unavailable"
        if outcome == "dropped":
            # No answer: the socket is closed at once (what is buffered is
            # discarded). aiosmtpd still writes the status returned here,
            # but to a closed transport, which drops it; its connection_lost
            # then cancels this session's task.
            server.transport.abort()
            return "421 4.3.0 never sent"
        if outcome == "held":
            if self.release_event is None:
                self.release_event = asyncio.Event()
            await self.release_event.wait()
        return "250 Message accepted for delivery"


class PortZeroController(Controller):
    """A Controller on port 0: it learns the port the system gave before
    its start-up check connects to it."""

    def _trigger_server(self):
        self.port = self.server.sockets[0].getsockname()[1]
        return super()._trigger_server()


HANDLER = Handler()
CONTROLLER = PortZeroController(
    HANDLER,
    hostname="127.0.0.1",
    port=0,
    server_hostname="stagehand-test-smtp",  # no getfqdn() lookup
    enable_SMTPUTF8=True,
)


class ControlHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def answer(self, status, payload=None):
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        if payload is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        with LOCK:
            if self.path == "/received":
                return self.answer(200, list(RECEIVED))
            if self.path == "/attempts":
                return self.answer(200, list(ATTEMPTS))
        return self.answer(404, {"error": "not_found"})

    def do_POST(self):
        raw = self.body()
        if self.path == "/control":
            mode = json.loads(raw or b"{}").get("mode")
            if mode not in MODES:
                return self.answer(400, {"error": f"mode is one of {MODES}"})
            with LOCK:
                STATE["mode"] = mode
            return self.answer(204)
        if self.path == "/release":
            CONTROLLER.loop.call_soon_threadsafe(HANDLER.release)
            return self.answer(204)
        return self.answer(404, {"error": "not_found"})


def main():
    CONTROLLER.start()
    control = ThreadingHTTPServer(("127.0.0.1", 0), ControlHandler)
    control.daemon_threads = True
    print(CONTROLLER.port, control.server_address[1], flush=True)
    control.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
