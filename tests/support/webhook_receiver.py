#!/usr/bin/env python3
"""A webhook endpoint for the tests: it checks every delivery's signature
with the reference library of Standard Webhooks (`standardwebhooks`, from
PyPI), never with stagehand's own signing code, and keeps what it got.

    python3 webhook_receiver.py     # prints its port on the first line

- `POST /hook`: a delivery. Verified with the endpoint's secret (set by
  `/control`); kept with its `webhook-id`, whether it verified (and why
  not), its JSON body and when it came. Answered with the status the
  test set (204 at first), after the delay the test set.
- `POST /control`: `{"secret"?, "status"?, "delay_ms"?, "now_ms"?}` sets
  them; `now_ms` is the sender's clock (a test's injected one): the
  library then checks `webhook-timestamp` against it (its own rule, 5
  minutes either way) instead of this machine's.
- `GET /received`: every delivery kept, in the order they came.
"""

import json
import sys
import threading
import time
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import standardwebhooks.webhooks as reference
from standardwebhooks.webhooks import Webhook

STATE = {"secret": None, "status": 204, "delay_ms": 0}


class SenderClock(datetime):
    """The library's `datetime`, its now() moved to the sender's clock."""

    offset = 0.0

    @classmethod
    def now(cls, tz=None):
        return datetime.now(tz) + timedelta(seconds=cls.offset)


reference.datetime = SenderClock
RECEIVED = []
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def answer(self, status, payload=None):
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/received":
            return self.answer(404, {"error": "not_found"})
        with LOCK:
            return self.answer(200, list(RECEIVED))

    def do_POST(self):
        raw = self.body()
        if self.path == "/control":
            settings = json.loads(raw or b"{}")
            with LOCK:
                if "now_ms" in settings:
                    SenderClock.offset = settings.pop("now_ms") / 1000 - time.time()
                STATE.update(settings)
            return self.answer(200, dict(STATE, secret=bool(STATE["secret"])))
        if self.path != "/hook":
            return self.answer(404, {"error": "not_found"})
        with LOCK:
            secret, status, delay_ms = STATE["secret"], STATE["status"], STATE["delay_ms"]
        headers = {k.lower(): v for k, v in self.headers.items()}
        record = {"id": headers.get("webhook-id"), "at": time.time(), "status": status}
        try:
            if not secret:
                raise ValueError("no secret set")
            record["body"] = Webhook(secret).verify(raw.decode(), headers)
            record["verified"] = True
        except Exception as e:  # noqa: BLE001 - any failure is a verdict
            record["verified"] = False
            record["error"] = f"{type(e).__name__}: {e}"
            try:
                record["body"] = json.loads(raw)
            except ValueError:
                record["body"] = raw.decode(errors="replace")
        if delay_ms:
            time.sleep(delay_ms / 1000)
        with LOCK:
            RECEIVED.append(record)
        return self.answer(status)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
