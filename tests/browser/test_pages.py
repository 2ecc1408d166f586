#!/usr/bin/env python3
"""Real-browser tests of the stagehand pages (headless Chromium, Playwright).

Starts the server binary on a free loopback port with a temporary SQLite
database, the built-in AI simulator (2 s jobs; a prompt with "forbidden" is
refused by moderation), a known operator token and a real SMTP server for
the guests' mail, then drives the pages the way people use them:

  participant  a phone (360 px) makes a submission, survives a reload, sees
               the result; a lost answer is retried with the same key; a
               rejection shows its message and the same session tries again
  terminal     a 1080p booth display, open at the same time, shows the result,
               the ranking and the rejection, and acknowledges what it showed;
               it reconnects by itself after the server is killed and
               restarted, resuming after the last seq it showed (and from
               localStorage after a reload); a wrong token is said so
  ops          the dashboard's counts move while sagas run, it creates an
               experience and a terminal, its Cancel button cancels a queued
               saga, whose participant then reads the CANCELLED message, and
               its Retry button runs that saga again to its result
  providers    /ops shows each AI provider with its experiences, and pauses and
               resumes it (its breaker); while it is paused the phone shows a
               calm notice with its place in the queue and the booth display
               a calm banner, and the result follows once it resumes
  review       /ops's review queue: a approves, r rejects; the booth display
               shows only the approved result
  language     a Korean experience shows Korean texts
  images       the result's picture, drawn by the built-in simulator and
               served from its own port, really loads on the booth display
  photos       a photo+prompt booth: the phone's camera button, the preview
               (upright) with Retake, the photo downscaled in the browser to
               photo_max_px before its upload (with a progress bar), the
               result on the phone and on the booth display; a reload keeps
               the photo and never uploads it twice; a busy server is retried
               with the same key; a text file as the photo reads 415 in plain
               words and keeps the typed prompt; a retake names the stored
               photo it replaces (?replaces=)
  layout       every page fits a 360 px phone; the booth display fills 1080p
  hostile      a nickname and a prompt made of markup show as text on the
               phone, the display and /ops and run nothing; the pages make
               no link or source of a javascript: URL; a second server on a
               fake job API that answers javascript: URLs shows none on
               /ops; /ops cannot be framed; a Content-Security-Policy
               refusal on any page's console is a page error
  guests       a result link (/r/...): the phone shows it with its QR code,
               another device downloads the kept bytes and shares it, the
               owner erases it and the display drops it within 1 s, the link
               then answers 410; the organiser's notice and the consent box
               before the camera; a PIN gallery (/g/...) without the opted
               out; the display's QR code of a new result; /ops's held
               figures, export, and finding, hiding and erasing a guest
  operators    /ops says who is signed in and shows only what the role may
               do (viewer, moderator, admin); an admin edits an
               experience's live settings in place (only the changed
               fields, a confirm before closing now or lowering
               max_in_flight below what runs), creates an operator (its
               token shown once) and revokes it (its open page returns to
               the sign-in form), and reads the audit log by action and
               operator
  printing     (issue 47) /ops uploads an event's brand overlay and shows
               its preview; a real IPP printer (CUPS's ippeveprinter, with
               avahi-daemon on the system D-Bus, started as root when they do
               not run) added through /ops reads "out of paper" on its card
               while its trays are empty, and ok again once paper is in; the
               phone's Print button queues a print that waits with that
               reason, then prints once (one document in the printer's
               spool) when paper is loaded, and is spent after it
  mail         (a real SMTP server: aiosmtpd, tests/support/smtp_server.py)
               a completed result on the phone offers mail: the address, the
               organiser's consent text on an unticked box (the marketing
               opt-in apart); without the tick nothing is asked, with it one
               mail with the result's link reaches the SMTP server and the
               phone shows it Sent, the address masked and kept nowhere; a
               header injection is refused 422 and sends nothing; the share
               page offers it on the guest's own phone only (spent after
               mails_per_guest), a friend's sees none; /ops's Mail section
               shows a refused mail FAILED with the server's 550, "Retry
               selected" sends it (hidden for a viewer), an admin edits the
               mail's subject (the next mail carries it) and resets it; a
               server without SMTP offers no mail and /ops says so
  screenshots  of every page, in target/screenshots/; and the two the README
               shows, docs/booth-display.png and docs/ops.png (1280x800),
               rewritten with STAGEHAND_DOCS_SCREENSHOTS=1 (a read-only docs/
               is said, not a failure)

Only 127.0.0.1 is contacted (the server, and the simulator's result images
on its own loopback port, the fake job API, the test printers and the SMTP
server); any other address is refused.

Usage: python3 tests/browser/test_pages.py [test-name ...]
Environment: STAGEHAND_BINARY (default target/debug/stagehand),
STAGEHAND_CHROMIUM (default /usr/bin/chromium), STAGEHAND_PAGES_FROM_DISK=1
serves static/ from the work tree instead of the binary's embedded copy (for
editing the pages without rebuilding; the default tests what ships),
STAGEHAND_DOCS_SHOTS (default docs/) where the README's screenshots go.
Prints "browser: N passed, M failed" and exits non-zero when any failed.
Without Chromium, Playwright's Python package or aiosmtpd it says what to
install and exits 2.
"""

import fcntl
import http.client
import importlib.util
import http.server
import json
import mimetypes
import os
import pathlib
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zlib

# What the browser tests need, as .ci/run installs it (scripts/test says the
# same line).
NEEDS = ("browser tests need Debian's chromium and Playwright's Python package: "
         "apt-get install chromium fonts-nanum; python3 -m pip install 'playwright>=1.45,<2'")

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError as missing:
    print(f"no Playwright ({missing}): {NEEDS}", file=sys.stderr)
    sys.exit(2)

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("STAGEHAND_BINARY") or ROOT / "target" / "debug" / "stagehand")
CHROMIUM = os.environ.get("STAGEHAND_CHROMIUM", "/usr/bin/chromium")
DOCS_SHOTS = pathlib.Path(os.environ.get("STAGEHAND_DOCS_SHOTS") or ROOT / "docs")
PAGES_FROM_DISK = os.environ.get("STAGEHAND_PAGES_FROM_DISK") == "1"
SHOTS = ROOT / "target" / "screenshots"
STATIC = ROOT / "static"
OPERATOR_TOKEN = "browser-test-operator-" + uuid.uuid4().hex
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
if PAGES_FROM_DISK:
    # Pages answered by the test itself have no address, so Chromium would
    # treat them as public and refuse their sockets to 127.0.0.1.
    CHROMIUM_ARGS.append("--disable-features=LocalNetworkAccessChecks")
PHONE = dict(viewport={"width": 360, "height": 740}, device_scale_factor=2, is_mobile=True, has_touch=True)
SCREEN = dict(viewport={"width": 1920, "height": 1080})
SECOND = 1000  # Playwright timeouts are in milliseconds
RESULT_WAIT = 30 * SECOND  # a 2 s job, with room for a slow machine

EN = json.loads((STATIC / "i18n" / "en.json").read_text(encoding="utf-8"))
KO = json.loads((STATIC / "i18n" / "ko.json").read_text(encoding="utf-8"))


# ---- the server ------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The stagehand binary on a free port with a fresh SQLite file."""

    def __init__(self, *extra_args):
        self.dir = tempfile.mkdtemp(prefix="stagehand-browser-")
        self.log_path = os.path.join(self.dir, "server.log")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        db = f"sqlite://{self.dir}/x.db?mode=rwc"
        args = [str(BINARY), "serve", "--bind", f"127.0.0.1:{self.port}", "--database-url", db,
                "--operator-token", OPERATOR_TOKEN, *extra_args]
        self.args = args
        self.log = open(self.log_path, "w")
        self.start()

    def start(self):
        # Its own session: a signal to the test's process group (a Ctrl-C)
        # reaches the test, which then stops the server itself.
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.dir,
                                     start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not answer /healthz within 60 s:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, lines=40):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                tail = f.readlines()[-lines:]
        except OSError:
            return ""
        plain = (re.sub(r"\x1b\[[0-9;]*m", "", line) for line in tail)
        return "".join(line if len(line) < 400 else line[:400] + "…\n" for line in plain)

    def restart(self):
        """Kills the process (as a crash would) and starts it again on the
        same port and database."""
        self.proc.kill()
        self.proc.wait(10)
        self.start()

    def errors(self):
        """The server's ERROR log lines so far."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return [re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip()[:400] for line in f if " ERROR " in line]
        except OSError:
            return []

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # JSON over HTTP: (status, body, headers). Never raises on an HTTP error.
    def api(self, method, path, body=None, token=None, key=None):
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if key:
            headers["Idempotency-Key"] = key
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=15) as r:
                status, raw, hdrs = r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as e:
            status, raw, hdrs = e.code, e.read(), dict(e.headers)
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return status, parsed, hdrs

    def ok(self, method, path, body=None, token=None, key=None, expect_status=(200, 201, 202)):
        status, parsed, _ = self.api(method, path, body, token, key)
        assert status in expect_status, f"{method} {path} -> {status} {parsed}"
        return parsed

    def operator(self, method, path, body=None):
        return self.ok(method, path, body, token=OPERATOR_TOKEN, key=str(uuid.uuid4()))

    def experience(self, slug, title, kind="comic", locale="en", max_in_flight=5):
        return self.operator("POST", "/api/experiences", {
            "slug": slug, "title": title, "kind": kind, "max_in_flight": max_in_flight, "locale": locale})

    def terminal(self, slug, name):
        return self.operator("POST", "/api/terminals", {"experience": slug, "name": name})

    def submit_as(self, slug, nickname, prompt, terminal_id=None, score=None):
        """A participant through the API: (session_id, participant_token)."""
        body = {"nickname": nickname}
        if terminal_id:
            body["terminal_id"] = terminal_id
        s = self.ok("POST", f"/api/experiences/{slug}/sessions", body, key=str(uuid.uuid4()))
        sub = {"prompt": prompt}
        if score is not None:
            sub["score"] = score
        self.ok("POST", f"/api/sessions/{s['session_id']}/submission", sub,
                token=s["participant_token"], key=str(uuid.uuid4()))
        return s["session_id"], s["participant_token"]

    def sagas(self, **query):
        q = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        return self.ok("GET", f"/api/admin/sagas?{q}", token=OPERATOR_TOKEN)["sagas"]


def wait_for(what, check, timeout=30):
    """Polls `check` until it returns a truthy value; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except AssertionError as e:  # not yet
            last = e
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


# ---- the browser -----------------------------------------------------------

def only_loopback(route):
    """Lets 127.0.0.1 through (the server, and the simulator's images on its
    own port); refuses the rest."""
    url = urllib.parse.urlsplit(route.request.url)
    if url.hostname == "127.0.0.1" or url.scheme in ("data", "blob"):
        if PAGES_FROM_DISK and serve_from_disk(route, url.path):
            return
        route.continue_()
    else:
        route.abort("blockedbyclient")


def serve_from_disk(route, path):
    """STAGEHAND_PAGES_FROM_DISK=1: the pages from the work tree."""
    pages = {"/": "index.html", "/ops": "ops.html"}
    name = pages.get(path)
    if name is None and re.fullmatch(r"/p/[^/]+", path):
        name = "participant.html"
    if name is None and re.fullmatch(r"/terminal/[^/]+", path):
        name = "terminal.html"
    if name is None and re.fullmatch(r"/g/[^/]+", path):
        name = "gallery.html"
    if name is None and re.fullmatch(r"/r/[^/]+", path):
        name = "result.html"
    if name is None and path.startswith("/static/"):
        name = path[len("/static/"):]
    if name is None and path.startswith("/i18n/"):
        name = "i18n/" + path[len("/i18n/"):]
    if name is None or not (STATIC / name).is_file():
        return False
    ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
    answer = route.fetch()
    if name == "result.html" and answer.status != 200:
        # A result link that is gone: the server's own page (410).
        route.fulfill(response=answer)
        return True
    # With the server's own security headers (its Content-Security-Policy
    # above all), so that the pages from disk are held to what ships.
    secured = {k: v for k, v in answer.headers.items() if k.lower() in SECURITY_HEADERS}
    route.fulfill(status=200, content_type=ctype, headers=secured, body=(STATIC / name).read_bytes())
    return True


SECURITY_HEADERS = ("content-security-policy", "x-content-type-options", "x-frame-options", "referrer-policy")


class Env:
    """What every test gets: the server, the browser and a few fixtures."""

    def __init__(self, server, browser):
        self.server = server
        self.browser = browser
        self.base = server.base
        self.contexts = []
        self.console_errors = []

    def context(self, base=None, **kw):
        ctx = self.browser.new_context(base_url=base or self.base, **kw)
        ctx.set_default_timeout(15 * SECOND)
        ctx.route("**/*", only_loopback)
        self.contexts.append(ctx)
        return ctx

    def page(self, **kw):
        return self.page_of(None, **kw)

    def page_of(self, server, **kw):
        """A page of `server` (a test's own; None: the shared one)."""
        return self.watch(self.context(base=server.base if server else None, **kw).new_page())

    def watch(self, page):
        """Counts `page`'s uncaught errors and policy refusals as failures."""
        page.on("pageerror", lambda e: self.console_errors.append(f"{page.url}: {e}"))
        # What the pages' Content-Security-Policy refuses is a bug of the
        # page (an inline script or style): Chromium says it on the console.
        page.on("console", lambda m: m.type == "error" and "Content Security Policy" in m.text
                and self.console_errors.append(f"{page.url}: {m.text}"))
        return page

    def phone(self):
        return self.page(**PHONE)

    def screen(self):
        return self.page(**SCREEN)

    def close_contexts(self):
        for ctx in self.contexts:
            try:
                ctx.close()
            except Exception:  # noqa: BLE001 - closing after a failure
                pass
        self.contexts = []


# Entrance animations have ended (endless ones, like a spinner, go on).
SETTLED = """() => document.getAnimations().every(a =>
    a.playState !== 'running' || a.effect.getComputedTiming().iterations === Infinity)"""


def shot(page, name, settle=True, **kw):
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    if settle:
        page.wait_for_function(SETTLED, timeout=5 * SECOND)
    page.screenshot(path=str(path), **kw)
    return path


def save_doc_shot(page, name):
    """A screenshot of the viewport for the docs: written to target/screenshots/
    and, with STAGEHAND_DOCS_SCREENSHOTS=1, to DOCS_SHOTS/name (replaced
    whole, never half-written), so that a test run leaves the work tree as
    it was unless asked. A docs/ that cannot be written is said, not a
    failure."""
    data = page.screenshot(animations="disabled", caret="hide")
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / name).write_bytes(data)
    if os.environ.get("STAGEHAND_DOCS_SCREENSHOTS") != "1":
        return SHOTS / name
    target = DOCS_SHOTS / name
    tmp = target.with_name(f".{name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        print(f"note: {target} not written ({e.strerror or e}); it is in {SHOTS / name}")
        return SHOTS / name
    return target


def images_loaded(page, selector):
    """Every image matching selector has loaded (and there is one at least)."""
    return page.locator(selector).evaluate_all(
        "imgs => imgs.length > 0 && imgs.every(i => i.complete && i.naturalWidth > 0)")


def assert_fits(page, what):
    """Nothing sticks out sideways: no horizontal scrolling at this width."""
    sizes = page.evaluate("""() => {
        const wide = [...document.querySelectorAll('body *')].filter(n => {
            const r = n.getBoundingClientRect();
            return r.width > 0 && r.right > innerWidth + 1 && !n.closest('.table-wrap');
        }).slice(0, 5).map(n => n.tagName.toLowerCase() + (n.id ? '#' + n.id : '') +
            (n.className && typeof n.className === 'string' ? '.' + n.className.split(' ').join('.') : ''));
        return {scroll: document.documentElement.scrollWidth, inner: innerWidth, wide};
    }""")
    assert sizes["scroll"] <= sizes["inner"] and not sizes["wide"], f"{what} overflows sideways: {sizes}"


def open_terminal(env, terminal):
    page = env.screen()
    page.goto(f"/terminal/{terminal['terminal_id']}#token={terminal['token']}")
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    return page


def participant_submit(page, nickname, prompt, score=None):
    # The form shows once the page has read its experience (and the stored
    # session, which hides the nickname): wait for it before looking.
    expect(page.locator("#view-form")).to_be_visible()
    expect(page.locator("#go")).to_be_enabled()
    if nickname is not None and page.locator("#nickname").is_visible():
        page.fill("#nickname", nickname)
    page.fill("#prompt", prompt)
    if score is not None:
        page.fill("#score", str(score))
    page.click("#go")


# ---- the tests -------------------------------------------------------------


def test_index_lists_experiences(env):
    page = env.screen()
    page.goto("/")
    card = page.locator("li.experience[data-slug=comics]")
    expect(card).to_be_visible()
    expect(card.locator("h2")).to_have_text("Comic booth")
    expect(card.locator(".badge")).to_have_text(EN["kind.comic"])
    expect(card.locator("a")).to_have_attribute("href", "/p/comics")
    expect(page.locator("a[href='/ops']")).to_be_visible()
    shot(page, "index")


def test_submission_reaches_terminal(env):
    """(1) A phone's submission ends with the booth display showing it."""
    term = env.fixtures["comics_terminal"]
    display = open_terminal(env, term)
    expect(display.locator("#empty")).to_be_visible()

    phone = env.phone()
    keys = []
    phone.on("request", lambda r: keys.append((r.url, r.headers.get("idempotency-key")))
             if r.method == "POST" else None)
    phone.goto(f"/p/comics?terminal={term['terminal_id']}")
    expect(phone.locator("#title")).to_have_text("Comic booth")
    expect(phone.locator("#score-field")).to_be_hidden()
    expect(phone.locator("#go")).to_have_text(EN["p.submit"])
    # A double tap sends one request of each kind.
    phone.fill("#nickname", "alice")
    phone.fill("#prompt", "a cat on a skateboard")
    assert_fits(phone, "the participant form at 360 px")
    shot(phone, "participant-form")
    phone.locator("#go").dblclick()
    expect(phone.locator("#view-waiting")).to_be_visible()
    # The session survives a reload while it runs (or after it finished).
    phone.reload()
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    expect(phone.locator("#result-message")).to_have_text(EN["session.COMPLETED"])
    expect(phone.locator("#result-content figcaption")).to_contain_text("a cat on a skateboard")
    img = phone.locator("#result-content img")
    expect(img).to_have_count(1)
    wait_for("the result image to load", lambda: img.evaluate("i => i.complete && i.naturalWidth > 0"), 10)
    shot(phone, "participant")
    posts = [k for k in keys if "/sessions" in k[0] or "/submission" in k[0]]
    assert len(posts) == 2, f"expected one session and one submission request, got {posts}"
    assert all(k[1] and re.fullmatch(r"[0-9a-f-]{36}", k[1]) for k in posts), posts
    sagas = [s for s in env.server.sagas(experience="comics") if s["nickname"] == "alice"]
    assert len(sagas) == 1, f"one saga for alice, got {sagas}"

    expect(display.locator("#latest-nickname")).to_have_text("alice", timeout=RESULT_WAIT)
    expect(display.locator("#latest-content figcaption")).to_contain_text("a cat on a skateboard")
    expect(display.locator("#latest-content img")).to_have_count(1)
    wait_for("the display's result image to load", lambda: images_loaded(display, "#latest-content img"), 10)
    expect(display.locator("#feed li.feed-completed").first).to_contain_text("alice")
    env.fixtures["comics_display"] = display
    env.fixtures["comics_phone"] = phone


def test_lost_answer_is_retried_with_the_same_key(env):
    """A request whose answer is lost is sent again with the same key."""
    phone = env.phone()
    sent = {"sessions": [], "submission": []}

    def lose_first_answer(kind):
        def handler(route):
            sent[kind].append(route.request.headers.get("idempotency-key"))
            if len(sent[kind]) == 1:
                route.fetch()  # the server does the work...
                route.abort("connectionreset")  # ...and the answer is lost
            else:
                route.continue_()
        return handler

    phone.route("**/api/experiences/*/sessions", lose_first_answer("sessions"))
    phone.route("**/api/sessions/*/submission", lose_first_answer("submission"))
    phone.goto("/p/comics")
    participant_submit(phone, "flaky-net", "a robot juggling teacups")
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    for kind, keys in sent.items():
        assert len(keys) >= 2 and len(set(keys)) == 1, f"{kind}: retries must reuse the key: {keys}"
    sagas = [s for s in env.server.sagas(experience="comics") if s["nickname"] == "flaky-net"]
    assert len(sagas) == 1, f"one saga despite the retries, got {len(sagas)}"


def test_terminal_acks_what_it_showed(env):
    """The display acknowledges events: the server sees nothing unacked."""
    term = env.fixtures["comics_terminal"]
    display = env.fixtures.get("comics_display") or open_terminal(env, term)
    expect(display.locator("#latest")).to_be_visible(timeout=RESULT_WAIT)
    seq = int(display.locator("#latest").get_attribute("data-seq"))

    def acked():
        rows = env.server.ok("GET", "/api/terminals?experience=comics", token=OPERATOR_TOKEN)["terminals"]
        row = next(t for t in rows if t["terminal_id"] == term["terminal_id"])
        assert row["online"], row
        assert row["acked_seq"] >= seq and row["unacked"] == 0, row
        return row
    wait_for("the display's ack", acked, 15)
    stored = display.evaluate(f"() => JSON.parse(localStorage.getItem('stagehand:t:{term['terminal_id']}')).seq")
    assert stored >= seq, f"the last seq shown is kept for reconnecting: {stored} < {seq}"


def test_rejection_shows_on_both_pages(env):
    """(2) A moderation rejection reads as such on the phone and the display."""
    term = env.fixtures["comics_terminal"]
    display = env.fixtures.get("comics_display") or open_terminal(env, term)
    phone = env.phone()
    phone.goto(f"/p/comics?terminal={term['terminal_id']}")
    participant_submit(phone, "mallory", "something forbidden please")
    expect(phone.locator("#view-aborted")).to_be_visible(timeout=RESULT_WAIT)
    expect(phone.locator("#aborted-title")).to_have_text(EN["p.rejectedTitle"])
    expect(phone.locator("#aborted-message")).to_contain_text(EN["abort.INPUT_REJECTED"])
    shot(phone, "participant-rejected")

    expect(display.locator("#alert")).to_be_visible(timeout=RESULT_WAIT)
    expect(display.locator("#alert-who")).to_have_text("mallory")
    expect(display.locator("#alert-message")).to_contain_text(EN["abort.INPUT_REJECTED"])
    expect(display.locator("#feed li.feed-rejected").first).to_contain_text(EN["abort.INPUT_REJECTED"])
    shot(display, "terminal-rejected")

    # The same session takes a new submission.
    phone.click("#try-again")
    expect(phone.locator("#who-text")).to_contain_text("mallory")
    expect(phone.locator("#nickname-field")).to_be_hidden()
    participant_submit(phone, None, "a friendly dragon baking bread")
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    expect(display.locator("#latest-nickname")).to_have_text("mallory", timeout=RESULT_WAIT)
    sagas = [s for s in env.server.sagas(experience="comics") if s["nickname"] == "mallory"]
    assert len({s["session_id"] for s in sagas}) == 1 and len(sagas) == 2, sagas


def ops_page(env):
    page = env.screen()
    page.goto("/ops")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token", "not-the-token")
    page.click("#sign-in")
    expect(page.locator("#login-error")).to_have_text(EN["ops.tokenWrong"])
    page.fill("#token", OPERATOR_TOKEN)
    page.click("#sign-in")
    expect(page.locator("#dashboard")).to_be_visible()
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    return page


def tile_value(page, step):
    text = page.locator(f"#step-{step} .value").inner_text()
    return int(re.sub(r"\D", "", text) or 0)


def test_ops_dashboard_and_cancel(env):
    """(3) Live counts move, forms create, Cancel cancels a queued saga."""
    ops = ops_page(env)
    # The token is asked once per tab: a reload keeps the dashboard.
    ops.reload()
    expect(ops.locator("#dashboard")).to_be_visible()
    expect(ops.locator("#conn")).to_have_attribute("data-state", "live")
    completed_before = tile_value(ops, "COMPLETED")

    # An experience with room for one AI job at a time, made with the form.
    form = ops.locator("#new-experience")
    form.locator("[name=slug]").fill("slow")
    form.locator("[name=title]").fill("One at a time")
    form.locator("[name=kind]").select_option("image")
    form.locator("[name=max_in_flight]").fill("1")
    ops.click("#new-experience button[type=submit]")
    expect(ops.locator("#flash")).to_contain_text("slow")
    expect(ops.locator("#experience-list li[data-slug=slow]")).to_be_visible()

    # A terminal for it: its link with the token is shown once.
    tform = ops.locator("#new-terminal")
    tform.locator("[name=experience]").select_option("slow")
    tform.locator("[name=name]").fill("queue booth")
    ops.click("#new-terminal button[type=submit]")
    link = ops.locator("#new-terminal-link")
    expect(link).to_contain_text("#token=")
    href = link.get_attribute("href")
    terminal_id = urllib.parse.urlsplit(href).path.rsplit("/", 1)[1]
    qr = ops.locator("#new-terminal-qr")
    wait_for("the new terminal's QR code", lambda: qr.evaluate("i => i.complete && i.naturalWidth > 0"), 10)
    display = env.screen()
    display.goto(href.replace(urllib.parse.urlsplit(href).netloc, urllib.parse.urlsplit(env.base).netloc))
    expect(display.locator("#conn")).to_have_attribute("data-state", "live")
    expect(display.locator("#title")).to_have_text("One at a time")
    card = ops.locator(f"li.terminal-card[data-terminal-id='{terminal_id}']")
    expect(card).to_have_class(re.compile(r"\bonline\b"), timeout=15 * SECOND)
    card_qr = card.locator("img.qr")
    wait_for("the terminal card's QR code", lambda: card_qr.evaluate("i => i.complete && i.naturalWidth > 0"), 10)

    ops.locator("#f-experience").select_option("slow")
    # Five sagas ahead (2 s each, one at a time), then the phone's: it waits
    # in the queue for about 10 s.
    for i in range(5):
        env.server.submit_as("slow", f"ahead-{i}", f"picture number {i}", terminal_id=terminal_id)
    phone = env.phone()
    phone.goto(f"/p/slow?terminal={terminal_id}")
    participant_submit(phone, "queued-phone", "a lighthouse in a storm")
    expect(phone.locator("#view-waiting")).to_be_visible()
    expect(phone.locator("#wait-stage")).to_have_text(EN["p.stage.AI_PENDING"])
    expect(phone.locator("#wait-extra")).to_contain_text(re.compile(r"\d+ s"))
    shot(phone, "participant-waiting")

    capacity = ops.locator("#capacity li[data-slug=slow]")
    expect(capacity.locator(".in-flight")).to_have_text(EN["ops.inFlight"].format(n=1, max=1))
    expect(capacity.locator(".queued")).not_to_have_text(EN["ops.queued"].format(n=0))
    expect(ops.locator("#queue-depth .value")).not_to_have_text("0")
    # The sagas table follows the socket by itself (no Refresh click).
    row = ops.locator("#sagas tbody tr", has=ops.locator("td.nickname", has_text="queued-phone"))
    expect(row).to_have_attribute("data-step", "AI_PENDING")
    ops.evaluate("() => window.scrollTo(0, 0)")
    shot(ops, "ops", full_page=True)
    expect(row.locator("button.action-retry")).to_have_count(0)
    cancel = row.locator("button.action-cancel")
    cancel.click()
    expect(cancel).to_have_text(EN["ops.confirmCancel"])
    # A saga that changes redraws the table: the armed button stays armed.
    env.server.submit_as("slow", "redraw", "one more picture", terminal_id=terminal_id)
    expect(ops.locator("#sagas tbody tr", has=ops.locator("td.nickname", has_text="redraw"))).to_have_count(1)
    expect(cancel).to_have_text(EN["ops.confirmCancel"])
    cancel.click()
    expect(ops.locator("#flash")).to_have_text(EN["ops.done.cancel"])
    expect(row).to_have_attribute("data-step", "ABORTED")
    expect(row.locator("td.reason")).to_have_text(EN["reason.CANCELLED"])

    expect(phone.locator("#view-aborted")).to_be_visible(timeout=RESULT_WAIT)
    expect(phone.locator("#aborted-message")).to_have_text(EN["abort.CANCELLED"])
    expect(display.locator("#alert-message")).to_have_text(EN["abort.CANCELLED"], timeout=RESULT_WAIT)

    expect(ops.locator("#reason-CANCELLED .count")).not_to_have_text("0")

    # Retry runs the cancelled saga again: the phone that was told it was
    # cancelled follows it to its result, and so does the booth display.
    retry = row.locator("button.action-retry")
    retry.click()
    expect(retry).to_have_text(EN["ops.confirmRetry"])
    retry.click()
    expect(ops.locator("#flash")).to_have_text(EN["ops.done.retry"])
    expect(row).to_have_attribute("data-step", re.compile("^(AI_PENDING|AI_DONE|RANKING_DONE|COMPLETED)$"))
    expect(row.locator("button.action-retry")).to_have_count(0)
    expect(phone.locator("#view-result")).to_be_visible(timeout=60 * SECOND)
    expect(display.locator("#latest-nickname")).to_have_text("queued-phone", timeout=RESULT_WAIT)
    expect(row).to_have_attribute("data-step", "COMPLETED")

    # The five ahead and the retried one complete: the counts moved with them.
    wait_for("the COMPLETED count to grow by 6", lambda: tile_value(ops, "COMPLETED") >= completed_before + 6, 30)
    expect(capacity.locator(".in-flight")).to_have_text(EN["ops.inFlight"].format(n=0, max=1), timeout=RESULT_WAIT)
    expect(ops.locator("#recent li").first).to_be_visible()


def test_terminal_reconnects_and_resumes(env):
    """The display reconnects by itself after the server restarts, resuming
    after the last seq it showed; a reload resumes from localStorage."""
    term = env.fixtures["comics_terminal"]
    display = env.screen()
    # Every socket the page opens, in order (kept across reloads).
    display.add_init_script("""(() => {
        const Real = WebSocket;
        window.WebSocket = function (url, protocols) {
            const list = JSON.parse(sessionStorage.getItem('test:sockets') || '[]');
            list.push(String(url));
            sessionStorage.setItem('test:sockets', JSON.stringify(list));
            return new Real(url, protocols);
        };
        window.WebSocket.prototype = Real.prototype;
        Object.assign(window.WebSocket, {CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3});
    })()""")
    opened = "() => JSON.parse(sessionStorage.getItem('test:sockets') || '[]')"
    display.goto(f"/terminal/{term['terminal_id']}#token={term['token']}")
    expect(display.locator("#conn")).to_have_attribute("data-state", "live")
    expect(display.locator("#latest")).to_be_visible(timeout=RESULT_WAIT)
    stored = f"() => (JSON.parse(localStorage.getItem('stagehand:t:{term['terminal_id']}')) || {{}}).seq"
    seq = wait_for("the display to keep its position", lambda: display.evaluate(stored), 10)
    sockets = display.evaluate(opened)
    assert len(sockets) == 1 and "after=0" in sockets[0], sockets

    env.server.restart()
    display.wait_for_function(f"() => ({opened})().length >= 2", timeout=30 * SECOND)
    sockets = display.evaluate(opened)
    assert f"after={seq}" in sockets[-1], f"the reconnect resumes after seq {seq}: {sockets}"
    expect(display.locator("#conn")).to_have_attribute("data-state", "live", timeout=RESULT_WAIT)
    env.server.submit_as("comics", "after-restart", "a phoenix rising", terminal_id=term["terminal_id"])
    expect(display.locator("#latest-nickname")).to_have_text("after-restart", timeout=RESULT_WAIT)
    shown = display.locator("#feed li").evaluate_all("lis => lis.map(li => li.dataset.seq)")
    assert len(shown) == len(set(shown)), f"an event was shown twice: {shown}"

    newest = int(display.locator("#latest").get_attribute("data-seq"))
    wait_for("the new position to be kept", lambda: display.evaluate(stored) == newest, 10)
    display.reload()
    expect(display.locator("#conn")).to_have_attribute("data-state", "live")
    sockets = display.evaluate(opened)
    assert f"after={newest}" in sockets[-1], f"a reload resumes after seq {newest}: {sockets}"


def test_terminal_with_a_wrong_token_says_so(env):
    """A display link with a wrong token is refused, and the screen says so."""
    term = env.fixtures["comics_terminal"]
    display = env.screen()
    display.goto(f"/terminal/{term['terminal_id']}#token={'0' * 64}")
    expect(display.locator("#conn")).to_have_attribute("data-state", "failed", timeout=20 * SECOND)
    expect(display.locator("#conn-text")).to_contain_text(EN["t.conn.failed"])
    expect(display.locator("#latest")).to_be_hidden()
    # Without any token it does not even try.
    display.evaluate("() => localStorage.clear()")
    display.goto(f"/terminal/{term['terminal_id']}")
    expect(display.locator("#no-token")).to_be_visible()
    expect(display.locator("#no-token")).to_have_text(EN["t.noToken"])


def test_korean_experience(env):
    """A `ko` experience speaks Korean on the phone and the display."""
    term = env.fixtures["game_terminal"]
    display = open_terminal(env, term)
    expect(display.locator("html")).to_have_attribute("lang", "ko")
    expect(display.locator(".side h2").first).to_have_text(KO["t.ranking"])
    expect(display.locator("#conn-text")).to_have_text(KO["t.conn.live"])

    phone = env.phone()
    phone.goto(f"/p/game?terminal={term['terminal_id']}")
    expect(phone.locator("html")).to_have_attribute("lang", "ko")
    expect(phone.locator("#go")).to_have_text(KO["p.submitScore"])
    expect(phone.locator("#score-field")).to_be_visible()
    expect(phone.locator("#score-field span")).to_have_text(KO["p.score"])
    # A score is required for a game.
    phone.fill("#nickname", "민지")
    phone.fill("#prompt", "보스를 한 번에 물리쳤어요")
    phone.click("#go")
    expect(phone.locator("#form-error")).to_have_text(KO["p.error.score"])
    phone.fill("#score", "4242")
    phone.click("#go")
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    expect(phone.locator("#result-stats .score")).to_contain_text("4,242")
    expect(phone.locator("#result-stats .rank")).to_have_text(KO["p.rankValue"].format(rank=1))
    expect(phone.locator("#view-result h2")).to_have_text(KO["p.resultTitle"])
    shot(phone, "participant-ko")
    # The server's message comes in the experience's language.
    expect(phone.locator("#result-message")).to_have_text(KO["session.COMPLETED"])

    expect(display.locator("#latest-nickname")).to_have_text("민지", timeout=RESULT_WAIT)
    expect(display.locator("#latest-rank")).to_have_text(KO["t.rank"].format(rank=1))
    first = display.locator("#ranking li").first
    expect(first.locator(".r-name")).to_have_text("민지", timeout=RESULT_WAIT)
    expect(first.locator(".r-score")).to_have_text("4,242")


def test_terminal_screenshot(env):
    """(4) The booth display with a ranking: a few scores, then the newest."""
    term = env.fixtures["game_terminal"]
    for name, score in [("Jun", 3100), ("Ara", 5120), ("Theo", 2875)]:
        env.server.submit_as("game", name, "one more round", terminal_id=term["terminal_id"], score=score)

    def all_done():
        sagas = env.server.sagas(experience="game")
        assert all(s["step"] in ("COMPLETED", "ABORTED") for s in sagas), [s["step"] for s in sagas]
        return sagas
    sagas = wait_for("the game's sagas to end", all_done, 30)
    completed = sum(1 for s in sagas if s["step"] == "COMPLETED")
    entries = env.server.ok("GET", "/api/experiences/game/ranking?limit=10")["entries"]
    assert [e["nickname"] for e in entries[:1]] == ["Ara"], entries
    # A display opened now gets every event from the start (after=0).
    display = open_terminal(env, term)
    expect(display.locator("#ranking li")).to_have_count(len(entries), timeout=RESULT_WAIT)
    expect(display.locator("#feed li.feed-completed")).to_have_count(min(8, completed), timeout=RESULT_WAIT)
    expect(display.locator("#ranking li").first.locator(".r-name")).to_have_text("Ara")
    # The newest result (the highest seq) is the one shown large.
    newest = display.locator("#feed li").first.locator(".f-name").inner_text()
    expect(display.locator("#latest-nickname")).to_have_text(newest)
    expect(display.locator("#scan img")).to_be_visible()
    display.wait_for_function("() => document.querySelector('#scan img').naturalWidth > 0")
    shot(display, "terminal")


def test_result_image_loads_on_the_display(env):
    """The result's picture is drawn by the built-in simulator (as
    ./scripts/demo runs it), kept by stagehand and served from its own
    /media/: on the booth display it really loads: no "image could not be
    loaded". Before, its URL was the simulator's loopback port, which a
    phone on the venue's Wi-Fi can never load."""
    env.server.experience("pictures", "Picture booth", kind="image")
    term = env.server.terminal("pictures", "picture booth")
    prompt = "a <b>bold</b> fox & a hen <script>alert(1)</script>"
    session_id, token = env.server.submit_as("pictures", "pixel", prompt, terminal_id=term["terminal_id"])
    wait_for("the saga to complete", lambda: env.server.ok(
        "GET", f"/api/sessions/{session_id}", token=token)["status"] == "COMPLETED", 30)

    display = env.screen()
    answers = []
    display.on("response", lambda r: answers.append((r.url, r.status, r.headers.get("content-type")))
               if "/media/r/" in r.url else None)
    display.goto(f"/terminal/{term['terminal_id']}#token={term['token']}")
    expect(display.locator("#conn")).to_have_attribute("data-state", "live")
    expect(display.locator("#latest-nickname")).to_have_text("pixel", timeout=RESULT_WAIT)
    img = display.locator("#latest-content img")
    expect(img).to_have_count(1)
    wait_for("the result image to load", lambda: img.evaluate("i => i.complete && i.naturalWidth > 0"), 10)
    expect(display.locator("#latest-content .img-missing")).to_have_count(0)
    expect(display.locator("#latest-content figcaption")).to_contain_text("<b>bold</b> fox & a hen")

    # The picture is stagehand's own kept copy (the provider deletes its
    # outputs), served by the server the page came from.
    src = img.get_attribute("src")
    assert re.fullmatch(r"/media/r/[0-9a-f]{32}\.svg", src), src
    assert [(a[1], a[2]) for a in answers] == [(200, "image/svg+xml")], answers
    # The prompt is in the picture as text, escaped, never as markup.
    with urllib.request.urlopen(env.server.base + src, timeout=5) as r:
        svg = r.read().decode()
    assert "<script" not in svg and "&lt;b&gt;bold&lt;/b&gt; fox &amp; a hen" in svg, svg
    shot(display, "terminal-image")


def test_layouts_fit_phone_and_1080p(env):
    """Every page fits a 360 px phone; the booth display fills 1080p exactly."""
    term = env.fixtures["game_terminal"]
    # The booth display at 1080p: everything on one screen, no scrolling.
    display = open_terminal(env, term)
    expect(display.locator("#latest")).to_be_visible(timeout=RESULT_WAIT)
    expect(display.locator("#ranking li").first).to_be_visible()
    display.wait_for_function(SETTLED)
    box = display.evaluate("""() => {
        const out = {};
        for (const sel of ['.display-head', '.stage', '.side', '#latest-nickname', '#latest-stats',
                           '#ranking', '#scan']) {
            const n = document.querySelector(sel === '#latest-stats' ? '.latest-stats' : sel);
            const r = n.getBoundingClientRect();
            out[sel] = [Math.round(r.left), Math.round(r.top), Math.round(r.right), Math.round(r.bottom)];
        }
        out.scroll = [document.documentElement.scrollWidth, document.documentElement.scrollHeight];
        return out;
    }""")
    assert box["scroll"] == [1920, 1080], f"the display scrolls at 1080p: {box}"
    for sel, rect in box.items():
        if sel != "scroll":
            left, top, right, bottom = rect
            assert left >= 0 and top >= 0 and right <= 1920 and bottom <= 1080, f"{sel} leaves the screen: {box}"

    # The same pages on a phone.
    pages = {
        "the index": "/",
        "the participant page": "/p/game",
        "the booth display": f"/terminal/{term['terminal_id']}#token={term['token']}",
        "the ops login": "/ops",
    }
    for what, path in pages.items():
        phone = env.phone()
        phone.goto(path)
        if "terminal" in path:
            expect(phone.locator("#conn")).to_have_attribute("data-state", "live")
            expect(phone.locator("#latest")).to_be_visible(timeout=RESULT_WAIT)
        elif path == "/ops":
            expect(phone.locator("#login")).to_be_visible()
        elif path == "/":
            expect(phone.locator("li.experience").first).to_be_visible()
        else:
            expect(phone.locator("#view-form")).to_be_visible()
        assert_fits(phone, f"{what} at 360 px")
        if path == "/ops":
            phone.fill("#token", OPERATOR_TOKEN)
            phone.click("#sign-in")
            expect(phone.locator("#conn")).to_have_attribute("data-state", "live")
            expect(phone.locator("#sagas tbody tr").first).to_be_visible()
            assert_fits(phone, "the ops dashboard at 360 px")
            shot(phone, "ops-phone")
        if "terminal" in path:
            shot(phone, "terminal-phone")


def provider_card(page, name):
    return page.locator(f"#providers li.provider-card[data-provider='{name}']")


def breaker_state(env, provider="default"):
    return env.server.ok("GET", f"/api/admin/breaker?provider={provider}", token=OPERATOR_TOKEN)["state"]


def test_ops_shows_providers_and_breaker(env):
    """The providers section: the default provider with its experiences and
    figures; its Pause button opens the breaker, Resume closes it; the
    section follows the server by itself (every 2 s)."""
    ops = ops_page(env)
    card = provider_card(ops, "default")
    expect(card).to_be_visible()
    expect(card.locator(".provider-name")).to_have_text("default")
    listed = env.server.ok("GET", "/api/admin/providers", token=OPERATOR_TOKEN)["providers"]
    default = next(p for p in listed if p["name"] == "default")
    assert default["experiences"], default
    if default["kind"]:
        expect(card.locator(".badge")).to_have_text(default["kind"])
    for e in default["experiences"]:
        row = card.locator(f"tr[data-slug='{e['slug']}']")
        expect(row).to_be_visible()
        expect(row.locator(".weight")).to_have_text(str(e["weight"]))
        expect(row.locator(".in-flight")).to_contain_text(f"/ {e['max_in_flight']:,}")
    assert {"comics", "game"} <= {e["slug"] for e in default["experiences"]}, default
    cap = default["max_in_flight"]
    in_flight = card.locator(".tile.in-flight")
    if cap is None:
        expect(in_flight.locator(".label")).to_have_text(EN["ops.provider.noCap"])
        expect(in_flight.locator(".value")).to_have_text(re.compile(r"^\d+$"))
    else:
        expect(in_flight.locator(".label")).to_have_text(EN["ops.provider.inFlight"])
        expect(in_flight.locator(".value")).to_have_text(re.compile(rf"^\d+ / {cap:,}$"))
    expect(card.locator(".tile.rate-limit .value")).to_have_text(default["rate_limit"] or EN["ops.provider.noRateLimit"])
    expect(card).to_have_attribute("data-breaker", "closed")
    badge = card.locator(".breaker-badge")
    expect(badge).to_have_text(EN["ops.breaker.closed"])
    expect(card.locator("button.breaker-close")).to_be_hidden()

    # Pause: two clicks (it stops every experience on the provider).
    pause = card.locator("button.breaker-open")
    pause.click()
    expect(pause).to_have_text(EN["ops.breaker.confirmPause"])
    assert breaker_state(env) == "closed", "the first click only arms the button"
    pause.click()
    expect(ops.locator("#flash")).to_have_text(EN["ops.breaker.done.open"].format(name="default"))
    expect(card).to_have_attribute("data-breaker", "open")
    expect(badge).to_have_text(EN["ops.breaker.open"])
    expect(badge).to_have_attribute("data-state", "open")
    assert breaker_state(env) == "open"
    expect(pause).to_be_hidden()
    section = ops.locator("#providers-section")
    section.scroll_into_view_if_needed()
    shot(ops, "ops-providers")
    # A submission waits in the provider's queue while it is open.
    env.server.submit_as("comics", "queued-while-paused", "a kite in the rain")
    expect(card.locator("tr[data-slug=comics] .queued")).to_have_text("1", timeout=10 * SECOND)
    expect(card.locator(".tile.queued .value")).not_to_have_text("0")

    # Resume: one click.
    card.locator("button.breaker-close").click()
    expect(ops.locator("#flash")).to_have_text(EN["ops.breaker.done.close"].format(name="default"))
    expect(card).to_have_attribute("data-breaker", "closed")
    expect(badge).to_have_text(EN["ops.breaker.closed"])
    assert breaker_state(env) == "closed"
    expect(card.locator("tr[data-slug=comics] .queued")).to_have_text("0", timeout=RESULT_WAIT)

    # Changed elsewhere (the API), the card follows by itself.
    env.server.operator("POST", "/api/admin/breaker/open?provider=default", {"for_seconds": 60})
    try:
        expect(card).to_have_attribute("data-breaker", "open", timeout=6 * SECOND)
    finally:
        env.server.operator("POST", "/api/admin/breaker/close?provider=default")
    expect(card).to_have_attribute("data-breaker", "closed", timeout=6 * SECOND)

    # The same section on a phone.
    phone = env.phone()
    phone.goto("/ops")
    phone.fill("#token", OPERATOR_TOKEN)
    phone.click("#sign-in")
    pcard = provider_card(phone, "default")
    expect(pcard.locator("tr[data-slug=comics]")).to_be_visible()
    assert_fits(phone, "the ops providers section at 360 px")
    table = pcard.locator("table.provider-experiences")
    widths = table.evaluate("t => [t.scrollWidth, t.parentElement.clientWidth]")
    assert widths[0] <= widths[1], f"the provider's experiences fit a phone without scrolling: {widths}"
    pcard.scroll_into_view_if_needed()
    shot(phone, "ops-providers-phone")


def test_ai_paused_on_phone_and_display(env):
    """While the provider's breaker is open, the phone says so calmly with
    its place in the queue and the booth display shows a calm banner; once
    it closes, the result arrives on both and the banner goes."""
    term = env.fixtures["comics_terminal"]
    display = open_terminal(env, term)
    banner = display.locator("#paused")
    expect(banner).to_be_hidden()
    env.server.operator("POST", "/api/admin/breaker/open?provider=default", {"for_seconds": 60})
    try:
        # The display reads the experience every 5 s.
        expect(banner).to_be_visible(timeout=12 * SECOND)
        expect(banner).to_have_text(EN["terminal.ai_paused"])
        assert banner.evaluate("n => n.getAnimations().length") == 0, "the banner does not flash"

        phone = env.phone()
        phone.goto(f"/p/comics?terminal={term['terminal_id']}")
        participant_submit(phone, "patient", "a sloth waiting for a bus")
        expect(phone.locator("#view-waiting")).to_be_visible()
        notice = phone.locator("#wait-paused")
        expect(notice).to_be_visible()
        expect(notice).to_have_text(EN["session.ai_paused"])
        place = re.compile("^" + re.escape(EN["session.queue_position"]).replace(re.escape("{n}"), r"\d+") + "$")
        expect(phone.locator("#wait-queue")).to_have_text(place)
        expect(phone.locator("#wait-message")).to_be_hidden()
        # It stays a calm wait: no error, no abort, through a few polls and
        # a reload.
        phone.wait_for_timeout(3 * SECOND)
        expect(phone.locator("#view-waiting")).to_be_visible()
        expect(phone.locator("#form-error")).to_be_hidden()
        phone.reload()
        expect(notice).to_be_visible()
        expect(phone.locator("#wait-queue")).to_have_text(place)
        assert_fits(phone, "the paused notice at 360 px")
        shot(phone, "participant-paused")
        shot(display, "terminal-paused")
        size = display.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        assert size == [1920, 1080], f"the banner keeps the display on one screen: {size}"
    finally:
        env.server.operator("POST", "/api/admin/breaker/close?provider=default")

    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    expect(phone.locator("#result-content figcaption")).to_contain_text("a sloth waiting for a bus")
    expect(display.locator("#latest-nickname")).to_have_text("patient", timeout=RESULT_WAIT)
    expect(banner).to_be_hidden(timeout=12 * SECOND)


def test_ops_review_approves_and_rejects(env):
    """(review) Results of a reviewed experience wait in /ops's review queue
    with big previews; `a` approves the selected one and `r` rejects the
    next; the booth display shows only the approved result, and for the
    rejected one a neutral message without its content."""
    env.server.operator("POST", "/api/experiences", {
        "slug": "reviewed", "title": "Reviewed booth", "kind": "image", "review": "before_display"})
    term = env.server.terminal("reviewed", "review booth")
    display = open_terminal(env, term)
    ops = ops_page(env)
    queue = ops.locator("#review-queue")
    expect(ops.locator("#review-section")).to_be_visible()
    env.server.submit_as("reviewed", "keeper", "a lighthouse at dawn", terminal_id=term["terminal_id"])
    expect(queue.locator(".review-card")).to_have_count(1, timeout=RESULT_WAIT)
    env.server.submit_as("reviewed", "dropper", "a secret doodle", terminal_id=term["terminal_id"])
    expect(queue.locator(".review-card")).to_have_count(2, timeout=RESULT_WAIT)
    expect(ops.locator("#review-count")).to_have_text(re.compile(r"\b2\b"))
    expect(ops.locator("#review-oldest")).to_contain_text("s")
    first = queue.locator(".review-card").first
    expect(first.locator(".nickname")).to_have_text("keeper")
    expect(first.locator(".review-preview img")).to_have_count(1)
    expect(first).to_have_class(re.compile(r"\bselected\b"))
    # Nothing of either is on the public screen while they wait.
    expect(display.locator("#empty")).to_be_visible()
    shot(ops, "ops-review")

    ops.keyboard.press("a")
    expect(queue.locator(".review-card")).to_have_count(1)
    expect(display.locator("#latest-nickname")).to_have_text("keeper", timeout=RESULT_WAIT)
    expect(display.locator("#latest-content figcaption")).to_contain_text("a lighthouse at dawn")
    expect(queue.locator(".review-card.selected .nickname")).to_have_text("dropper")
    ops.keyboard.press("r")
    expect(queue.locator(".review-card")).to_have_count(0)
    expect(queue).to_contain_text(EN["ops.review.empty"])
    expect(display.locator("#feed li").first).to_contain_text(EN["abort.REVIEW_REJECTED"], timeout=RESULT_WAIT)
    expect(display.locator("#latest-nickname")).to_have_text("keeper")
    assert "a secret doodle" not in display.content(), "the rejected content reached the display"
    sagas = {s["nickname"]: s for s in env.server.sagas(experience="reviewed")}
    assert sagas["keeper"]["step"] == "COMPLETED", sagas
    assert sagas["dropper"]["abort_reason"] == "REVIEW_REJECTED", sagas

# The README's screenshots: a booth display with a few pictures and a
# ranking, and the operators' console with some activity. Fixed prompts,
# names and scores, each saga ended before the next: the same picture in
# every run (the simulator draws from the prompt), up to the QR code and
# the console's times.
SHOWCASE = [
    ("Mina", "a cat on a skateboard", 8120),
    ("Leo", "a robot juggling teacups", 7450),
    ("Sora", "a dragon baking bread at sunrise", 9310),
    ("Kai", "a lighthouse dancing in a storm", 6890),
]
DOC_VIEW = dict(viewport={"width": 1280, "height": 800})


def test_docs_screenshots(env):
    """docs/booth-display.png and docs/ops.png (rewritten from this run with
    STAGEHAND_DOCS_SCREENSHOTS=1); the console's review queue approves all
    with its two clicks."""
    env.server.experience("showcase", "Comic booth · Main stage", kind="comic")
    term = env.server.terminal("showcase", "main stage")
    for nickname, prompt, score in SHOWCASE:
        sid, token = env.server.submit_as("showcase", nickname, prompt, terminal_id=term["terminal_id"], score=score)
        wait_for(f"{nickname}'s saga to complete", lambda: env.server.ok(
            "GET", f"/api/sessions/{sid}", token=token)["status"] == "COMPLETED", 30)

    display = env.page(**DOC_VIEW)
    display.goto(f"/terminal/{term['terminal_id']}#token={term['token']}")
    expect(display.locator("#conn")).to_have_attribute("data-state", "live")
    expect(display.locator("#latest-nickname")).to_have_text(SHOWCASE[-1][0], timeout=RESULT_WAIT)
    expect(display.locator("#ranking li")).to_have_count(len(SHOWCASE))
    expect(display.locator("#feed li.feed-completed")).to_have_count(len(SHOWCASE))
    expect(display.locator("#ranking li").first.locator(".r-name")).to_have_text("Sora")
    expect(display.locator("#scan img")).to_be_visible()
    wait_for("the display's images to load", lambda: images_loaded(display, "#latest-content img, #qr"), 10)
    display.wait_for_function(SETTLED, timeout=5 * SECOND)
    size = display.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    assert size == [1280, 800], f"the display fits 1280x800: {size}"
    save_doc_shot(display, "booth-display.png")

    # The console while a booth with one AI slot works through a queue, after
    # a moderation rejection.
    env.server.experience("posters", "Poster wall", kind="image", max_in_flight=1)
    sid, token = env.server.submit_as("posters", "Rex", "something forbidden on a poster")
    wait_for("the rejection", lambda: env.server.ok(
        "GET", f"/api/sessions/{sid}", token=token)["status"] == "ABORTED", 30)
    ops = env.page(**DOC_VIEW)
    ops.goto("/ops")
    ops.fill("#token", OPERATOR_TOKEN)
    ops.click("#sign-in")
    expect(ops.locator("#dashboard")).to_be_visible()
    expect(ops.locator("#conn")).to_have_attribute("data-state", "live")
    expect(ops.locator("#step-COMPLETED .value")).not_to_have_text("0")
    expect(ops.locator("#reason-INPUT_REJECTED .count")).not_to_have_text("0")
    for nickname, prompt in [("Ivy", "a jazz band of penguins"), ("Oto", "a city made of candy"),
                             ("Nia", "a whale in the clouds"), ("Max", "a knight on a scooter")]:
        env.server.submit_as("posters", nickname, prompt)
    # Two results wait for an operator's review before the main screen.
    env.server.operator("POST", "/api/experiences", {
        "slug": "gallery", "title": "Gallery wall", "kind": "comic", "review": "before_display"})
    for nickname, prompt in [("Ana", "a fox reading the news"), ("Bo", "a moon-shaped bakery")]:
        env.server.submit_as("gallery", nickname, prompt)
    expect(ops.locator("#review-queue .review-card")).to_have_count(2, timeout=RESULT_WAIT)
    wait_for("the review previews to load", lambda: images_loaded(ops, "#review-queue img"), 10)
    capacity = ops.locator("#capacity li[data-slug=posters]")
    expect(capacity.locator(".in-flight")).to_have_text(EN["ops.inFlight"].format(n=1, max=1))
    expect(capacity.locator(".queued")).not_to_have_text(EN["ops.queued"].format(n=0))
    expect(ops.locator("#recent li").first).to_be_visible()
    ops.evaluate("() => window.scrollTo(0, 0)")
    ops.wait_for_function(SETTLED, timeout=5 * SECOND)
    save_doc_shot(ops, "ops.png")
    ops.click("#review-approve-all")
    ops.click("#review-approve-all")
    expect(ops.locator("#review-queue .review-card")).to_have_count(0, timeout=RESULT_WAIT)
    # The queue drains (the sagas left running would slow the next test).
    expect(capacity.locator(".queued")).to_have_text(EN["ops.queued"].format(n=0), timeout=RESULT_WAIT)


# Markup that would run if a page put it in as HTML: each sets a mark.
# (A nickname is 40 characters at most.)
HOSTILE_NICK = "<img src=x onerror=__pwned='nick'>"
# (The simulator's caption keeps the prompt's first 40 characters.)
HOSTILE_PROMPT = "<img src=x onerror=__pwned='prompt'>"
# A result's content as a provider could answer it: a link and a picture
# whose URLs run script, and ones that would load something else.
HOSTILE_CONTENT = [
    {"type": "link", "url": "javascript:window.__pwned='link'", "text": "open me"},
    {"type": "image", "url": "javascript:window.__pwned='image'", "text": "a picture"},
    {"type": "link", "url": " JavaScript:window.__pwned='spaced'", "text": "spaced"},
    {"type": "link", "url": "data:text/html,<script>opener.__pwned='data'</script>", "text": "data"},
    {"type": "link", "url": "//evil.example/x", "text": "elsewhere"},
]


def inert(page, what):
    """Nothing hostile ran on `page`, and every link and source in it is
    http(s), the server's own path, a data: picture or a fragment."""
    assert page.evaluate("() => window.__pwned") is None, f"{what}: script ran"
    bad = page.evaluate(r"""() => [...document.querySelectorAll('[href], [src]')]
        .map(n => n.getAttribute('href') ?? n.getAttribute('src'))
        .filter(u => !/^(https?:\/\/|\/(?!\/)|data:image\/|#)/i.test(u))""")
    assert not bad, f"{what}: links or sources of other schemes: {bad}"
    assert page.locator("img[src='x']").count() == 0, f"{what}: the nickname became an <img>"


def test_hostile_text_stays_text(env):
    """A nickname and a prompt made of markup show as the characters typed,
    on the phone, the booth display and /ops (its review queue), and run
    nothing; and the pages make no link or source of a javascript: URL,
    whatever a result holds (the pages' own check, SH.renderContent)."""
    env.server.operator("POST", "/api/experiences", {
        "slug": "hostile", "title": "Hostile booth", "kind": "image", "review": "before_display"})
    term = env.server.terminal("hostile", "hostile booth")
    display = open_terminal(env, term)
    ops = ops_page(env)
    phone = env.phone()
    phone.goto(f"/p/hostile?terminal={term['terminal_id']}")
    participant_submit(phone, HOSTILE_NICK, HOSTILE_PROMPT)
    card = ops.locator("#review-queue .review-card")
    expect(card).to_have_count(1, timeout=RESULT_WAIT)
    expect(card.locator(".nickname")).to_have_text(HOSTILE_NICK)
    expect(card.locator(".review-preview figcaption")).to_contain_text(HOSTILE_PROMPT)
    ops.keyboard.press("a")
    expect(display.locator("#latest-nickname")).to_have_text(HOSTILE_NICK, timeout=RESULT_WAIT)
    expect(display.locator("#latest-content figcaption")).to_contain_text(HOSTILE_PROMPT)
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    expect(phone.locator("#result-content figcaption")).to_contain_text(HOSTILE_PROMPT)
    for page, what in [(phone, "phone"), (display, "display"), (ops, "/ops")]:
        inert(page, what)
        # The same rendering, given URLs a result must never turn into a
        # link or a source (the server leaves them out already).
        made = page.evaluate("""content => {
            const box = document.createElement('div');
            box.append(...SH.renderContent(content));
            document.body.append(box);
            const out = {
                links: [...box.querySelectorAll('a')].map(a => a.getAttribute('href')),
                sources: [...box.querySelectorAll('[src]')].map(n => n.getAttribute('src')),
                texts: [...box.querySelectorAll('figcaption')].map(f => f.textContent),
            };
            box.remove();
            return out;
        }""", HOSTILE_CONTENT)
        assert made["links"] == [] and made["sources"] == [], f"{what}: {made}"
        assert made["texts"] == [c["text"] for c in HOSTILE_CONTENT], f"{what}: {made}"
        inert(page, what)


class FakeJobs:
    """A job API on a loopback port whose every job has succeeded with
    HOSTILE_CONTENT: a provider answering javascript: URLs."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self, status, job_id):
                body = json.dumps({"job_id": job_id, "status": "succeeded",
                                   "result": {"content": HOSTILE_CONTENT}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.answer(202, "hostile-" + (self.headers.get("Idempotency-Key") or "none"))

            def do_GET(self):
                self.answer(200, self.path.rsplit("/", 1)[-1])

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_javascript_urls_from_the_provider_are_never_links(env):
    """A provider answers a result of javascript: (and other) URLs: /ops's
    review queue shows the items' words and no link or source of them (the
    server left the URLs out, and stored none)."""
    fake = FakeJobs()
    server = Server("--ai-url", fake.url)
    try:
        server.operator("POST", "/api/experiences", {
            "slug": "shady", "title": "Shady provider", "kind": "image", "review": "before_display"})
        server.submit_as("shady", "eve", "anything")
        ops = env.page_of(server, **SCREEN)
        ops.goto("/ops")
        ops.fill("#token", OPERATOR_TOKEN)
        ops.click("#sign-in")
        card = ops.locator("#review-queue .review-card")
        expect(card).to_have_count(1, timeout=RESULT_WAIT)
        expect(card.locator(".nickname")).to_have_text("eve")
        preview = card.locator(".review-preview")
        expect(preview.locator("figcaption").first).to_have_text("open me")
        expect(preview.locator("a")).to_have_count(0)
        expect(preview.locator("[src]")).to_have_count(0)
        inert(ops, "/ops of a shady provider")
        saga_id = server.sagas(experience="shady")[0]["saga_id"]
        stored = server.ok("GET", f"/api/admin/sagas/{saga_id}", token=OPERATOR_TOKEN)
        assert "javascript:" not in json.dumps(stored).lower(), stored
    finally:
        server.stop()
        fake.stop()


class FakeOpenAiOutOfQuota:
    """An OpenAI-compatible API on a loopback port whose model list
    announces a shutdown date for the chat model, and whose account is out
    of quota (every generation: 429 `insufficient_quota`, as OpenAI
    documents it)."""

    SHUTDOWN = "2027-01-14"

    def __init__(self):
        shutdown = self.SHUTDOWN

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self, status, payload):
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                models = [
                    {"id": "gpt-6-luna", "object": "model", "created": 1, "owned_by": "openai",
                     "shutdown_date": shutdown},
                    {"id": "gpt-image-2.6-flare", "object": "model", "created": 1, "owned_by": "openai",
                     "shutdown_date": None},
                ]
                self.answer(200, {"object": "list", "data": models})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.answer(429, {"error": {
                    "message": "You exceeded your current quota, please check your plan and billing details.",
                    "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}})

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_out_of_quota_and_a_model_shutdown_are_shown(env):
    """The account is out of quota: /ops shows the breaker's reason under the
    provider and the chat model's announced shutdown date; the waiting guest
    reads that the AI account is out of credit and that their place is
    kept."""
    fake = FakeOpenAiOutOfQuota()
    server = Server("--ai-provider", "openai", "--openai-base-url", fake.url,
                    "--openai-api-key", "sk-browser-test")
    try:
        server.operator("POST", "/api/experiences", {"slug": "songs", "title": "Songs", "kind": "music"})
        phone = env.page_of(server, **PHONE)
        phone.goto("/p/songs")
        participant_submit(phone, "penny", "a song about the sea")
        notice = phone.locator("#wait-paused")
        expect(notice).to_be_visible(timeout=RESULT_WAIT)
        expect(notice).to_have_text(EN["session.ai_out_of_credit"])
        expect(phone.locator("#form-error")).to_be_hidden()

        ops = env.page_of(server, **SCREEN)
        ops.goto("/ops")
        ops.fill("#token", OPERATOR_TOKEN)
        ops.click("#sign-in")
        card = provider_card(ops, "default")
        expect(card).to_have_attribute("data-breaker", "open")
        expect(card.locator(".breaker-reason")).to_contain_text("out of quota")
        shutdown = card.locator(".model-notices li")
        expect(shutdown).to_have_count(1)
        expect(shutdown).to_contain_text("gpt-6-luna")
        expect(shutdown).to_contain_text(FakeOpenAiOutOfQuota.SHUTDOWN)
        breaker = server.ok("GET", "/api/admin/breaker", token=OPERATOR_TOKEN)
        assert breaker["opened_by"] == "out_of_quota", breaker
    finally:
        server.stop()
        fake.stop()


def test_ops_cannot_be_framed(env):
    """Another page cannot show /ops in a frame (frame-ancestors 'none'),
    while an answer without the pages' policy would load there."""
    framer = env.context(**SCREEN).new_page()  # its refusal is expected: not a page error
    framer.set_content("<!doctype html><title>framer</title><p>another site</p>")
    for path in ["/ops", "/api/openapi.json"]:
        loaded = framer.evaluate("""src => new Promise(done => {
            const f = document.createElement('iframe');
            f.onload = () => done(true);
            f.src = src;
            document.body.append(f);
        })""", env.base + path)
        assert loaded, path
    urls = [f.url for f in framer.frames if f != framer.main_frame]
    assert len(urls) == 2, urls
    assert urls[0].startswith("chrome-error:"), f"/ops was shown in a frame: {urls}"
    assert urls[1] == env.base + "/api/openapi.json", f"the control did not load: {urls}"


PHOTO = ROOT / "tests" / "fixtures" / "photo-gps-rotated.jpg"  # 1200x900, EXIF orientation 6


def jpeg_size(data):
    """(width, height) from a JPEG's frame header, or None."""
    if data[:2] != b"\xff\xd8":
        return None
    at = 2
    while at + 9 < len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            at += 2
            continue
        length = int.from_bytes(data[at + 2:at + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return int.from_bytes(data[at + 7:at + 9], "big"), int.from_bytes(data[at + 5:at + 7], "big")
        at += 2 + length
    return None


def photo_experience(env):
    """The selfie booth: a photo and a prompt, photos downscaled to 512 px;
    (slug, terminal). Made once, for whichever photo test comes first."""
    if "selfie_terminal" not in env.fixtures:
        env.server.operator("POST", "/api/experiences", {
            "slug": "selfie", "title": "Selfie booth", "kind": "image", "locale": "en",
            "input": "photo+prompt", "photo_max_px": 512})
        env.fixtures["selfie_terminal"] = env.server.terminal("selfie", "selfie booth")
    return "selfie", env.fixtures["selfie_terminal"]


def photo_posts(page):
    """The page's photo uploads as they go: [(Idempotency-Key, body bytes)]."""
    posts = []
    page.on("request", lambda r: posts.append((r.headers.get("idempotency-key"), r.post_data_buffer))
            if r.method == "POST" and r.url.endswith("/photo") else None)
    return posts


def test_photo_is_resized_uploaded_and_shown(env):
    """A photo+prompt experience on a phone: the camera button, the preview
    (upright: the EXIF rotation applied) with Retake, the photo downscaled in
    the browser to photo_max_px (512) before it is sent, the upload's
    progress bar, then the result on the phone and, loaded, on the booth
    display."""
    slug, term = photo_experience(env)
    display = open_terminal(env, term)
    phone = env.phone()
    posts = photo_posts(phone)
    phone.goto(f"/p/{slug}?terminal={term['terminal_id']}")
    expect(phone.locator("#view-form")).to_be_visible()
    take = phone.locator("#photo-take")
    expect(take).to_be_visible()
    expect(take).to_contain_text(EN["p.takePhoto"])
    expect(phone.locator("#photo-input")).to_have_attribute("accept", "image/*")
    expect(phone.locator("#photo-input")).to_have_attribute("capture", "user")
    expect(phone.locator("#prompt-field")).to_be_visible()
    # The photo comes before the prompt.
    assert phone.evaluate("""() => document.querySelector('#photo-field')
        .compareDocumentPosition(document.querySelector('#prompt')) & Node.DOCUMENT_POSITION_FOLLOWING""")
    # A photo is required.
    phone.fill("#nickname", "snap")
    phone.fill("#prompt", "me as a pirate captain")
    phone.click("#go")
    expect(phone.locator("#form-error")).to_have_text(EN["p.error.photo"])
    assert_fits(phone, "the photo form at 360 px")
    shot(phone, "participant-photo-empty")

    # The camera button opens the file chooser.
    with phone.expect_file_chooser() as chooser:
        take.click()
    assert chooser.value.element.get_attribute("id") == "photo-input"
    chooser.value.set_files(str(PHOTO))
    preview = phone.locator("#photo-img")
    expect(phone.locator("#photo-preview")).to_be_visible()
    expect(take).to_be_hidden()
    expect(phone.locator("#photo-retake")).to_have_text(EN["p.retake"])
    wait_for("the preview to load", lambda: preview.evaluate("i => i.complete && i.naturalWidth > 0"), 10)
    # Upright (orientation 6: the 1200x900 landscape file is a portrait) and
    # already 512 px on its long side.
    size = preview.evaluate("i => [i.naturalWidth, i.naturalHeight]")
    assert size == [384, 512], f"the preview is {size}, not the upright 384x512"
    expect(phone.locator("#photo-size")).to_have_text(EN["p.photoSize"].format(w=384, h=512))
    # Retake, and the same photo again (by the input, as a test can).
    phone.click("#photo-retake")
    phone.locator("#photo-input").set_input_files(str(PHOTO))
    expect(phone.locator("#photo-preview")).to_be_visible()
    wait_for("the preview to load", lambda: preview.evaluate("i => i.complete && i.naturalWidth > 0"), 10)
    expect(phone.locator("#form-error")).to_be_hidden()
    expect(phone.locator("#prompt")).to_have_value("me as a pirate captain")
    assert_fits(phone, "the photo preview at 360 px")
    shot(phone, "participant-photo-preview")

    # Sent slowly (8 KB/s up), so the progress bar can be seen moving.
    cdp = phone.context.new_cdp_session(phone)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions", {
        "offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": 8 * 1024})
    with phone.expect_response(lambda r: r.url.endswith("/photo") and r.request.method == "POST",
                               timeout=RESULT_WAIT) as stored:
        phone.click("#go")
        expect(phone.locator("#upload")).to_be_visible()
        expect(phone.locator("#upload-text")).to_contain_text(EN["p.uploading"].split("…")[0])
        phone.wait_for_function("() => document.querySelector('#upload-progress').value > 0", timeout=RESULT_WAIT)
        shot(phone, "participant-photo-uploading", settle=False)
    cdp.send("Network.emulateNetworkConditions", {
        "offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
    answer = stored.value
    assert answer.status == 201, f"{answer.status} {answer.text()}"
    body = answer.json()
    assert max(body["width"], body["height"]) == 512 and (body["width"], body["height"]) == (384, 512), body

    # What crossed the network: one upload, a JPEG already 384x512 (the
    # browser's work, not the server's), far below the 1200x900 file.
    assert len(posts) == 1, f"one upload, got {len(posts)}"
    key, sent = posts[0]
    assert key and re.fullmatch(r"[0-9a-f-]{36}", key), key
    original = PHOTO.stat().st_size
    print(f"     upload: {len(sent) if sent is not None else 'no body seen'} B of {original} B")
    if sent is not None:
        assert jpeg_size(sent) == (384, 512), f"the upload is {jpeg_size(sent)}, not 384x512"
        assert len(sent) < original / 2, f"the upload ({len(sent)} B) is not far below the file ({original} B)"
        assert b"Exif" not in sent[:200], "the upload still carries the file's EXIF (GPS)"
    assert body["bytes"] < original, body
    # The photo's id and key are kept for a reload (no second upload).
    kept = phone.evaluate(f"() => JSON.parse(sessionStorage.getItem('stagehand:p:{slug}:photo'))")
    assert kept["id"] == body["photo_id"] and kept["key"] == key, kept

    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    expect(phone.locator("#upload")).to_be_hidden()
    expect(phone.locator("#result-content figcaption")).to_contain_text("me as a pirate captain")
    img = phone.locator("#result-content img")
    expect(img).to_have_count(1)
    assert re.fullmatch(r"/media/r/[0-9a-f]{32}\.\w+", img.get_attribute("src")), img.get_attribute("src")
    wait_for("the result image to load on the phone", lambda: images_loaded(phone, "#result-content img"), 10)
    shot(phone, "participant-photo-result")
    sagas = [s for s in env.server.sagas(experience=slug) if s["nickname"] == "snap"]
    assert len(sagas) == 1, sagas

    expect(display.locator("#latest-nickname")).to_have_text("snap", timeout=RESULT_WAIT)
    shown = display.locator("#latest-content img")
    expect(shown).to_have_count(1)
    wait_for("the result image to load on the display", lambda: images_loaded(display, "#latest-content img"), 10)
    assert shown.evaluate("i => i.naturalWidth") > 0
    expect(display.locator("#latest-content .img-missing")).to_have_count(0)
    shot(display, "terminal-photo-result")

    # Play again: a new photo is asked for.
    phone.click("#play-again")
    expect(take).to_be_visible()
    expect(phone.locator("#photo-preview")).to_be_hidden()


def test_photo_reload_does_not_upload_twice(env):
    """A reload keeps the chosen photo and what was typed (a phone may
    reload the page behind its camera); and once the photo is uploaded, a
    reload before the submission is answered sends the submission again
    with its key and the same photo_id, and never uploads the photo a
    second time."""
    slug, _ = photo_experience(env)
    phone = env.phone()
    posts = photo_posts(phone)
    submissions = []
    held = []

    def hold_the_first(route):  # the first is never answered: the reload comes first
        submissions.append(route.request.headers.get("idempotency-key"))
        if len(submissions) == 1:
            held.append(route)
        else:
            route.continue_()

    phone.route("**/api/sessions/*/submission", hold_the_first)
    phone.goto(f"/p/{slug}")
    expect(phone.locator("#view-form")).to_be_visible()
    phone.fill("#nickname", "reloader")
    phone.fill("#prompt", "a knight in shining armour")
    with phone.expect_file_chooser() as chooser:
        phone.click("#photo-take")
    chooser.value.set_files(str(PHOTO))
    expect(phone.locator("#photo-preview")).to_be_visible()
    phone.reload()
    expect(phone.locator("#view-form")).to_be_visible()
    expect(phone.locator("#nickname")).to_have_value("reloader")
    expect(phone.locator("#prompt")).to_have_value("a knight in shining armour")
    preview = phone.locator("#photo-img")
    expect(preview).to_be_visible()
    wait_for("the kept preview to load", lambda: preview.evaluate("i => i.complete && i.naturalWidth > 0"), 10)
    assert posts == [], "nothing is uploaded before the submit"
    with phone.expect_request(lambda r: r.url.endswith("/submission"), timeout=RESULT_WAIT):
        phone.click("#go")
    phone.wait_for_timeout(200)  # the route handler holds it
    assert len(submissions) == 1 and len(posts) == 1, (submissions, posts)
    expect(phone.locator("#go")).to_have_text(EN["p.sending"])
    phone.reload()
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    assert len(posts) == 1, f"the photo was uploaded {len(posts)} times"
    assert len(submissions) == 2 and len(set(submissions)) == 1, f"the retry must reuse its key: {submissions}"
    sagas = [s for s in env.server.sagas(experience=slug) if s["nickname"] == "reloader"]
    assert len(sagas) == 1, sagas


def test_photo_retake_names_the_photo_it_replaces(env):
    """A guest whose prompt was refused tries again in the same session and
    retakes the photo: the new upload names the stored one it replaces
    (?replaces=), so retakes never count against the session's
    max_photos_per_session; the first, which a submission named, stays."""
    slug, _ = photo_experience(env)
    phone = env.phone()
    uploads = []
    phone.on("request", lambda r: uploads.append(r.url)
             if r.method == "POST" and "/photo" in r.url else None)
    phone.goto(f"/p/{slug}")
    expect(phone.locator("#view-form")).to_be_visible()
    phone.fill("#nickname", "retaker")
    phone.fill("#prompt", "something forbidden please")
    phone.locator("#photo-input").set_input_files(str(PHOTO))
    expect(phone.locator("#photo-preview")).to_be_visible()
    phone.click("#go")
    expect(phone.locator("#view-aborted")).to_be_visible(timeout=RESULT_WAIT)
    first = phone.evaluate(f"() => JSON.parse(sessionStorage.getItem('stagehand:p:{slug}:photo'))")
    assert first and first["id"], first
    phone.click("#try-again")
    expect(phone.locator("#view-form")).to_be_visible()
    if phone.locator("#photo-retake").is_visible():
        phone.click("#photo-retake")
    phone.locator("#photo-input").set_input_files(str(PHOTO))
    expect(phone.locator("#photo-preview")).to_be_visible()
    phone.fill("#prompt", "a friendly dragon baking bread")
    phone.click("#go")
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    assert len(uploads) == 2, uploads
    assert "replaces" not in uploads[0], uploads
    assert uploads[1].endswith(f"/photo?replaces={first['id']}"), uploads


def test_photo_busy_is_retried_with_the_same_key(env):
    """The photo pool is full (503 photo_pool_full, Retry-After: 1) twice:
    the phone says it is trying again and sends the same bytes under the
    same Idempotency-Key until the server takes them; one photo is stored."""
    slug, _ = photo_experience(env)
    phone = env.phone()
    tries = []

    def busy_twice(route):
        tries.append((route.request.headers.get("idempotency-key"), route.request.post_data_buffer))
        if len(tries) <= 2:
            route.fulfill(status=503, headers={"Retry-After": "1"}, content_type="application/json",
                          body=json.dumps({"error": "photo_pool_full", "message": "every photo worker is busy"}))
        else:
            route.continue_()

    phone.route("**/api/sessions/*/photo", busy_twice)
    phone.goto(f"/p/{slug}")
    expect(phone.locator("#view-form")).to_be_visible()
    phone.fill("#nickname", "patient")
    phone.fill("#prompt", "a lighthouse in a storm")
    phone.locator("#photo-input").set_input_files(str(PHOTO))
    expect(phone.locator("#photo-img")).to_be_visible()
    phone.click("#go")
    expect(phone.locator("#form-note")).to_have_text(EN["p.photoBusyRetrying"].format(n=1))
    expect(phone.locator("#view-waiting")).to_be_visible(timeout=RESULT_WAIT)
    assert len(tries) == 3, f"two busy answers, then the upload: {len(tries)} tries"
    assert len({k for k, _ in tries}) == 1, f"the retries must reuse the key: {[k for k, _ in tries]}"
    assert len({b for _, b in tries}) == 1, "the retries must send the same bytes"
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)


def test_photo_refusal_keeps_the_prompt(env):
    """A text file chosen as the photo: the browser cannot draw it, so it is
    sent as it is and the server refuses it (415); the phone says so in
    plain words, asks for another photo and keeps what was typed."""
    slug, _ = photo_experience(env)
    phone = env.phone()
    statuses = []
    phone.on("response", lambda r: statuses.append(r.status) if r.url.endswith("/photo") else None)
    phone.goto(f"/p/{slug}")
    expect(phone.locator("#view-form")).to_be_visible()
    phone.fill("#nickname", "typist")
    phone.fill("#prompt", "a castle made of clouds")
    phone.locator("#photo-input").set_input_files(
        {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"not a photo at all\n" * 20})
    expect(phone.locator("#photo-preview")).to_be_visible()
    expect(phone.locator("#photo-noview")).to_be_visible()
    expect(phone.locator("#photo-name")).to_have_text("notes.txt")
    phone.click("#go")
    error = phone.locator("#form-error")
    expect(error).to_have_text(EN["p.error.unsupported_media_type"], timeout=RESULT_WAIT)
    assert statuses == [415], statuses
    expect(phone.locator("#prompt")).to_have_value("a castle made of clouds")
    expect(phone.locator("#prompt")).to_be_enabled()
    expect(phone.locator("#photo-take")).to_be_visible()  # another photo, please
    expect(phone.locator("#go")).to_have_text(EN["p.submit"])
    expect(phone.locator("#upload")).to_be_hidden()
    assert_fits(phone, "the refused photo at 360 px")
    shot(phone, "participant-photo-refused")
    # A real photo then goes through, in the same session.
    phone.locator("#photo-input").set_input_files(str(PHOTO))
    expect(phone.locator("#photo-img")).to_be_visible()
    phone.click("#go")
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    assert statuses == [415, 201], statuses


# ---- the guests' data: the result link, erasing, the gallery, consent ------


def guest_experience(env, slug, title, **settings):
    """An experience with the guests' data settings, and a terminal for it."""
    env.server.operator("POST", "/api/experiences", {
        "slug": slug, "title": title, "kind": "image", "locale": "en", **settings})
    return env.server.terminal(slug, f"{slug} booth")


def wait_completed(env, session_id, token):
    return wait_for(f"session {session_id} to complete", lambda: (lambda v: v if v["status"] == "COMPLETED" else None)(
        env.server.ok("GET", f"/api/sessions/{session_id}", token=token)), 30)


def phone_session(page, slug):
    """The session the phone page keeps: {id, token}."""
    return page.evaluate(f"() => JSON.parse(localStorage.getItem('stagehand:p:{slug}')).session")


def submission_bodies(page):
    """The bodies of the page's submissions, as they go."""
    bodies = []
    page.on("request", lambda r: bodies.append(r.post_data_json)
            if r.method == "POST" and r.url.endswith("/submission") else None)
    return bodies


def fetch_bytes(env, path):
    with urllib.request.urlopen(env.base + path, timeout=10) as r:
        return r.read()


# Gone from the display: no element of the session, and not its nickname.
GONE_FROM_DISPLAY = """([id, nickname]) => !document.querySelector(`[data-session-id="${id}"]`)
    && !document.body.innerText.includes(nickname)"""

# A phone with a share sheet that takes files: what it was given is kept.
SHARE_SHEET = """(() => {
    window.__shared = [];
    Navigator.prototype.canShare = function (data) { return Boolean(data); };
    Navigator.prototype.share = async function (data) {
        const files = [];
        for (const f of (data && data.files) || []) files.push({name: f.name, type: f.type, size: f.size});
        window.__shared.push({title: data.title || null, url: data.url || null, files});
    };
})()"""
# A browser without one (as Chromium on a Linux desktop).
NO_SHARE_SHEET = "delete Navigator.prototype.share; delete Navigator.prototype.canShare;"


def test_share_and_erase(env):
    """(acceptance) A guest's result link: the phone shows it with its QR
    code; on another device the link shows the title and the picture, its
    Download button saves the very bytes stagehand kept, and Share hands
    over the file (or copies the link); erasing it on the owner's device
    (after a confirm) takes the result off the booth display within 1 s of
    the DELETE's answer, the link then answers 410 with a page, and the
    session view says erased."""
    term = guest_experience(env, "keepsake", "Keepsake booth", gallery="public")
    display = open_terminal(env, term)
    phone = env.phone()
    phone.goto(f"/p/keepsake?terminal={term['terminal_id']}")
    participant_submit(phone, "sharer", "a paper boat on a pond")
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    expect(display.locator("#latest-nickname")).to_have_text("sharer", timeout=RESULT_WAIT)

    # The phone: the result link, absolute, and its QR code.
    mine = phone_session(phone, "keepsake")
    session_id, token = mine["id"], mine["token"]
    view = env.server.ok("GET", f"/api/sessions/{session_id}", token=token)
    assert re.fullmatch(r"/r/[0-9a-f]{32}", view.get("share_url") or ""), view
    assert view["erased"] is False and view["in_gallery"] is True, view
    share_path = view["share_url"]
    share_id = share_path.rsplit("/", 1)[1]
    link = env.base + share_path
    box = phone.locator("#share-box")
    expect(box).to_be_visible()
    expect(box.locator("h3")).to_have_text(EN["p.shareTitle"])
    expect(phone.locator("#share-link")).to_have_text(link)
    expect(phone.locator("#share-link")).to_have_attribute("href", link)
    qr = phone.locator("#share-qr")
    expect(qr).to_have_attribute("src", f"{share_path}/qr.svg")
    wait_for("the link's QR code to load", lambda: qr.evaluate("i => i.complete && i.naturalWidth > 0"), 10)
    expect(phone.locator("#erase")).to_have_text(EN["p.erase"])
    assert_fits(phone, "the result link on the phone at 360 px")
    shot(phone, "participant-share")
    assert display.locator(f"#latest[data-session-id='{session_id}']").count() == 1

    # Another device: the link shows the title and the full picture.
    shared = env.server.ok("GET", f"/api/share/{share_id}")
    assert shared["session_id"] == session_id and shared["experience"] == "keepsake", shared
    assert shared["download_url"] == f"{share_path}/download", shared
    full = next(c for c in shared["content"] if c["type"] == "image")
    friend = env.page(**PHONE, permissions=["clipboard-read", "clipboard-write"])
    friend.add_init_script(NO_SHARE_SHEET)
    friend.goto(share_path)
    expect(friend.locator("#view-result")).to_be_visible()
    expect(friend.locator("#title")).to_have_text("Keepsake booth")
    assert friend.title() == "Keepsake booth", friend.title()
    expect(friend.locator("#byline")).to_have_text(EN["r.by"].format(nickname="sharer"))
    img = friend.locator("#result-content img")
    expect(img).to_have_count(1)
    assert img.get_attribute("src") == full["url"], (img.get_attribute("src"), full)
    wait_for("the picture to load on the other device", lambda: images_loaded(friend, "#result-content img"), 10)
    wait_for("the link's QR code to load there", lambda: images_loaded(friend, "#qr"), 10)
    expect(friend.locator("#qr")).to_have_attribute("src", f"/r/{share_id}/qr.svg")
    expect(friend.locator("#owner")).to_be_hidden()  # only the owner's device can erase
    assert_fits(friend, "the result page at 360 px")
    shot(friend, "result")

    # Download: byte for byte the object stagehand kept.
    expect(friend.locator("#download")).to_have_text(EN["r.download"])
    with friend.expect_download() as dl:
        friend.click("#download")
    saved = pathlib.Path(dl.value.path()).read_bytes()
    kept = fetch_bytes(env, full["url"])
    assert saved == kept, f"the download ({len(saved)} B) differs from the kept object ({len(kept)} B)"
    print(f"     download: {dl.value.suggested_filename}, {len(saved)} B")

    # Share without a share sheet: the link is copied, and said so.
    friend.click("#share")
    note = friend.locator("#share-note")
    expect(note).to_be_visible()
    expect(note).to_have_text(re.compile("^(" + re.escape(EN["r.copied"].format(url=link)) + "|"
                                         + re.escape(EN["r.copyThis"].format(url=link)) + ")$"))
    # With a share sheet that takes files: the picture itself goes.
    sheet = env.page(**PHONE)
    sheet.add_init_script(SHARE_SHEET)
    sheet.goto(share_path)
    expect(sheet.locator("#view-result")).to_be_visible()
    sheet.click("#share")
    given = wait_for("the share sheet", lambda: sheet.evaluate("() => window.__shared"), 10)
    assert len(given) == 1 and len(given[0]["files"]) == 1, given
    assert given[0]["files"][0]["size"] == len(kept), (given, len(kept))
    expect(sheet.locator("#share-note")).to_be_hidden()

    # The owner's device opens its link: it may erase (after a confirm).
    owner = env.watch(phone.context.new_page())
    owner.goto(share_path)
    expect(owner.locator("#owner")).to_be_visible()
    expect(owner.locator("#erase")).to_have_text(EN["r.erase"])
    dialogs = []

    def confirm(d):
        dialogs.append((d.type, d.message))
        d.accept()
    owner.once("dialog", confirm)
    with owner.expect_response(lambda r: r.request.method == "DELETE"
                               and r.url.endswith(f"/api/sessions/{session_id}")) as answer:
        owner.click("#erase")
    answered = time.monotonic()
    assert answer.value.status == 200, f"DELETE /api/sessions/{session_id} -> {answer.value.status} {answer.value.text()}"
    # The display drops it within 1 s of the answer.
    display.wait_for_function(GONE_FROM_DISPLAY, arg=[session_id, "sharer"], timeout=1 * SECOND)
    took = time.monotonic() - answered
    print(f"     the display dropped the result {took * 1000:.0f} ms after the DELETE's answer")
    assert took <= 1.0, took
    body = answer.value.json()
    assert body.get("session_id") == session_id and body.get("erased") is True, body
    assert dialogs == [("confirm", EN["r.eraseConfirm"])], dialogs
    expect(owner.locator("#view-erased")).to_be_visible()
    expect(display.locator("#empty")).to_be_visible()
    shot(owner, "result-erased")

    # The link now answers 410 with a page; its API says gone.
    req = urllib.request.Request(link, headers={"Accept": "text/html"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            raise AssertionError(f"{share_path} still answers {r.status}")
    except urllib.error.HTTPError as e:
        assert e.code == 410, e.code
        assert (e.headers.get("Content-Type") or "").startswith("text/html"), dict(e.headers)
        assert "<html" in e.read().decode(errors="replace").lower()
    again = friend.goto(share_path)
    assert again.status == 410, again.status
    assert friend.locator("body").inner_text().strip(), "the 410 page is empty"
    status, gone, _ = env.server.api("GET", f"/api/share/{share_id}")
    assert status == 410 and gone.get("error") == "gone", (status, gone)
    # The session view says erased; a second DELETE answers 200 again.
    view = env.server.ok("GET", f"/api/sessions/{session_id}", token=token)
    assert view["erased"] is True and view["share_url"] is None, view
    status, repeated, _ = env.server.api("DELETE", f"/api/sessions/{session_id}", token=token)
    assert status == 200 and repeated.get("erased") is True, (status, repeated)
    # The phone page, opened again, says it is deleted.
    phone.reload()
    expect(phone.locator("#erased")).to_be_visible(timeout=RESULT_WAIT)
    expect(phone.locator("#erased")).to_have_text(EN["p.erased"])
    expect(phone.locator("#share-box")).to_be_hidden()
    expect(phone.locator("#result-content img")).to_have_count(0)


NOTICE = {
    "en": "Your photo is deleted an hour after your picture is made; the picture is kept for 30 days.",
    "ko": "사진은 그림이 완성되고 한 시간 뒤 삭제되며, 그림은 30일 동안 보관됩니다.",
}


def test_notice_and_consent(env):
    """The organiser's notice shows on the phone before the camera button
    and the prompt, in the page's language; with consent_required the
    button stays disabled until "I have read this and agree" is ticked, and
    the submission says "consent": true (the server refuses one without)."""
    guest_experience(env, "consent", "Consent booth", input="photo+prompt", photo_max_px=512,
                     notice=NOTICE, consent_required=True)
    phone = env.phone()
    bodies = submission_bodies(phone)
    phone.goto("/p/consent")
    expect(phone.locator("#view-form")).to_be_visible()
    notice = phone.locator("#notice")
    expect(notice).to_be_visible()
    assert phone.locator("#notice-text").text_content() == NOTICE["en"]
    # Read before the camera opens and before the prompt: above both, on
    # the first screen.
    order = phone.evaluate("""() => ['#photo-take', '#prompt', '#go'].map(s =>
        Boolean(document.querySelector('#notice').compareDocumentPosition(document.querySelector(s))
                & Node.DOCUMENT_POSITION_FOLLOWING))""")
    assert order == [True, True, True], order
    top = notice.bounding_box()
    assert top and top["y"] < PHONE["viewport"]["height"] / 2, f"the notice is not on the first screen: {top}"
    consent = phone.locator("#consent")
    expect(phone.locator("#consent-field")).to_have_text(EN["p.consent"])
    expect(consent).not_to_be_checked()
    expect(phone.locator("#optout-field")).to_be_hidden()  # no gallery here
    go = phone.locator("#go")
    expect(go).to_be_disabled()
    phone.fill("#nickname", "careful")
    phone.fill("#prompt", "me as an astronaut")
    phone.locator("#photo-input").set_input_files(str(PHOTO))
    expect(phone.locator("#photo-img")).to_be_visible()
    expect(go).to_be_disabled()
    consent.check()
    expect(go).to_be_enabled()
    consent.uncheck()
    expect(go).to_be_disabled()
    consent.check()
    assert_fits(phone, "the notice and the consent at 360 px")
    shot(phone, "participant-consent")
    go.click()
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    assert len(bodies) == 1 and bodies[0].get("consent") is True, bodies
    assert "in_gallery" not in bodies[0], bodies

    # Without the tick the server refuses it (a prompt-only booth, so that
    # nothing else is missing).
    guest_experience(env, "consent-words", "Consent words", notice=NOTICE["en"], consent_required=True)
    s = env.server.ok("POST", "/api/experiences/consent-words/sessions", {"nickname": "hasty"}, key=str(uuid.uuid4()))
    path = f"/api/sessions/{s['session_id']}/submission"
    status, refused, _ = env.server.api("POST", path, {"prompt": "no consent"}, token=s["participant_token"],
                                        key=str(uuid.uuid4()))
    assert status == 422 and refused.get("error") == "validation_failed", (status, refused)
    env.server.ok("POST", path, {"prompt": "with consent", "consent": True}, token=s["participant_token"],
                  key=str(uuid.uuid4()))

    # In Korean, the Korean notice.
    ko = env.phone()
    ko.goto("/p/consent?lang=ko")
    expect(ko.locator("#notice")).to_be_visible()
    assert ko.locator("#notice-text").text_content() == NOTICE["ko"]
    expect(ko.locator("#consent-field")).to_have_text(KO["p.consent"])
    expect(ko.locator("#go")).to_be_disabled()
    shot(ko, "participant-consent-ko")


def test_gallery_with_a_pin(env):
    """A PIN gallery asks for its PIN; a wrong one reads as wrong, the right
    one shows the grid with the completed result (kept for the tab); a
    guest who ticked "Don't show mine in the gallery" is not in it; a
    result opens in a lightbox (Esc closes it); a new result comes in at the
    top by itself, and one an operator hides leaves."""
    term = guest_experience(env, "party", "Party wall", gallery="pin", gallery_pin="246813")
    shown_id, shown_token = env.server.submit_as("party", "shown-guest", "a disco ball made of fruit",
                                                 terminal_id=term["terminal_id"])
    shy = env.phone()
    bodies = submission_bodies(shy)
    shy.goto(f"/p/party?terminal={term['terminal_id']}")
    expect(shy.locator("#view-form")).to_be_visible()
    optout = shy.locator("#optout-field")
    expect(optout).to_be_visible()
    expect(optout).to_have_text(EN["p.galleryOptOut"])
    shy.locator("#optout").check()
    participant_submit(shy, "shy-guest", "a quiet corner of the party")
    expect(shy.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    assert len(bodies) == 1 and bodies[0].get("in_gallery") is False, bodies
    shy_id = phone_session(shy, "party")["id"]
    wait_completed(env, shown_id, shown_token)
    assert env.server.ok("GET", f"/api/sessions/{shy_id}", token=phone_session(shy, "party")["token"])["in_gallery"] is False

    status, body, _ = env.server.api("GET", "/api/experiences/party/gallery?limit=24")
    assert status == 401 and body.get("error") == "gallery_pin_required", (status, body)

    page = env.phone()
    page.goto("/g/party")
    expect(page.locator("#title")).to_have_text("Party wall")
    expect(page.locator("#view-pin")).to_be_visible()
    expect(page.locator("#pin-error")).to_be_hidden()
    page.fill("#pin", "111111")
    page.click("#pin-go")
    expect(page.locator("#pin-error")).to_have_text(EN["g.pinWrong"])
    expect(page.locator("#view-grid")).to_be_hidden()
    assert_fits(page, "the gallery's PIN form at 360 px")
    shot(page, "gallery-pin")
    sent = []
    page.on("request", lambda r: sent.append(r.headers.get("x-gallery-pin")) if "/gallery?" in r.url else None)
    page.fill("#pin", "246813")
    page.click("#pin-go")
    grid = page.locator("#grid")
    expect(page.locator("#view-grid")).to_be_visible()
    expect(grid.locator("li.g-item")).to_have_count(1)
    tile = grid.locator(f"li.g-item[data-session-id='{shown_id}']")
    expect(tile.locator(".g-name")).to_have_text("shown-guest")
    wait_for("the thumbnail to load", lambda: images_loaded(page, "#grid img"), 10)
    assert "shy-guest" not in grid.inner_text()
    assert sent and all(p == "246813" for p in sent), sent
    assert_fits(page, "the gallery at 360 px")
    shot(page, "gallery")

    # The lightbox: the full picture and the nickname; Esc closes it.
    tile.locator("button.g-open").click()
    box = page.locator("#lightbox")
    expect(box).to_be_visible()
    expect(page.locator("#lightbox-name")).to_have_text("shown-guest")
    wait_for("the full picture to load", lambda: images_loaded(page, "#lightbox-content img"), 10)
    page.keyboard.press("Escape")
    expect(box).to_be_hidden()

    # The PIN is kept for this tab: a reload shows the grid at once.
    page.reload()
    expect(grid.locator("li.g-item")).to_have_count(1)
    expect(page.locator("#view-pin")).to_be_hidden()

    # Live: a new result comes in at the top; one an operator hides leaves.
    late_id, late_token = env.server.submit_as("party", "late-guest", "the last dance",
                                               terminal_id=term["terminal_id"])
    wait_completed(env, late_id, late_token)
    expect(grid.locator("li.g-item")).to_have_count(2, timeout=12 * SECOND)
    expect(grid.locator("li.g-item").first).to_have_attribute("data-session-id", late_id)
    hidden = env.server.operator("POST", f"/api/admin/sessions/{shown_id}/hide", {})
    assert hidden.get("hidden") is True, hidden
    expect(tile).to_have_count(0, timeout=12 * SECOND)
    expect(grid.locator("li.g-item")).to_have_count(1)


def test_gallery_pages_and_more(env):
    """A public gallery needs no PIN: 24 results first, newest first, then
    More loads the older ones (the server's cursor, no result twice); an
    experience without a gallery says so."""
    guest_experience(env, "wall", "Public wall", gallery="public", max_in_flight=30)
    sessions = [env.server.submit_as("wall", f"wall-{i:02d}", f"picture number {i}") for i in range(26)]
    for sid, token in sessions:
        wait_completed(env, sid, token)
    page = env.phone()
    page.goto("/g/wall")
    grid = page.locator("#grid li.g-item")
    expect(page.locator("#view-grid")).to_be_visible()
    expect(page.locator("#view-pin")).to_be_hidden()
    expect(grid).to_have_count(24)
    more = page.locator("#more")
    expect(more).to_have_text(EN["g.more"])
    more.click()
    expect(grid).to_have_count(26)
    expect(more).to_be_hidden()
    ids = grid.evaluate_all("lis => lis.map(li => li.dataset.sessionId)")
    assert sorted(ids) == sorted(sid for sid, _ in sessions), ids
    assert len(set(ids)) == 26, ids
    first = env.server.ok("GET", "/api/experiences/wall/gallery?limit=24")
    assert [i["session_id"] for i in first["items"]] == ids[:24], "the page keeps the server's order"
    assert_fits(page, "a full gallery at 360 px")

    none = env.phone()
    none.goto("/g/comics")
    expect(none.locator("#view-missing")).to_be_visible()
    expect(none.locator("#view-missing")).to_have_text(EN["g.none"])
    status, body, _ = env.server.api("GET", "/api/experiences/comics/gallery?limit=24")
    assert status == 404 and body.get("error") == "not_found", (status, body)


def test_display_shows_the_result_link_qr(env):
    """With display_share_qr "5s", the booth display shows the QR code of a
    new result's link with "Scan to keep your picture" for about 5 s, then
    hides it; a result erased while its QR code shows takes it away at
    once."""
    term = guest_experience(env, "qrbooth", "QR booth", display_share_qr="5s")
    assert env.server.ok("GET", "/api/experiences/qrbooth")["display_share_qr"] == "5s"
    display = open_terminal(env, term)
    card = display.locator("#share")
    expect(card).to_be_hidden()
    sid, token = env.server.submit_as("qrbooth", "scanner", "a treasure map", terminal_id=term["terminal_id"])
    expect(display.locator("#latest-nickname")).to_have_text("scanner", timeout=RESULT_WAIT)
    expect(card).to_be_visible()
    seen = time.monotonic()
    view = env.server.ok("GET", f"/api/sessions/{sid}", token=token)
    expect(display.locator("#share-qr")).to_have_attribute("src", f"{view['share_url']}/qr.svg")
    expect(card.locator("figcaption")).to_have_text(EN["t.shareScan"])
    wait_for("the QR code to load", lambda: images_loaded(display, "#share-qr"), 10)
    size = display.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    assert size == [1920, 1080], f"the QR code keeps the display on one screen: {size}"
    shot(display, "terminal-share-qr")
    expect(card).to_be_hidden(timeout=10 * SECOND)
    shown_for = time.monotonic() - seen
    assert 3.5 <= shown_for <= 7.5, f"the QR code showed {shown_for:.1f} s, not about 5 s"

    # Erased while its QR code shows: it goes at once.
    sid2, token2 = env.server.submit_as("qrbooth", "quick-eraser", "a paper plane",
                                        terminal_id=term["terminal_id"])
    expect(display.locator("#latest-nickname")).to_have_text("quick-eraser", timeout=RESULT_WAIT)
    expect(card).to_have_attribute("data-session-id", sid2)
    status, body, _ = env.server.api("DELETE", f"/api/sessions/{sid2}", token=token2)
    assert status == 200, (status, body)
    answered = time.monotonic()
    display.wait_for_function(GONE_FROM_DISPLAY, arg=[sid2, "quick-eraser"], timeout=1 * SECOND)
    assert time.monotonic() - answered <= 1.0
    expect(card).to_be_hidden()
    # The earlier result is the one shown again.
    expect(display.locator("#latest-nickname")).to_have_text("scanner")


def test_ops_guests_data(env):
    """/ops shows what each experience holds, exports a ZIP of its results
    (fetched with the token), finds a guest by nickname, hides and unhides
    their result (the gallery) and erases their data after a confirm."""
    import io
    import zipfile
    guest_experience(env, "keeper", "Keeper booth", gallery="public")
    sid, token = env.server.submit_as("keeper", "findme", "a lantern festival")
    wait_completed(env, sid, token)
    ops = ops_page(env)
    item = ops.locator("#experience-list li[data-slug=keeper]")
    held = item.locator(".held")
    expect(held).to_contain_text(re.compile(r"Held: \d+ photos \(.+\), 1 results"))
    expect(held).to_contain_text(re.compile(r"\d+ forgotten"))

    with ops.expect_download() as dl:
        item.locator("button.export").click()
    assert dl.value.suggested_filename == "keeper-export.zip", dl.value.suggested_filename
    data = pathlib.Path(dl.value.path()).read_bytes()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "results.csv" in names and len(names) >= 2, names
    expect(item.locator(".export-result")).to_contain_text("keeper-export.zip")

    ops.fill("#g-nickname", "findme")
    ops.locator("#g-experience").select_option("keeper")
    ops.click("#guest-find")
    row = ops.locator(f"#guests tbody tr[data-session-id='{sid}']")
    expect(row).to_be_visible()
    expect(row.locator("td.nickname")).to_have_text("findme")
    row.locator("button.action-hide").click()
    expect(ops.locator("#flash")).to_have_text(EN["ops.done.hide"].format(name="findme"))
    expect(row).to_have_attribute("data-hidden", "true")
    row.locator("button.action-unhide").click()
    expect(row).to_have_attribute("data-hidden", "false")
    shot(ops, "ops-guests", full_page=True)
    ops.once("dialog", lambda d: d.accept())
    row.locator("button.action-erase").click()
    expect(ops.locator("#flash")).to_have_text(EN["ops.done.erase"].format(name="findme"))
    expect(row).to_have_count(0)
    assert env.server.ok("GET", f"/api/sessions/{sid}", token=token)["erased"] is True
    expect(held).to_contain_text(re.compile(r"\b1 forgotten"), timeout=10 * SECOND)


# ---- operators and roles, live settings, the audit log (issue 35) ----------


def ops_sign_in(env, token, refused=None):
    """/ops signed in with `token` (an operator's own), the socket live;
    with a list `refused`, every answer of 401 or 403 the page gets is
    added to it: (status, method, url)."""
    page = env.screen()
    if refused is not None:
        page.on("response", lambda r: refused.append((r.status, r.request.method, r.url))
                if r.status in (401, 403) else None)
    page.goto("/ops")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token", token)
    page.click("#sign-in")
    expect(page.locator("#dashboard")).to_be_visible()
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    return page


def new_operator(env, name, role):
    """An operator made through the API with the bootstrap token."""
    made = env.server.operator("POST", "/api/admin/operators", {"name": name, "role": role})
    assert made["role"] == role and made["token"] and made["operator_id"], made
    return made


# Every button a person can see on the dashboard: its id, or its classes.
VISIBLE_BUTTONS = """() => [...document.querySelectorAll('#dashboard button')]
    .filter(b => b.checkVisibility())
    .map(b => b.id || b.className)"""


def api_experience(env, slug):
    return env.server.ok("GET", f"/api/experiences/{slug}", token=OPERATOR_TOKEN)


def test_ops_settings_edit_in_place(env):
    """(issue 35) An admin edits an experience's live settings in /ops: the
    form shows the current values, Save sends only the changed fields (one
    PATCH with an Idempotency-Key) and shows what the server answered; a
    refused value shows the server's message beside the form; lowering
    max_in_flight below the jobs running now and closing now each ask
    first; a closed experience refuses the phone's submission, and Reopen
    takes them again."""
    env.server.experience("tunable", "Tunable booth", kind="image", max_in_flight=2)
    before = api_experience(env, "tunable")
    ops = ops_page(env)
    expect(ops.locator("#whoami")).to_have_text(f"bootstrap ({EN['ops.role.admin']})")
    item = ops.locator("#experience-list li[data-slug=tunable]")
    edit = item.locator("button.edit-experience")
    expect(edit).to_have_text(EN["ops.edit.open"])
    edit.click()
    form = item.locator("form.experience-edit")
    expect(form).to_be_visible()
    expect(edit).to_have_text(EN["ops.edit.hide"])
    # The current values.
    expect(form.locator("[name=title]")).to_have_value("Tunable booth")
    expect(form.locator("[name=max_in_flight]")).to_have_value("2")
    expect(form.locator("[name=provider]")).to_have_value(before["provider"])
    provider_names = [p["name"] for p in env.server.ok("GET", "/api/admin/providers", token=OPERATOR_TOKEN)["providers"]]
    offered = form.locator("[name=provider] option").evaluate_all("os => os.map(o => o.value)")
    assert set(provider_names) <= set(offered), (provider_names, offered)
    expect(form.locator("[name=weight]")).to_have_value(str(before["weight"]))
    expect(form.locator("[name=credits]")).to_have_value("" if before["credits"] is None else str(before["credits"]))
    expect(form.locator("[name=credits_add]")).to_have_value("")
    expect(form.locator("[name=closes_at]")).to_have_value("")
    expect(form.locator("[name=review]")).to_have_value("off")
    expect(form.locator("[name=review_timeout]")).to_have_value(before["review_timeout"] or "")
    expect(form.locator("[name=locale]")).to_have_value("en")
    expect(form.locator("[name=gallery]")).to_have_value(before["gallery"])
    expect(form.locator("[name=photo_retention]")).to_have_value(before["photo_retention"])
    expect(form.locator("[name=retention]")).to_have_value(before["retention"])
    expect(form.locator(".closes-state")).to_have_text(EN["ops.edit.openNow"])
    expect(form.locator("button.reopen")).to_be_hidden()
    assert_fits(ops, "the experience editor")

    patches = []
    ops.on("request", lambda r: patches.append((r.url, r.post_data_json, r.headers.get("idempotency-key")))
           if r.method == "PATCH" else None)
    # Nothing changed: nothing sent.
    form.locator("button.save-experience").click()
    expect(form.locator(".edit-status")).to_have_text(EN["ops.edit.nothing"])
    assert patches == [], patches

    form.locator("[name=title]").fill("Tuned booth")
    form.locator("[name=max_in_flight]").fill("4")
    form.locator("button.save-experience").click()
    expect(form.locator(".edit-status")).to_have_text(EN["ops.edit.saved"].format(fields="title, max_in_flight"))
    expect(ops.locator("#flash")).to_have_text(EN["ops.edit.savedFlash"].format(slug="tunable"))
    expect(item.locator(".experience-title")).to_have_text("Tuned booth")
    expect(item.locator(".experience-summary")).to_contain_text(EN["ops.maxShort"].format(n=4))
    expect(form.locator("[name=title]")).to_have_value("Tuned booth")
    expect(form.locator("[name=max_in_flight]")).to_have_value("4")
    assert len(patches) == 1, patches
    url, body, key = patches[0]
    assert url.endswith("/api/experiences/tunable"), url
    assert body == {"title": "Tuned booth", "max_in_flight": 4}, body
    assert key and re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", key), key
    now = api_experience(env, "tunable")
    assert (now["title"], now["max_in_flight"]) == ("Tuned booth", 4), now

    # A refused value: the server's message beside the form, nothing saved.
    patches.clear()
    form.locator("[name=retention]").fill("forever and a day")
    form.locator("button.save-experience").click()
    error = form.locator(".edit-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("retention")
    assert patches and patches[-1][1] == {"retention": "forever and a day"}, patches
    assert api_experience(env, "tunable")["retention"] == before["retention"]
    form.locator("[name=retention]").fill(before["retention"])

    # Lowering max_in_flight below the jobs running now asks first. Twelve
    # 2 s jobs, three at a time: three run for several seconds.
    form.locator("[name=max_in_flight]").fill("3")
    form.locator("button.save-experience").click()
    expect(form.locator(".edit-status")).to_have_text(EN["ops.edit.saved"].format(fields="max_in_flight"))
    for i in range(12):
        env.server.submit_as("tunable", f"busy-{i}", f"a busy picture {i}")
    capacity = ops.locator("#capacity li[data-slug=tunable] .in-flight")
    expect(capacity).to_have_text(EN["ops.inFlight"].format(n=3, max=3), timeout=RESULT_WAIT)
    asked = []

    def answer(accept):
        def handler(dialog):
            asked.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()
        return handler

    patches.clear()
    ops.once("dialog", answer(False))
    form.locator("[name=max_in_flight]").fill("1")
    form.locator("button.save-experience").click()
    expect(form.locator(".edit-status")).to_have_text(EN["ops.edit.notSaved"])
    assert len(asked) == 1 and "Tuned booth" in asked[0], asked
    assert patches == [], f"a dismissed confirm sends nothing: {patches}"
    # (Asked again while more than one still runs: yes.)
    accept = answer(True)
    ops.on("dialog", accept)
    form.locator("button.save-experience").click()
    expect(form.locator(".edit-status")).to_have_text(EN["ops.edit.saved"].format(fields="max_in_flight"))
    ops.remove_listener("dialog", accept)
    del asked[1:]
    assert api_experience(env, "tunable")["max_in_flight"] == 1
    # Nothing running was cancelled.
    cancelled = [s for s in env.server.sagas(experience="tunable") if s.get("abort_reason") == "CANCELLED"]
    assert not cancelled, cancelled
    # Raising it again (no question) lets the queue go at once.
    form.locator("[name=max_in_flight]").fill("12")
    form.locator("button.save-experience").click()
    expect(form.locator(".edit-status")).to_have_text(EN["ops.edit.saved"].format(fields="max_in_flight"))
    assert len(asked) == 1, f"raising asks nothing: {asked}"
    wait_for("the twelve sagas to complete", lambda: (lambda ss: len(ss) == 12 and all(
        s["step"] == "COMPLETED" for s in ss))(env.server.sagas(experience="tunable")), 40)

    # Close now: a dismissed confirm leaves it open.
    ops.once("dialog", answer(False))
    form.locator("button.close-now").click()
    expect(form.locator(".edit-status")).to_have_text(EN["ops.edit.notSaved"])
    assert len(asked) == 2 and "Tuned booth" in asked[1], asked
    assert api_experience(env, "tunable")["closes_at"] is None
    ops.once("dialog", answer(True))
    form.locator("button.close-now").click()
    expect(item.locator(".closed-badge")).to_have_text(EN["ops.edit.closed"])
    expect(form.locator(".closes-state")).to_have_class(re.compile(r"\bclosed\b"))
    expect(form.locator("[name=closes_at]")).not_to_have_value("")
    expect(form.locator("button.reopen")).to_be_visible()
    closes_at = api_experience(env, "tunable")["closes_at"]
    assert closes_at, "closed now"
    assert patches[-1][1].keys() == {"closes_at"}, patches[-1]
    shot(ops, "ops-experience-editor", full_page=True)

    # The phone is told the experience is closed.
    phone = env.phone()
    phone.goto("/p/tunable")
    participant_submit(phone, "latecomer", "a door that just closed")
    expect(phone.locator("#form-error")).to_have_text(EN["p.error.closing"], timeout=RESULT_WAIT)
    expect(phone.locator("#view-form")).to_be_visible()
    shot(phone, "participant-closed")

    # Reopen: no question, and the phone's next try goes through.
    patches.clear()
    form.locator("button.reopen").click()
    expect(item.locator(".closed-badge")).to_have_count(0)
    expect(form.locator(".closes-state")).to_have_text(EN["ops.edit.openNow"])
    expect(form.locator("[name=closes_at]")).to_have_value("")
    assert patches and patches[-1][1] == {"closes_at": None}, patches
    assert len(asked) == 3, asked
    assert api_experience(env, "tunable")["closes_at"] is None
    participant_submit(phone, "latecomer", "a door open again")
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)

    # Closed from the editor's field (a past time) asks too.
    ops.once("dialog", answer(False))
    form.locator("[name=closes_at]").fill("2020-01-01T10:00")
    form.locator("button.save-experience").click()
    expect(form.locator(".edit-status")).to_have_text(EN["ops.edit.notSaved"])
    assert len(asked) == 4, asked
    form.locator("[name=closes_at]").fill("")
    # The editor closes and opens again with the server's values.
    edit.click()
    expect(form).to_be_hidden()
    edit.click()
    expect(form.locator("[name=title]")).to_have_value("Tuned booth")
    expect(form.locator("[name=max_in_flight]")).to_have_value("12")


def test_ops_roles_show_only_what_they_may(env):
    """(issue 35) A viewer's /ops reads everything and shows no button that
    changes anything; a moderator's shows approve / reject (one and all)
    and hide / unhide, and no settings, operators, audit, cancel, retry,
    erase, export or breaker; the header says who is signed in. Neither
    page asks the server for what its role may not do."""
    env.server.operator("POST", "/api/experiences", {
        "slug": "roles", "title": "Roles booth", "kind": "image", "review": "before_display"})
    sid, _ = env.server.submit_as("roles", "waits-for-review", "a quiet harbour")
    viewer_op = new_operator(env, "Vera Viewer", "viewer")
    moderator_op = new_operator(env, "Moe Moderator", "moderator")

    # The viewer.
    refused = []
    viewer = ops_sign_in(env, viewer_op["token"], refused)
    expect(viewer.locator("#whoami")).to_have_text(f"Vera Viewer ({EN['ops.role.viewer']})")
    assert viewer.evaluate("() => document.body.dataset.role") == "viewer"
    card = viewer.locator("#review-queue .review-card")
    expect(card).to_have_count(1, timeout=RESULT_WAIT)
    expect(card.locator(".nickname")).to_have_text("waits-for-review")
    expect(card.locator("button")).to_have_count(0)
    row = viewer.locator("#sagas tbody tr", has=viewer.locator("td.nickname", has_text="waits-for-review"))
    expect(row).to_have_attribute("data-step", "IN_REVIEW")
    expect(row.locator("button")).to_have_count(0)
    expect(provider_card(viewer, "default")).to_be_visible()
    expect(provider_card(viewer, "default").locator(".provider-actions")).to_be_hidden()
    item = viewer.locator("#experience-list li[data-slug=roles]")
    expect(item).to_be_visible()
    expect(item.locator(".held")).to_contain_text("Held:")
    expect(item.locator("button")).to_have_count(0)
    viewer.fill("#g-nickname", "waits-for-review")
    viewer.click("#guest-find")
    guest = viewer.locator(f"#guests tbody tr[data-session-id='{sid}']")
    expect(guest).to_be_visible()
    expect(guest.locator("button")).to_have_count(0)
    for hidden in ["#new-experience-section", "#new-terminal-section", "#operators-section", "#audit-section",
                   "#retry-failed", "#review-approve-all"]:
        expect(viewer.locator(hidden)).to_be_hidden()
    buttons = viewer.evaluate(VISIBLE_BUTTONS)
    assert set(buttons) <= {"saga-refresh", "guest-find", "sagas-more", "mail-refresh"}, \
        f"a viewer sees write buttons: {buttons}"
    # The decision keys do nothing for a viewer.
    viewer.locator("#review-queue").click()
    viewer.keyboard.press("a")
    viewer.wait_for_timeout(1000)
    assert env.server.sagas(experience="roles")[0]["step"] == "IN_REVIEW"
    assert_fits(viewer, "a viewer's dashboard")
    shot(viewer, "ops-viewer", full_page=True)
    assert not refused, f"the viewer's page asked for what a viewer may not do: {refused}"

    # The moderator.
    refused = []
    mod = ops_sign_in(env, moderator_op["token"], refused)
    expect(mod.locator("#whoami")).to_have_text(f"Moe Moderator ({EN['ops.role.moderator']})")
    card = mod.locator("#review-queue .review-card")
    expect(card).to_have_count(1, timeout=RESULT_WAIT)
    expect(card.locator("button.action-approve")).to_be_visible()
    expect(card.locator("button.action-reject")).to_be_visible()
    expect(mod.locator("#review-approve-all")).to_be_visible()
    row = mod.locator("#sagas tbody tr", has=mod.locator("td.nickname", has_text="waits-for-review"))
    expect(row).to_be_visible()
    expect(row.locator("button")).to_have_count(0)
    expect(provider_card(mod, "default").locator(".provider-actions")).to_be_hidden()
    item = mod.locator("#experience-list li[data-slug=roles]")
    expect(item).to_be_visible()
    expect(item.locator("button.edit-experience")).to_have_count(0)
    expect(item.locator("button.export")).to_have_count(0)
    for hidden in ["#new-experience-section", "#new-terminal-section", "#operators-section", "#audit-section",
                   "#retry-failed"]:
        expect(mod.locator(hidden)).to_be_hidden()
    mod.fill("#g-nickname", "waits-for-review")
    mod.click("#guest-find")
    guest = mod.locator(f"#guests tbody tr[data-session-id='{sid}']")
    expect(guest.locator("button.action-hide")).to_be_visible()
    expect(guest.locator("button.action-erase")).to_have_count(0)
    buttons = mod.evaluate(VISIBLE_BUTTONS)
    allowed = {"saga-refresh", "guest-find", "sagas-more", "review-approve-all", "mail-refresh", "mail-retry"}
    for b in buttons:
        assert b in allowed or re.search(r"\baction-(approve|reject|hide|unhide)\b", b), \
            f"a moderator sees a button beyond their role: {b} (all: {buttons})"
    shot(mod, "ops-moderator", full_page=True)
    # What a moderator may do works.
    guest.locator("button.action-hide").click()
    expect(mod.locator("#flash")).to_have_text(EN["ops.done.hide"].format(name="waits-for-review"))
    expect(guest).to_have_attribute("data-hidden", "true")
    guest.locator("button.action-unhide").click()
    expect(guest).to_have_attribute("data-hidden", "false")
    card.locator("button.action-approve").click()
    expect(card).to_have_count(0)
    wait_for("the approved saga to complete", lambda: env.server.sagas(experience="roles")[0]["step"] == "COMPLETED", 15)
    assert not refused, f"the moderator's page asked for what a moderator may not do: {refused}"

    # The server holds the same line: a moderator's token may not change
    # settings (403, saying what it needs).
    status, body, _ = env.server.api("PATCH", "/api/experiences/roles", {"title": "nope"},
                                     token=moderator_op["token"], key=str(uuid.uuid4()))
    assert status == 403 and body.get("error") == "forbidden" and body.get("needs") == "admin", (status, body)

    # The admin sees it all.
    admin = ops_page(env)
    expect(admin.locator("#whoami")).to_have_text(f"bootstrap ({EN['ops.role.admin']})")
    for shown in ["#new-experience-section", "#new-terminal-section", "#operators-section", "#audit-section",
                  "#retry-failed"]:
        expect(admin.locator(shown)).to_be_visible()
    expect(admin.locator("#experience-list li[data-slug=roles] button.edit-experience")).to_be_visible()
    expect(admin.locator("#experience-list li[data-slug=roles] button.export")).to_be_visible()


def test_ops_operators_and_audit(env):
    """(issue 35) An admin creates an operator in /ops and sees its token
    once, the new operator signs in with it, the admin revokes it (after a
    confirm) and the operator's open page returns to the sign-in form
    saying the token was revoked; the audit panel lists operator.create
    and operator.revoke under the admin's name, follows new entries by
    itself, narrows by action and by operator, pages with More, and shows
    every server string as text."""
    admin_op = new_operator(env, "Ada Admin", "admin")
    ops = ops_sign_in(env, admin_op["token"])
    expect(ops.locator("#whoami")).to_have_text(f"Ada Admin ({EN['ops.role.admin']})")
    section = ops.locator("#operators-section")
    expect(section).to_be_visible()
    me_row = ops.locator(f"#operators tbody tr[data-operator-id='{admin_op['operator_id']}']")
    expect(me_row.locator("td.name")).to_contain_text("Ada Admin")
    expect(me_row.locator("td.name")).to_contain_text(EN["ops.operators.you"])
    expect(me_row.locator("td.role")).to_have_text(EN["ops.role.admin"])

    # Create: the token is shown once.
    form = ops.locator("#new-operator")
    form.locator("[name=name]").fill("Temp Helper")
    form.locator("[name=role]").select_option("viewer")
    form.locator("button[type=submit]").click()
    result = ops.locator("#new-operator-result")
    expect(result).to_be_visible()
    expect(ops.locator("#new-operator-text")).to_contain_text("Temp Helper")
    expect(result).to_contain_text(EN["ops.operators.tokenOnce"])
    token = ops.locator("#new-operator-token").inner_text().strip()
    assert len(token) >= 16, token
    row = ops.locator("#operators tbody tr", has=ops.locator("td.name", has_text="Temp Helper"))
    expect(row).to_have_count(1)
    expect(row).to_have_attribute("data-revoked", "false")
    expect(row.locator("td.role")).to_have_text(EN["ops.role.viewer"])
    helper_id = row.get_attribute("data-operator-id")
    listed = env.server.ok("GET", "/api/admin/operators", token=OPERATOR_TOKEN)["operators"]
    assert all("token" not in o for o in listed), listed
    assert any(o["operator_id"] == helper_id and o["revoked_at"] is None for o in listed), listed
    assert token not in json.dumps(listed)
    shot(ops, "ops-operators", full_page=True)
    ops.click("#new-operator-close")
    expect(result).to_be_hidden()
    assert token not in ops.content(), "the token is shown once"

    # The new operator signs in with it.
    helper = ops_sign_in(env, token)
    expect(helper.locator("#whoami")).to_have_text(f"Temp Helper ({EN['ops.role.viewer']})")

    # Revoke: a dismissed confirm keeps it.
    asked = []
    ops.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    row.locator("button.action-revoke").click()
    ops.wait_for_timeout(500)
    assert len(asked) == 1 and "Temp Helper" in asked[0], asked
    expect(row).to_have_attribute("data-revoked", "false")
    ops.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    row.locator("button.action-revoke").click()
    expect(row).to_have_attribute("data-revoked", "true")
    expect(row.locator("button.action-revoke")).to_have_count(0)
    expect(ops.locator("#flash")).to_have_text(EN["ops.operators.revokedDone"].format(name="Temp Helper"))
    listed = env.server.ok("GET", "/api/admin/operators", token=OPERATOR_TOKEN)["operators"]
    assert next(o for o in listed if o["operator_id"] == helper_id)["revoked_at"], listed

    # The revoked operator's open page: back to the sign-in form, told why.
    expect(helper.locator("#login")).to_be_visible(timeout=10 * SECOND)
    expect(helper.locator("#login-error")).to_have_text(EN["ops.tokenRevoked"])
    expect(helper.locator("#dashboard")).to_be_hidden()
    helper.fill("#token", token)
    helper.click("#sign-in")
    expect(helper.locator("#login-error")).to_have_text(EN["ops.tokenWrong"])

    # The audit log: both, under the admin's name, newest first.
    audit = ops.locator("#audit tbody")
    mine = lambda action: audit.locator(f"tr[data-action='{action}']").filter(  # noqa: E731
        has=ops.locator("td.operator", has_text=re.compile(r"^Ada Admin$"))).filter(
        has=ops.locator("td.target", has_text=helper_id))
    expect(mine("operator.create")).to_have_count(1, timeout=10 * SECOND)
    expect(mine("operator.revoke")).to_have_count(1, timeout=10 * SECOND)
    actions = audit.locator("tr").evaluate_all("rs => rs.map(r => r.dataset.action)")
    assert actions.index("operator.revoke") < actions.index("operator.create"), f"newest first: {actions}"
    # Ada's own creation, by the bootstrap token.
    expect(audit.locator("tr[data-action='operator.create']").filter(
        has=ops.locator("td.operator", has_text=re.compile(r"^bootstrap$"))).filter(
        has=ops.locator("td.target", has_text=admin_op["operator_id"]))).to_have_count(1)

    # It follows by itself (every 2 s): a change made elsewhere shows.
    env.server.experience("audited", "<b>Audited</b> booth", kind="image")
    env.server.operator("PATCH", "/api/experiences/audited", {"max_in_flight": 3})
    update = audit.locator("tr[data-action='experience.update']").filter(has=ops.locator("td.target", has_text="audited"))
    expect(update.first).to_be_visible(timeout=10 * SECOND)
    expect(update.first.locator("td.detail")).to_contain_text("max_in_flight")
    expect(update.first.locator("td.operator")).to_have_text("bootstrap")

    # Narrowed by action.
    total = audit.locator("tr").count()
    ops.locator("#a-action").select_option("operator.revoke")
    wait_for("only operator.revoke rows", lambda: (lambda acts: acts and set(acts) == {"operator.revoke"})(
        audit.locator("tr").evaluate_all("rs => rs.map(r => r.dataset.action)")), 10)
    assert audit.locator("tr").count() < total
    expect(mine("operator.revoke")).to_have_count(1)
    # And by operator.
    ops.locator("#a-action").select_option("")
    ops.locator("#a-operator").select_option(admin_op["operator_id"])
    wait_for("only Ada's rows", lambda: (lambda who: who and set(who) == {"Ada Admin"})(
        audit.locator("tr td.operator").evaluate_all("ts => ts.map(t => t.textContent)")), 10)
    expect(mine("operator.create")).to_have_count(1)
    ops.locator("#a-operator").select_option("")

    # More: a page holds 50; 55 updates need a second one.
    for i in range(55):
        env.server.operator("PATCH", "/api/experiences/audited", {"weight": 1 + i % 2 + 1})
    ops.locator("#a-action").select_option("experience.update")
    rows = audit.locator("tr[data-action='experience.update']")
    expect(rows).to_have_count(50, timeout=10 * SECOND)
    more = ops.locator("#audit-more")
    expect(more).to_be_visible()
    more.click()
    wait_for("the second page", lambda: rows.count() >= 56, 10)
    ids = rows.evaluate_all("rs => rs.map(r => r.dataset.id)")
    assert len(ids) == len(set(ids)), "no entry twice"
    # The refresh goes on without losing the older page.
    env.server.operator("PATCH", "/api/experiences/audited", {"weight": 5})
    wait_for("the newest on top, the older page kept", lambda: rows.count() == len(ids) + 1, 10)
    expect(rows.first.locator("td.detail")).to_contain_text("weight")
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.id)")[1:] == ids
    # Every server string is text.
    assert ops.evaluate("() => window.__pwned") is None
    assert audit.locator("img, script, b").count() == 0
    ops.locator("#a-action").select_option("")
    shot(ops, "ops-audit", full_page=True)


# ---- printing: the brand and the print stations (issue 47) -----------------

# A real IPP printer, as tests/support/printer.rs makes one: CUPS's
# ippeveprinter on 127.0.0.1, keeping every document it receives in its
# spool. It will not start without DNS-SD, that is a running avahi-daemon on
# the system D-Bus: both are started once (as root, as CI runs) when they do
# not run, avahi-daemon confined to the loopback interface with publishing
# off, so nothing is announced on the network. The lock file is the one the
# Rust tests take, so a cargo test starting them at the same time waits.

PRINTER_INSTALL = "apt-get install cups-ipp-utils avahi-daemon"
DBUS_SOCKET = "/run/dbus/system_bus_socket"
PRINT_MEDIA = "na_index-4x6_4x6in"
# Both trays loaded, as the test printer starts: letter, and 4x6 in.
PAPER_LOADED = ("na_letter_8.5x11in", PRINT_MEDIA)
PRINTER_START = 20  # seconds for the daemons and a printer to answer
AVAHI_CONF = """\
[server]
use-ipv4=yes
use-ipv6=no
allow-interfaces=lo
[wide-area]
enable-wide-area=no
[publish]
disable-publishing=yes
"""


def daemon_binary(name):
    """The path of `name` (ippeveprinter, avahi-daemon, dbus-daemon); fails
    saying what to install."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    for d in dirs + ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]:
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise RuntimeError(f"the test printer needs {name}, which is not installed: {PRINTER_INSTALL} "
                       "(CUPS's ippeveprinter, with avahi-daemon and the system D-Bus it needs)")


def wait_until(what, ready, timeout=PRINTER_START):
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{what} did not start in {timeout} s")
        time.sleep(0.05)


def dbus_runs():
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(DBUS_SOCKET)
            return True
        except OSError:
            return False


def avahi_runs():
    return subprocess.run([daemon_binary("avahi-daemon"), "--check"], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


PRINTER_DAEMONS = []  # [True] once they run


def ensure_printer_daemons():
    """Starts the system D-Bus and avahi-daemon unless they run; once per
    process, under the lock file the Rust tests take too. Both are left
    running for later tests."""
    if PRINTER_DAEMONS:
        return
    for name in ("ippeveprinter", "avahi-daemon", "dbus-daemon"):
        daemon_binary(name)
    with open(os.path.join(tempfile.gettempdir(), "stagehand-test-printer.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not dbus_runs():
            os.makedirs("/run/dbus", exist_ok=True)
            try:  # a socket left by a dead daemon would stop the new one from binding
                os.unlink(DBUS_SOCKET)
            except FileNotFoundError:
                pass
            # In the foreground, in its own session, never waited for: it
            # outlives the tests (and writes no pid file to go stale).
            subprocess.Popen([daemon_binary("dbus-daemon"), "--system", "--nofork", "--nopidfile"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
            wait_until("the system D-Bus (dbus-daemon --system)", dbus_runs)
        if not avahi_runs():
            conf = os.path.join(tempfile.gettempdir(), "stagehand-test-avahi-daemon.conf")
            with open(conf, "w") as f:
                f.write(AVAHI_CONF)
            done = subprocess.run([daemon_binary("avahi-daemon"), "--daemonize", "--no-drop-root",
                                   "--no-chroot", "--file", conf], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if done.returncode != 0:
                raise RuntimeError(f"avahi-daemon --daemonize failed ({done.returncode}); is this root?")
            wait_until("avahi-daemon", avahi_runs)
    PRINTER_DAEMONS.append(True)


class TestPrinter:
    """One ippeveprinter on a free loopback port: colour, JPEG / PWG raster /
    Apple raster, letter paper in its main tray and 4x6 in its photo tray,
    each job run by `command` (/bin/true: done at once). `uri` is
    ipp://127.0.0.1:PORT/ipp/print; `documents()` what it received."""

    __test__ = False  # not a test, whatever a collector thinks of the name

    def __init__(self, name, command="/bin/true"):
        ensure_printer_daemons()
        self.name = name
        self.command = command
        self.proc = None
        self.dir = tempfile.mkdtemp(prefix="test-printer-")
        self.spool = os.path.join(self.dir, "spool")
        os.mkdir(self.spool)
        self.log_path = os.path.join(self.dir, "printer.log")
        failures = []
        # A free port can be taken before the printer binds it: then it
        # exits, and another port is tried.
        for _ in range(5):
            self.port = free_port()
            self.uri = f"ipp://127.0.0.1:{self.port}/ipp/print"
            why = self._launch()
            if why is None:
                return
            failures.append(why)
        self.close()
        raise RuntimeError(f"the test printer {name!r} did not start:\n" + "\n---\n".join(failures))

    def _launch(self):
        """Starts ippeveprinter on self.port; None once it answers IPP, else why not."""
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [daemon_binary("ippeveprinter"), "-n", "localhost", "-p", str(self.port), "-d", self.spool,
                 "-k", "-f", "image/jpeg,image/pwg-raster,image/urf", "-s", "10,10", "-c", self.command,
                 # The command's output goes nowhere rather than into the spool.
                 "-D", "file:///dev/null", self.name],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + PRINTER_START
        while True:
            if self._ipp_answers():
                return None
            if self.proc.poll() is not None:
                code, self.proc = self.proc.returncode, None
                return f"ippeveprinter exited ({code}) on port {self.port}:\n{self.log()}"
            if time.monotonic() >= deadline:
                self.stop()
                return f"ippeveprinter did not answer on port {self.port} in {PRINTER_START} s:\n{self.log()}"
            time.sleep(0.05)

    def _ipp_answers(self):
        """A Get-Printer-Attributes answered with successful-ok."""
        body = bytearray(b"\x01\x01\x00\x0b\x00\x00\x00\x01\x01")
        for tag, name, value in ((0x47, "attributes-charset", "utf-8"),
                                 (0x48, "attributes-natural-language", "en"),
                                 (0x45, "printer-uri", self.uri),
                                 (0x44, "requested-attributes", "printer-state")):
            body += bytes([tag]) + struct.pack(">H", len(name)) + name.encode()
            body += struct.pack(">H", len(value)) + value.encode()
        body.append(0x03)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("POST", "/ipp/print", bytes(body), {"Content-Type": "application/ipp"})
            answer = conn.getresponse()
            data = answer.read()
            return answer.status == 200 and len(data) >= 4 and data[2:4] == b"\x00\x00"
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def _get(self, path):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            answer = conn.getresponse()
            text = answer.read().decode("utf-8", "replace")
        finally:
            conn.close()
        assert answer.status == 200, f"GET {path} on the test printer answered {answer.status}"
        return text

    def trays(self):
        """The trays of its media page, in page order: [(n, size, type)],
        each as selected now ('' for none)."""
        page = self._get("/media")
        selected = {}
        for name, options in re.findall(r'<select name="(\w+)"[^>]*>(.*?)</select>', page, re.S):
            chosen = [text for attrs, text in re.findall(r"<option([^>]*)>([^<]*)", options)
                      if "selected" in attrs]
            selected[name] = chosen[0].strip() if chosen else ""
        trays = [(int(name[4:]), selected[name], selected.get(f"type{name[4:]}", ""))
                 for name in selected if re.fullmatch(r"size\d+", name)]
        assert trays, f"no trays on the printer's media page:\n{page}"
        return trays

    def set_media_ready(self, ready):
        """Loads the trays through the printer's own media form (as its page
        submits it): ready[0] in the main tray, ready[1] in the photo tray.
        No media (()) is out of paper: every tray keeps its size but holds
        no sheets (level 0), and the printer reports media-empty."""
        trays = self.trays()
        assert len(ready) <= len(trays), f"the printer has {len(trays)} trays, not {len(ready)}"
        query = []
        for n, (index, size, kind) in enumerate(trays):
            if ready:
                size, level = (ready[n] if n < len(ready) else ""), -2  # -2: an unknown count, no media-low
            else:
                level = 0
            query.append(urllib.parse.urlencode({f"size{index}": size, f"type{index}": kind,
                                                 f"level{index}": level}))
        assert ready or any(size for _, size, _ in trays), "no tray has a size to run out of"
        assert "<form" in self._get("/media?" + "&".join(query)), "the printer's media form did not answer"

    def documents(self):
        """The files in its spool, by job-id: what it printed."""
        def order(name):
            head = name.split("-", 1)[0]
            return (int(head) if head.isdigit() else sys.maxsize, name)
        return sorted((n for n in os.listdir(self.spool) if os.path.isfile(os.path.join(self.spool, n))),
                      key=order)

    def log(self):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self):
        """Kills it at once, as a printer switched off."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def add_printer_api(env, printer, name, experiences):
    made = env.server.ok("POST", "/api/admin/printers", {
        "name": name, "uri": printer.uri, "media": PRINT_MEDIA, "experiences": experiences},
        token=OPERATOR_TOKEN, expect_status=(201,))
    assert made.get("printer_id"), made
    return made


def remove_printers(env, uri):
    """The server forgets the printers at `uri` (the tests after this one
    need none, and /ops shows none that is switched off)."""
    status, listed, _ = env.server.api("GET", "/api/admin/printers", token=OPERATOR_TOKEN)
    for p in (listed or {}).get("printers", []) if status == 200 else []:
        if p.get("uri") == uri:
            env.server.api("DELETE", f"/api/admin/printers/{p['printer_id']}", token=OPERATOR_TOKEN)


def server_printer(env, uri):
    """The printer at `uri` as GET /api/admin/printers shows it."""
    listed = env.server.ok("GET", "/api/admin/printers", token=OPERATOR_TOKEN)
    found = [p for p in listed["printers"] if p["uri"] == uri]
    assert len(found) == 1, listed
    return found[0]


def png_rgba(width, height, pixel):
    """A PNG (8-bit RGBA, no Pillow needed) of pixel(x, y) -> (r, g, b, a)."""
    rows = b"".join(b"\x00" + bytes(c for x in range(width) for c in pixel(x, y)) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


BORDER = (230, 20, 160)  # the overlay's frame: a loud magenta the sample never has


def frame_png(side=512, border=48):
    """An overlay: an opaque BORDER-coloured frame `border` px wide around a
    transparent middle."""
    opaque, clear = (*BORDER, 255), (0, 0, 0, 0)
    return png_rgba(side, side, lambda x, y: opaque if min(x, y, side - 1 - x, side - 1 - y) < border else clear)


# Pixels of a loaded <img>, read through a canvas: {name: [r, g, b]}.
IMG_PIXELS = """(img, points) => {
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    const g = c.getContext('2d');
    g.drawImage(img, 0, 0);
    const out = {};
    for (const [name, x, y] of points) out[name] = Array.from(g.getImageData(x, y, 1, 1).data.slice(0, 3));
    return out;
}"""


def near(rgb, want, slack=40):
    return all(abs(a - b) <= slack for a, b in zip(rgb, want))


def test_ops_brand_preview(env):
    """(issue 47) An admin picks an experience in /ops's brand form, uploads
    an overlay (a PNG: a magenta frame, the middle clear) and sees the brand
    on the 1024 px sample: the frame on its edges, the sample through its
    middle."""
    env.server.operator("POST", "/api/experiences", {
        "slug": "branded", "title": "Branded booth", "kind": "comic", "locale": "en", "input": "photo"})
    # Without a brand, a preview is refused (409) rather than a bare sample.
    status, body, _ = env.server.api("POST", "/api/admin/experiences/branded/brand/preview", token=OPERATOR_TOKEN)
    assert status == 409, (status, body)

    ops = ops_sign_in(env, OPERATOR_TOKEN)
    section = ops.locator("#brand-section")
    expect(section).to_be_visible()
    # The experiences are there as soon as the admin is signed in (not
    # after the list's next slow refresh).
    expect(ops.locator("#brand-experience option[value=branded]")).to_have_count(1, timeout=5 * SECOND)
    ops.select_option("#brand-experience", "branded")
    ops.locator("#brand-form input[name=overlay]").set_input_files(
        {"name": "frame.png", "mimeType": "image/png", "buffer": frame_png()})
    with ops.expect_response(lambda r: r.url.endswith("/brand/overlay") and r.request.method == "PUT") as put, \
            ops.expect_response(lambda r: r.url.endswith("/brand/preview")) as previewed:
        section.get_by_role("button", name=EN["ops.brandUpload"]).click()
    assert put.value.status == 200, f"{put.value.status} {put.value.text()}"
    assert put.value.json() == {"width": 512, "height": 512}, put.value.json()
    assert previewed.value.status == 200 and previewed.value.headers["content-type"].startswith("image/jpeg"), \
        previewed.value.headers
    preview = ops.locator("#brand-preview")
    expect(preview).to_be_visible()
    expect(ops.locator("#brand-note")).to_have_text(EN["ops.brandPreviewShown"])
    wait_for("the brand preview to load", lambda: preview.evaluate("i => i.complete && i.naturalWidth > 0"), 10)
    assert preview.evaluate("i => [i.naturalWidth, i.naturalHeight]") == [1024, 1024]
    # Cover: the 512 px frame scaled to the 1024 px sample, 96 px wide.
    px = preview.evaluate(IMG_PIXELS, [["corner", 20, 20], ["top", 512, 40], ["right", 990, 700],
                                       ["middle", 512, 512], ["inside", 200, 200]])
    for where in ("corner", "top", "right"):
        assert near(px[where], BORDER), f"the frame's colour is not on the preview's {where}: {px}"
    for where in ("middle", "inside"):
        assert not near(px[where], BORDER, 80), f"the overlay's clear middle covers the sample ({where}): {px}"
    # The API says the overlay's size for the settings form.
    assert api_experience(env, "branded")["brand_overlay"] == {"width": 512, "height": 512}

    # Preview again (the button): a fresh image, the same brand.
    with ops.expect_response(lambda r: r.url.endswith("/brand/preview")) as again:
        ops.click("#brand-preview-button")
    assert again.value.status == 200
    wait_for("the new preview to load", lambda: preview.evaluate("i => i.complete && i.naturalWidth === 1024"), 10)
    section.scroll_into_view_if_needed()
    assert_fits(ops, "/ops with the brand preview")
    shot(ops, "ops-brand-preview")


def test_ops_printer_card_says_out_of_paper(env):
    """(issue 47) An admin adds a real printer through /ops's form; its
    card is ok; once its trays are empty the card turns held and reads out
    of paper (the server polls it; the card follows live), and ok again
    when paper is loaded."""
    printer = TestPrinter("Ops Booth")
    try:
        ops = ops_sign_in(env, OPERATOR_TOKEN)
        form = ops.locator("#new-printer")
        expect(form).to_be_visible()
        expect(form.locator("input[name=media]")).to_have_value(PRINT_MEDIA)
        form.locator("input[name=name]").fill("Booth by the door")
        form.locator("input[name=uri]").fill(printer.uri)
        form.locator("input[name=experiences]").fill("comics")
        with ops.expect_response(lambda r: r.url.endswith("/api/admin/printers") and r.request.method == "POST",
                                 timeout=30 * SECOND) as added:
            form.get_by_role("button", name=EN["ops.addPrinter"]).click()
        assert added.value.status == 201, f"{added.value.status} {added.value.text()}"
        expect(ops.locator("#printers-note")).to_have_text(EN["ops.printerAdded"])
        expect(form.locator("input[name=uri]")).to_have_value("")
        card = ops.locator("#printers li.printer", has_text="Booth by the door")
        expect(card).to_have_count(1)
        expect(card).to_have_class(re.compile(r"\bprinter-ok\b"), timeout=20 * SECOND)
        expect(card).to_contain_text(EN["ops.printerState.idle"])
        expect(card).to_contain_text(PRINT_MEDIA)
        expect(card).not_to_contain_text("out of paper")

        printer.set_media_ready(())
        # The server asks every 3 s; the card follows over the socket.
        expect(card).to_have_class(re.compile(r"\bprinter-held\b"), timeout=20 * SECOND)
        expect(card.locator(".printer-state")).to_contain_text("out of paper")
        expect(card.locator(".printer-state")).to_contain_text(EN["print.reason.out_of_paper"])
        assert "out of paper" in (server_printer(env, printer.uri)["waiting_because"] or "")
        expect(card.get_by_role("button", name=EN["ops.removePrinter"])).to_be_visible()
        card.scroll_into_view_if_needed()
        assert_fits(ops, "/ops with a held printer")
        shot(ops, "ops-printer-out-of-paper")
        # A viewer sees the same card, and no button it may not use.
        viewer = ops_sign_in(env, new_operator(env, "door watcher", "viewer")["token"])
        seen = viewer.locator("#printers li.printer", has_text="Booth by the door")
        expect(seen).to_have_class(re.compile(r"\bprinter-held\b"))
        expect(seen).to_contain_text("out of paper")
        expect(seen.locator("button")).to_have_count(0)
        expect(viewer.locator("#new-printer")).to_be_hidden()
        expect(viewer.locator("#brand-section")).to_be_hidden()

        printer.set_media_ready(PAPER_LOADED)
        expect(card).to_have_class(re.compile(r"\bprinter-ok\b"), timeout=20 * SECOND)
        expect(card).not_to_contain_text("out of paper")
        expect(card.locator(".printer-state")).to_contain_text(EN["ops.printerState.idle"])
        expect(seen).to_have_class(re.compile(r"\bprinter-ok\b"), timeout=20 * SECOND)
    finally:
        remove_printers(env, printer.uri)
        printer.close()


def print_booth(env, printer, slug, title):
    """A photo experience (English) whose prints go to `printer`."""
    env.server.operator("POST", "/api/experiences", {
        "slug": slug, "title": title, "kind": "comic", "locale": "en",
        "input": "photo", "photo_max_px": 512})
    add_printer_api(env, printer, f"{title} printer", [slug])


def photo_result_on_phone(env, slug, nickname):
    """A guest's phone takes a photo at `slug` and gets its result: the
    phone's page and its session (`id`, `token`), COMPLETED."""
    phone = env.phone()
    phone.goto(f"/p/{slug}")
    expect(phone.locator("#view-form")).to_be_visible()
    expect(phone.locator("#go")).to_be_enabled()
    expect(phone.locator("#prompt-field")).to_be_hidden()  # a photo alone
    phone.fill("#nickname", nickname)
    phone.locator("#photo-input").set_input_files(str(PHOTO))
    expect(phone.locator("#photo-preview")).to_be_visible()
    phone.click("#go")
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    mine = phone_session(phone, slug)
    assert env.server.ok("GET", f"/api/sessions/{mine['id']}", token=mine["token"])["status"] == "COMPLETED"
    return phone, mine


def test_phone_print_button_and_printing_state(env):
    """(acceptance, issue 47) A photo booth with a printer: the guest's
    result shows a Print button; pressed while the printer is out of paper,
    the print waits and the phone says why, in the guest's words; once
    paper is in it prints (one document reaches the printer), the phone
    says Printed, and the one print a guest may ask for is spent. The
    booth's display says how many prints wait and why while they do."""
    printer = TestPrinter("Phone Booth")
    try:
        print_booth(env, printer, "printbooth", "Print booth")
        assert api_experience(env, "printbooth")["prints_per_guest"] == 1
        display = open_terminal(env, env.server.terminal("printbooth", "Print booth screen"))
        expect(display.locator("#print-note")).to_be_hidden()
        phone, mine = photo_result_on_phone(env, "printbooth", "printfan")

        button = phone.locator("#print")
        status = phone.locator("#print-status")
        expect(phone.locator("#print-box")).to_be_visible()
        expect(button).to_be_visible()
        expect(button).to_be_enabled()
        expect(button).to_have_text(EN["participant.print"])
        expect(status).to_have_text("")

        # Out of paper before the press: the server knows it first.
        printer.set_media_ready(())
        wait_for("the server to see the printer out of paper",
                 lambda: "out of paper" in (server_printer(env, printer.uri)["waiting_because"] or ""), 20)
        with phone.expect_response(lambda r: r.url.endswith(f"/api/sessions/{mine['id']}/print")
                                   and r.request.method == "POST") as asked:
            button.click()
        assert asked.value.status == 202, f"{asked.value.status} {asked.value.text()}"
        assert asked.value.request.headers.get("idempotency-key"), "the print was asked without an Idempotency-Key"
        expect(status).to_have_attribute("data-status", "QUEUED")
        expect(status).to_contain_text(EN["print.status.QUEUED"])
        expect(status).to_contain_text(EN["print.reason.out_of_paper"], timeout=20 * SECOND)
        expect(button).to_be_disabled()
        assert printer.documents() == [], f"printed while out of paper: {printer.documents()}"
        assert_fits(phone, "the phone's waiting print")
        shot(phone, "phone-print-waiting", full_page=True)
        # The booth's display says it too, for everyone in line.
        note = display.locator("#print-note")
        expect(note).to_be_visible(timeout=20 * SECOND)
        expect(note).to_have_attribute("data-reason", "out_of_paper")
        expect(note).to_contain_text(EN["t.printsWaiting"].format(n=1))
        expect(note).to_contain_text(EN["print.reason.out_of_paper"])
        shot(display, "display-print-waiting")

        printer.set_media_ready(PAPER_LOADED)
        expect(status).to_have_attribute("data-status", "COMPLETED", timeout=30 * SECOND)
        expect(status).to_have_text(EN["print.status.COMPLETED"])
        expect(status).not_to_contain_text("out of paper")
        expect(display.locator("#print-note")).to_be_hidden(timeout=20 * SECOND)
        wait_for("the printer's spool to hold the document", lambda: printer.documents(), 10)
        assert len(printer.documents()) == 1, f"one print, not {printer.documents()}"
        # The one allowed print is spent: the button stays disabled, and
        # never offers "Print again" when no print is left.
        expect(button).to_be_disabled()
        expect(button).to_have_text(EN["participant.print"])
        prints = env.server.ok("GET", f"/api/sessions/{mine['id']}", token=mine["token"])["prints"]
        assert [p["status"] for p in prints] == ["COMPLETED"], prints
        shot(phone, "phone-printed", full_page=True)
        # A reload shows the same: printed, and nothing more to ask for.
        phone.reload()
        expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
        expect(status).to_have_attribute("data-status", "COMPLETED")
        expect(button).to_be_disabled()
        assert len(printer.documents()) == 1, printer.documents()
    finally:
        remove_printers(env, printer.uri)
        printer.close()


def test_share_page_prints_on_the_guests_own_device(env):
    """(acceptance) The share page of a result offers Print on the device
    that made the session (its token is there), under the experience's
    prints_per_guest: pressed, one document reaches the printer and the
    page says Printed. Opened anywhere else, the link shows no Print. The
    crew prints the finished result again from /ops's guest search."""
    printer = TestPrinter("Share Booth")
    try:
        print_booth(env, printer, "shareprint", "Share print")
        phone, mine = photo_result_on_phone(env, "shareprint", "sharefan")
        share_path = env.server.ok("GET", f"/api/sessions/{mine['id']}", token=mine["token"])["share_url"]

        # Someone else with the link: no Print.
        friend = env.phone()
        friend.goto(share_path)
        expect(friend.locator("#view-result")).to_be_visible()
        expect(friend.locator("#print-box")).to_be_hidden()

        # The guest's own phone: Print, and one document printed.
        phone.goto(share_path)
        expect(phone.locator("#view-result")).to_be_visible()
        button, status = phone.locator("#print"), phone.locator("#print-status")
        expect(phone.locator("#print-box")).to_be_visible(timeout=10 * SECOND)
        expect(button).to_be_enabled()
        expect(button).to_have_text(EN["participant.print"])
        with phone.expect_response(lambda r: r.url.endswith(f"/api/sessions/{mine['id']}/print")
                                   and r.request.method == "POST") as asked:
            button.click()
        assert asked.value.status == 202, f"{asked.value.status} {asked.value.text()}"
        assert asked.value.request.headers.get("idempotency-key"), "asked without an Idempotency-Key"
        expect(status).to_have_attribute("data-status", "COMPLETED", timeout=30 * SECOND)
        expect(status).to_have_text(EN["print.status.COMPLETED"])
        expect(button).to_be_disabled()
        wait_for("the printer's spool to hold the document", lambda: printer.documents(), 10)
        assert len(printer.documents()) == 1, f"one print, not {printer.documents()}"
        assert_fits(phone, "the share page with its print")
        shot(phone, "share-printed", full_page=True)
        expect(friend.locator("#print-box")).to_be_hidden()

        # The crew reprints the finished result from /ops (find a guest):
        # a second document, the guest's own bound untouched.
        ops = ops_page(env)
        ops.fill("#g-nickname", "sharefan")
        ops.click("#guest-find")
        row = ops.locator(f"#guests tbody tr[data-session-id='{mine['id']}']")
        expect(row).to_be_visible()
        row.locator("button.action-print").click()
        expect(ops.locator("#flash")).to_have_text(EN["ops.reprinted"])
        wait_for("the reprint at the printer", lambda: len(printer.documents()) == 2, 30)
        prints = env.server.ok("GET", f"/api/sessions/{mine['id']}", token=mine["token"])["prints"]
        assert len(prints) == 2 and prints[-1]["requested_by"].startswith("operator:"), prints
    finally:
        remove_printers(env, printer.uri)
        printer.close()


class WebhookReceiver:
    """The tests' webhook receiver (tests/support/webhook_receiver.py): it
    checks every delivery's signature with the reference library of
    Standard Webhooks and keeps what it got."""

    def __init__(self):
        script = ROOT / "tests" / "support" / "webhook_receiver.py"
        self.proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        port = int(self.proc.stdout.readline())
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/hook"

    def control(self, **settings):
        req = urllib.request.Request(f"{self.base}/control", data=json.dumps(settings).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200

    def received(self):
        with urllib.request.urlopen(f"{self.base}/received", timeout=5) as r:
            return json.loads(r.read())

    def close(self):
        self.proc.kill()
        self.proc.wait(5)


def test_ops_webhook_log(env):
    """(acceptance) An admin adds a webhook endpoint on /ops and is shown
    its secret once; a guest's result is delivered to it, signed (the
    reference library verifies it); the endpoint's log on /ops shows the
    delivery, and Redeliver sends it again with the same webhook-id."""
    receiver = WebhookReceiver()
    webhook_id = None
    try:
        ops = ops_page(env)
        section = ops.locator("#webhooks-section")
        expect(section.locator("#webhooks")).to_contain_text(EN["ops.noWebhooks"])
        ops.fill("#new-webhook input[name=url]", receiver.url)
        ops.click("#new-webhook button[type=submit]")
        expect(ops.locator("#webhook-secret-box")).to_be_visible()
        secret = ops.locator("#webhook-secret").inner_text().strip()
        assert secret.startswith("whsec_"), secret
        receiver.control(secret=secret)
        listed = env.server.operator("GET", "/api/admin/webhooks")["webhooks"]
        assert [w["url"] for w in listed] == [receiver.url], listed
        webhook_id = listed[0]["webhook_id"]
        assert "secret" not in listed[0], "the list never shows a secret"

        env.server.experience("hookbooth", "Hook booth", kind="comic", locale="en")
        session_id, _ = env.server.submit_as("hookbooth", "hooked", "a lantern in the rain")
        wait_for("the delivery", lambda: len(receiver.received()) >= 1, 30)
        first = receiver.received()[0]
        assert first["verified"], first
        assert first["body"]["data"]["session_id"] == session_id, first

        card = section.locator(f"#webhooks li[data-webhook='{webhook_id}']")
        expect(card).to_be_visible(timeout=10 * SECOND)
        card.locator("button.action-log").click()
        row = ops.locator("#webhook-log tbody tr.delivery-delivered")
        expect(row.first).to_be_visible(timeout=10 * SECOND)
        expect(row.first).to_contain_text("session.completed")
        assert_fits(ops, "the webhook log")
        shot(ops, "ops-webhook-log", full_page=True)
        row.first.locator("button.action-redeliver").click()
        expect(ops.locator("#webhooks-note")).to_have_text(EN["ops.redelivered"])
        wait_for("the delivery sent again", lambda: len(receiver.received()) >= 2, 30)
        again = receiver.received()[1]
        assert again["id"] == first["id"] and again["verified"], again
    finally:
        if webhook_id:
            env.server.ok("DELETE", f"/api/admin/webhooks/{webhook_id}", token=OPERATOR_TOKEN,
                          expect_status=(204,))
        receiver.close()


# ---- mail to the guest -----------------------------------------------------

# What the mail tests need, as .ci/run installs it.
SMTP_NEEDS = "the mail tests need aiosmtpd: python3 -m pip install -q \"aiosmtpd==1.4.6\""
MAIL_FROM = "Booth <booth@stagehand.test>"
MAIL_CONSENT = {
    "en": "Mail my picture to this address. The address is used for this mail only and deleted with my result.",
    "ko": "사진을 이 주소로 보내 주세요. 주소는 이 메일에만 쓰이며 결과와 함께 삭제됩니다.",
}
MAIL_MARKETING = {
    "en": "Also send me news of the festival (you can unsubscribe at any time).",
    "ko": "축제 소식도 받아 보겠습니다 (언제든지 수신을 거부할 수 있습니다).",
}


class SmtpServer:
    """The tests' SMTP server (tests/support/smtp_server.py): aiosmtpd on
    a loopback port, with a control port that sets how it answers
    (accept, reject with 550, ...) and lists the mails it kept, parsed by
    Python's own email package."""

    def __init__(self):
        script = ROOT / "tests" / "support" / "smtp_server.py"
        self.errors = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                     stderr=self.errors, text=True, start_new_session=True)
        ports = self.proc.stdout.readline().split()
        if len(ports) != 2:
            self.proc.kill()
            self.proc.wait(5)
            self.errors.seek(0)
            raise RuntimeError(f"the SMTP server did not start: {self.errors.read()[-2000:]}")
        smtp_port, control_port = (int(p) for p in ports)
        self.url = f"smtp://127.0.0.1:{smtp_port}"
        self.base = f"http://127.0.0.1:{control_port}"

    def _post(self, path, body=None):
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(f"{self.base}{path}", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status in (200, 204), r.status

    def control(self, mode):
        """How DATA is answered from now on: accept, reject (550), ..."""
        self._post("/control", {"mode": mode})

    def release(self):
        self._post("/release")

    def received(self, to=None):
        """The mails kept, oldest first; with `to`, those to that address."""
        with urllib.request.urlopen(f"{self.base}/received", timeout=5) as r:
            got = json.loads(r.read())
        return [m for m in got if to is None or to in (m.get("rcpt_tos") or [])]

    def attempts(self):
        with urllib.request.urlopen(f"{self.base}/attempts", timeout=5) as r:
            return json.loads(r.read())

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.errors.close()


def mail_booth(env, slug, title, **settings):
    """A prompt booth (English) whose guests may ask for mail, with the
    consent text of MAIL_CONSENT."""
    return env.server.operator("POST", "/api/experiences", {
        "slug": slug, "title": title, "kind": "image", "locale": "en", "mail_consent": MAIL_CONSENT, **settings})


def guest_address(tag):
    """A fresh address (the server bounds the mails to one address)."""
    return f"{tag}-{uuid.uuid4().hex[:8]}@example.com"


def masked(address):
    local, domain = address.split("@")
    return f"{local[0]}…@{domain}"


def mail_posts(page):
    """The page's mail requests, as they go: (url, headers, body)."""
    posts = []
    page.on("request", lambda r: posts.append((r.url, r.headers, r.post_data_json))
            if r.method == "POST" and r.url.endswith("/email") else None)
    return posts


def ask_mail(env, session_id, token, address, offer, **extra):
    """A guest's mail request through the API: (status, body)."""
    body = {"email": address, "consent": True, "marketing": False,
            "notice_version": offer["notice_version"], "locale": "en", **extra}
    status, answer, _ = env.server.api("POST", f"/api/sessions/{session_id}/email", body, token=token,
                                       key=str(uuid.uuid4()))
    return status, answer


def admin_mail(env, email_id):
    mails = env.server.operator("GET", "/api/admin/mails")["mails"]
    return next((m for m in mails if m["email_id"] == email_id), None)


# Where a value may have been kept by the page: its address, its storage.
PAGE_KEEPS = """() => [location.href, JSON.stringify(Object.assign({}, localStorage)),
    JSON.stringify(Object.assign({}, sessionStorage))].join('\\n')"""


def test_mail_on_the_phone(env):
    """(acceptance) A guest's completed result on a 360 px phone offers
    mail: the address field (type=email), the organiser's consent text as
    the label of an unticked box, the marketing opt-in apart and unticked.
    Sent without the tick, the page says consent is needed and nothing is
    asked for; ticked, one request (an Idempotency-Key) and one mail at
    the SMTP server with the result's link; the page shows it Sent, the
    address masked, and keeps the address nowhere. A header injection is
    refused (422, said next to the field) and nothing more is sent."""
    mail_booth(env, "mailbooth", "Mail booth", mail_marketing=MAIL_MARKETING)
    offer = env.server.ok("GET", "/api/experiences/mailbooth")["mail"]
    assert offer and offer["per_guest"] == 3 and offer["consent"] == MAIL_CONSENT, offer
    phone = env.phone()
    posts = mail_posts(phone)
    phone.goto("/p/mailbooth")
    # Nothing of mail before there is a result.
    expect(phone.locator("#view-form")).to_be_visible()
    expect(phone.locator("#mail-email")).to_have_count(0)
    participant_submit(phone, "mailer", "a postcard from the moon")
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    mine = phone_session(phone, "mailbooth")
    session_id, token = mine["id"], mine["token"]

    box = phone.locator("#mail-box")
    expect(box).to_be_visible()
    expect(box.locator("h3")).to_have_text(EN["mail.title"])
    email = phone.locator("#mail-email")
    for name, value in (("type", "email"), ("autocomplete", "email"), ("inputmode", "email")):
        expect(email).to_have_attribute(name, value)
    assert email.get_attribute("name") is None, "the address field has a name: a form could send it in a URL"
    consent = phone.locator("#mail-consent")
    expect(phone.locator("#mail-consent-text")).to_have_text(MAIL_CONSENT["en"])
    expect(consent).not_to_be_checked()
    assert consent.evaluate("c => c.required"), "the consent box is not required"
    marketing = phone.locator("#mail-marketing")
    expect(phone.locator("#mail-marketing-field")).to_be_visible()
    expect(phone.locator("#mail-marketing-text")).to_have_text(MAIL_MARKETING["en"])
    expect(marketing).not_to_be_checked()
    expect(phone.locator("#mail-send")).to_have_text(EN["mail.send"])
    expect(phone.locator("#mail-list")).to_be_hidden()
    # Under the result, after Print's place.
    order = phone.evaluate("""() => Boolean(document.querySelector('#result-content')
        .compareDocumentPosition(document.querySelector('#mail-box')) & Node.DOCUMENT_POSITION_FOLLOWING)""")
    assert order, "the mail box is not under the result"
    box.scroll_into_view_if_needed()
    assert_fits(phone, "the mail box at 360 px")
    shot(phone, "phone-mail")

    # Without the tick: the page says so by the box, and asks nothing.
    address = guest_address("guest")
    email.fill(address)
    phone.click("#mail-send")
    expect(phone.locator("#mail-consent-error")).to_have_text(EN["mail.error.consent_required"])
    expect(phone.locator("#mail-consent-error")).to_be_visible()
    phone.wait_for_timeout(500)
    assert posts == [], f"a mail was asked for without consent: {posts}"
    # The server holds the same line.
    status, refused = ask_mail(env, session_id, token, guest_address("sneaky"), offer, consent=False)
    assert status == 422 and refused.get("error") == "consent_required" and refused.get("field") == "consent", \
        (status, refused)

    # Ticked: one request, one mail with the result's link.
    consent.check()
    expect(phone.locator("#mail-consent-error")).to_be_hidden()
    with phone.expect_response(lambda r: r.url.endswith(f"/api/sessions/{session_id}/email")
                               and r.request.method == "POST") as asked:
        phone.click("#mail-send")
    assert asked.value.status == 202, f"{asked.value.status} {asked.value.text()}"
    answer = asked.value.json()
    assert answer.get("status") == "QUEUED" and answer.get("email_id"), answer
    assert len(posts) == 1, posts
    url, headers, body = posts[0]
    assert re.fullmatch(r"[0-9a-f-]{36}", headers.get("idempotency-key") or ""), headers
    assert body == {"email": address, "consent": True, "marketing": False,
                    "notice_version": offer["notice_version"], "locale": "en"}, body
    assert address not in url, url
    expect(phone.locator("#mail-note")).to_have_text(EN["mail.queued"])
    got = wait_for("the mail at the SMTP server", lambda: env.smtp.received(to=address), 30)
    assert len(got) == 1, got
    mail = got[0]
    share_url = env.server.ok("GET", f"/api/sessions/{session_id}", token=token)["share_url"]
    link = env.base + share_url
    assert link in (mail["text"] or ""), f"the mail's text has no {link}: {mail['text']!r}"
    assert mail["subject"] == EN["mail.subject"].replace("{event}", "Mail booth"), mail["subject"]
    assert "Bcc" not in mail["header_names"], mail["header_names"]

    item = phone.locator("#mail-list li.mail-item")
    expect(item).to_have_count(1)
    expect(item).to_have_attribute("data-status", "SENT", timeout=20 * SECOND)
    expect(item.locator(".mail-status")).to_have_text(EN["mail.status.SENT"])
    expect(item.locator(".mail-address")).to_have_text(masked(address))
    expect(phone.locator("#mail-left")).to_have_text(EN["mail.left"].format(n=2))
    expect(phone.locator("#mail-send")).to_have_text(EN["mail.sendAnother"])
    expect(email).to_have_value("")
    expect(consent).not_to_be_checked()
    assert address not in phone.evaluate(PAGE_KEEPS), "the page kept the address"
    assert address not in phone.locator("body").inner_text()
    assert_fits(phone, "the sent mail at 360 px")
    shot(phone, "phone-mail-sent", full_page=True)

    # A header injection typed in: the field drops the line break, the
    # server refuses what is left, and the page says so by the field.
    phone.evaluate("v => { document.querySelector('#mail-email').value = v; }",
                   "guest@example.com\r\nBcc: thief@example.com")
    consent.check()
    with phone.expect_response(lambda r: r.url.endswith(f"/api/sessions/{session_id}/email")
                               and r.request.method == "POST") as asked:
        phone.click("#mail-send")
    assert asked.value.status == 422, f"{asked.value.status} {asked.value.text()}"
    assert asked.value.json().get("error") == "invalid_email" and asked.value.json().get("field") == "email"
    expect(phone.locator("#mail-email-error")).to_have_text(EN["mail.error.invalid_email"])
    expect(email).to_have_attribute("aria-invalid", "true")
    # The very bytes, CR LF and all, as a script on the page could send them.
    raw = phone.evaluate("""async ([sid, token, key, email, version]) => {
        const r = await fetch(`/api/sessions/${sid}/email`, {method: 'POST', headers: {
            'Content-Type': 'application/json', 'Authorization': `Bearer ${token}`, 'Idempotency-Key': key},
            body: JSON.stringify({email, consent: true, marketing: false, notice_version: version, locale: 'en'})});
        return {status: r.status, body: await r.json()};
    }""", [session_id, token, str(uuid.uuid4()), "guest@example.com\r\nBcc: thief@example.com", offer["notice_version"]])
    assert raw["status"] == 422 and raw["body"].get("error") == "invalid_email" \
        and raw["body"].get("field") == "email", raw
    assert "\n" not in raw["body"].get("message", "") and "thief" not in raw["body"].get("message", ""), raw
    time.sleep(2)
    assert env.smtp.received(to="thief@example.com") == [], "the injected Bcc got a mail"
    assert env.smtp.received(to="guest@example.com") == [], "the refused address got a mail"
    assert len(env.smtp.received(to=address)) == 1, "the guest got a second mail"
    emails = env.server.ok("GET", f"/api/sessions/{session_id}", token=token)["emails"]
    assert [(e["status"], e["address"]) for e in emails] == [("SENT", masked(address))], emails


def test_mail_on_the_share_page(env):
    """(acceptance) The result's link page offers mail on the phone that
    made the session only (as Print): sent from there, the mail arrives
    and the page shows it Sent; with mails_per_guest 1 the box is then
    spent (and the server says 409 mail_limit). A friend's phone with the
    link sees no mail box at all."""
    mail_booth(env, "mailshare", "Mail share", mails_per_guest=1)
    phone = env.phone()
    phone.goto("/p/mailshare")
    participant_submit(phone, "sharemailer", "a lighthouse made of glass")
    expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
    mine = phone_session(phone, "mailshare")
    view = env.server.ok("GET", f"/api/sessions/{mine['id']}", token=mine["token"])
    share_path = view["share_url"]

    # The guest's own phone opens the link: the mail box, no opt-in.
    phone.goto(share_path)
    expect(phone.locator("#view-result")).to_be_visible()
    box = phone.locator("#mail-box")
    expect(box).to_be_visible(timeout=10 * SECOND)
    expect(phone.locator("#mail-consent-text")).to_have_text(MAIL_CONSENT["en"])
    expect(phone.locator("#mail-consent")).not_to_be_checked()
    expect(phone.locator("#mail-marketing-field")).to_be_hidden()
    box.scroll_into_view_if_needed()
    assert_fits(phone, "the share page's mail box at 360 px")
    shot(phone, "share-mail")
    address = guest_address("sharer")
    phone.fill("#mail-email", address)
    phone.check("#mail-consent")
    with phone.expect_response(lambda r: r.url.endswith(f"/api/sessions/{mine['id']}/email")
                               and r.request.method == "POST") as asked:
        phone.click("#mail-send")
    assert asked.value.status == 202, f"{asked.value.status} {asked.value.text()}"
    wait_for("the mail at the SMTP server", lambda: env.smtp.received(to=address), 30)
    item = phone.locator("#mail-list li.mail-item")
    expect(item).to_have_attribute("data-status", "SENT", timeout=20 * SECOND)
    expect(item.locator(".mail-address")).to_have_text(masked(address))
    # Its one mail is spent: the box says so and sends nothing more.
    expect(phone.locator("#mail-send")).to_be_disabled()
    expect(phone.locator("#mail-email")).to_be_disabled()
    expect(phone.locator("#mail-left")).to_have_text(EN["mail.limitReached"])
    offer = env.server.ok("GET", "/api/experiences/mailshare")["mail"]
    status, refused = ask_mail(env, mine["id"], mine["token"], guest_address("more"), offer)
    assert status == 409 and refused.get("error") == "mail_limit", (status, refused)
    shot(phone, "share-mail-sent", full_page=True)

    # A friend with the link: no mail box, nothing of it drawn.
    friend = env.phone()
    friend.goto(share_path)
    expect(friend.locator("#view-result")).to_be_visible()
    expect(friend.locator("#print-box")).to_be_hidden()
    expect(friend.locator("#mail-box")).to_be_hidden()
    friend.wait_for_timeout(1000)
    expect(friend.locator("#mail-box")).to_be_hidden()
    expect(friend.locator("#mail-box *")).to_have_count(0)
    expect(friend.locator("#mail-email")).to_have_count(0)


def test_ops_mail_log(env):
    """(acceptance) A mail the SMTP server refuses (550) shows FAILED on
    /ops's Mail section with the server's answer, the address masked;
    ticked, "Retry selected" sends it again and it becomes SENT (the SMTP
    server has it). A viewer reads the log without the boxes or the
    button. An admin edits the English subject on /ops, the next mail
    carries it, and Reset goes back to the built-in words."""
    mail_booth(env, "mailops", "Mail ops")
    session_id, token = env.server.submit_as("mailops", "bounced", "a kite over the sea")
    wait_completed(env, session_id, token)
    offer = env.server.ok("GET", "/api/experiences/mailops")["mail"]
    address = guest_address("bounce")
    try:
        env.smtp.control("reject")
        status, answer = ask_mail(env, session_id, token, address, offer)
        assert status == 202, (status, answer)
        email_id = answer["email_id"]
        failed = wait_for("the mail to fail", lambda: (lambda m: m if m and m["status"] == "FAILED" else None)(
            admin_mail(env, email_id)), 30)
        assert "550" in (failed["last_error"] or ""), failed
        assert address not in json.dumps(failed), failed
        env.smtp.control("accept")

        ops = ops_page(env)
        section = ops.locator("#mail-section")
        expect(section.locator("h2")).to_have_text(EN["ops.mail"])
        expect(ops.locator("#mail-unavailable")).to_be_hidden()
        row = section.locator(f"#mail-log tbody tr[data-email-id='{email_id}']")
        expect(row).to_have_attribute("data-status", "FAILED", timeout=15 * SECOND)
        expect(row.locator("td.mail-status")).to_have_text(EN["ops.mail.status.FAILED"])
        expect(row.locator("td.last-error")).to_contain_text("550")
        expect(row.locator("td.address")).to_have_text(masked(address))
        expect(row.locator("td.experience")).to_have_text("mailops")
        expect(section).not_to_contain_text(address)
        # The status filter: only failed ones.
        ops.select_option("#mail-status-filter", "FAILED")
        expect(row).to_be_visible()
        expect(section.locator("#mail-log tbody tr:not([data-status=FAILED])")).to_have_count(0)
        section.scroll_into_view_if_needed()
        assert_fits(ops, "the mail log")
        shot(ops, "ops-mail-log", full_page=True)

        retry = ops.locator("#mail-retry")
        expect(retry).to_be_visible()
        expect(retry).to_be_disabled()
        row.locator("input.mail-select").check()
        expect(retry).to_be_enabled()
        ops.select_option("#mail-status-filter", "")
        expect(row.locator("input.mail-select")).to_be_checked()
        with ops.expect_response(lambda r: r.url.endswith("/api/admin/mails/retry")) as asked:
            retry.click()
        assert asked.value.status == 202, f"{asked.value.status} {asked.value.text()}"
        assert asked.value.json().get("retried") == [email_id], asked.value.json()
        expect(ops.locator("#mail-note")).to_have_text(EN["ops.mail.retried"].format(n=1))
        expect(row).to_have_attribute("data-status", "SENT", timeout=30 * SECOND)
        expect(row.locator("td.mail-status")).to_have_text(EN["ops.mail.status.SENT"])
        got = wait_for("the retried mail at the SMTP server", lambda: env.smtp.received(to=address), 30)
        assert len(got) == 1, got
        expect(retry).to_be_disabled()

        # A viewer reads the log, and cannot retry or edit the words.
        viewer_op = new_operator(env, "Mia Mailviewer", "viewer")
        refused = []
        viewer = ops_sign_in(env, viewer_op["token"], refused)
        vrow = viewer.locator(f"#mail-log tbody tr[data-email-id='{email_id}']")
        expect(vrow).to_have_attribute("data-status", "SENT", timeout=15 * SECOND)
        expect(viewer.locator("#mail-retry")).to_be_hidden()
        expect(viewer.locator("#mail-log input")).to_have_count(0)
        expect(viewer.locator("#mail-templates-box")).to_be_hidden()
        expect(viewer.locator("#mail-templates form")).to_have_count(0)
        assert not refused, f"the viewer's page asked for what a viewer may not do: {refused}"

        # The English subject, edited on /ops: the next mail carries it.
        tpl = ops.locator("#mail-templates form.mail-template[data-locale=en]")
        expect(tpl).to_be_visible()
        subject = tpl.locator("input[name=subject]")
        body = tpl.locator("textarea[name=body]")
        expect(subject).to_have_value(EN["mail.subject"])
        expect(body).to_have_value(EN["mail.body"])
        built_in_body = body.input_value()
        # A body without the link is refused (the page says why).
        body.fill("No link here, {event}.")
        tpl.locator("button.template-save").click()
        expect(tpl.locator(".template-error")).to_have_text(EN["ops.mail.needsLink"])
        body.fill(built_in_body)
        subject.fill("Your {event} keepsake")
        with ops.expect_response(lambda r: r.url.endswith("/api/admin/mail/templates/en")
                                 and r.request.method == "PUT") as saved:
            tpl.locator("button.template-save").click()
        assert saved.value.status == 200, f"{saved.value.status} {saved.value.text()}"
        expect(tpl.locator(".template-status")).to_have_text(EN["ops.mail.saved"])
        expect(tpl.locator(".template-state")).not_to_have_text(EN["ops.mail.builtIn"])
        templates = env.server.operator("GET", "/api/admin/mail/templates")["templates"]
        en = next(t for t in templates if t["locale"] == "en")
        assert en["subject"] == "Your {event} keepsake" and en["custom"] is True, en
        second = guest_address("keepsake")
        status, answer = ask_mail(env, session_id, token, second, offer)
        assert status == 202, (status, answer)
        got = wait_for("the mail with the new subject", lambda: env.smtp.received(to=second), 30)
        assert got[0]["subject"] == "Your Mail ops keepsake", got[0]["subject"]
        assert env.base + "/r/" in (got[0]["text"] or ""), got[0]["text"]
        tpl.scroll_into_view_if_needed()
        shot(ops, "ops-mail-templates")

        # Reset: the built-in words again (after a confirm).
        dialogs = []

        def confirm(d):
            dialogs.append(d.message)
            d.accept()
        ops.once("dialog", confirm)
        with ops.expect_response(lambda r: r.url.endswith("/api/admin/mail/templates/en")
                                 and r.request.method == "DELETE") as reset:
            tpl.locator("button.template-reset").click()
        assert reset.value.status == 200, f"{reset.value.status} {reset.value.text()}"
        assert dialogs, "Reset asked nothing"
        expect(subject).to_have_value(EN["mail.subject"])
        expect(tpl.locator(".template-state")).to_have_text(EN["ops.mail.builtIn"])
        expect(tpl.locator("button.template-reset")).to_be_disabled()
        templates = env.server.operator("GET", "/api/admin/mail/templates")["templates"]
        en = next(t for t in templates if t["locale"] == "en")
        assert en["subject"] == EN["mail.subject"] and en["custom"] is False, en
    finally:
        env.smtp.control("accept")
        env.server.api("DELETE", "/api/admin/mail/templates/en", token=OPERATOR_TOKEN)


def test_mail_not_offered_without_smtp(env):
    """A server without an SMTP server offers no mail: the experience says
    "mail": null, the phone's result shows no mail box, and /ops's Mail
    section says mail is not set up."""
    server = Server()
    try:
        server.operator("POST", "/api/experiences", {
            "slug": "nomail", "title": "No mail", "kind": "image", "locale": "en"})
        assert server.ok("GET", "/api/experiences/nomail")["mail"] is None
        phone = env.page_of(server, **PHONE)
        phone.goto("/p/nomail")
        participant_submit(phone, "nomailer", "a snowman in the desert")
        expect(phone.locator("#view-result")).to_be_visible(timeout=RESULT_WAIT)
        expect(phone.locator("#mail-box")).to_be_hidden()
        expect(phone.locator("#mail-box *")).to_have_count(0)
        ops = env.page_of(server, **SCREEN)
        ops.goto("/ops")
        ops.fill("#token", OPERATOR_TOKEN)
        ops.click("#sign-in")
        expect(ops.locator("#dashboard")).to_be_visible()
        expect(ops.locator("#mail-unavailable")).to_be_visible(timeout=10 * SECOND)
        expect(ops.locator("#mail-unavailable")).to_have_text(EN["ops.mail.unavailable"])
        expect(ops.locator("#mail-empty")).to_be_visible()
    finally:
        server.stop()


def test_no_page_errors(env):
    """No page threw an uncaught JavaScript error in any of the tests."""
    assert not env.console_errors, "\n".join(env.console_errors)


TESTS = [
    test_index_lists_experiences,
    test_submission_reaches_terminal,
    test_lost_answer_is_retried_with_the_same_key,
    test_terminal_acks_what_it_showed,
    test_rejection_shows_on_both_pages,
    test_ops_dashboard_and_cancel,
    test_terminal_reconnects_and_resumes,
    test_terminal_with_a_wrong_token_says_so,
    test_korean_experience,
    test_terminal_screenshot,
    test_result_image_loads_on_the_display,
    test_layouts_fit_phone_and_1080p,
    test_ops_shows_providers_and_breaker,
    test_ai_paused_on_phone_and_display,
    test_ops_review_approves_and_rejects,
    test_hostile_text_stays_text,
    test_javascript_urls_from_the_provider_are_never_links,
    test_out_of_quota_and_a_model_shutdown_are_shown,
    test_ops_cannot_be_framed,
    test_photo_is_resized_uploaded_and_shown,
    test_photo_reload_does_not_upload_twice,
    test_photo_retake_names_the_photo_it_replaces,
    test_photo_busy_is_retried_with_the_same_key,
    test_photo_refusal_keeps_the_prompt,
    test_share_and_erase,
    test_notice_and_consent,
    test_gallery_with_a_pin,
    test_gallery_pages_and_more,
    test_display_shows_the_result_link_qr,
    test_ops_guests_data,
    test_ops_settings_edit_in_place,
    test_ops_roles_show_only_what_they_may,
    test_ops_operators_and_audit,
    test_docs_screenshots,
    test_ops_brand_preview,
    test_ops_printer_card_says_out_of_paper,
    test_phone_print_button_and_printing_state,
    test_share_page_prints_on_the_guests_own_device,
    test_ops_webhook_log,
    test_mail_on_the_phone,
    test_mail_on_the_share_page,
    test_ops_mail_log,
    test_mail_not_offered_without_smtp,
    test_no_page_errors,
]


def main(argv):
    wanted = set(argv[1:])
    tests = [t for t in TESTS if not wanted or t.__name__ in wanted]
    if not BINARY.is_file():
        print(f"no server binary at {BINARY} (cargo build --bin stagehand)", file=sys.stderr)
        return 2
    if not os.access(CHROMIUM, os.X_OK):
        print(f"no Chromium at {CHROMIUM}: {NEEDS}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("aiosmtpd") is None:
        print(f"no aiosmtpd: {SMTP_NEEDS}", file=sys.stderr)
        return 2
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):  # what is there is from this run
        old.unlink()
    passed, failed = 0, []
    # A real SMTP server for the guests' mail, shared by every test.
    smtp = SmtpServer()
    try:
        # Webhook endpoints on loopback (the tests' receiver) are allowed.
        server = Server("--ai-timeout", "7m", "--webhook-allow-private", "true",
                        "--smtp-url", smtp.url, "--mail-from", MAIL_FROM)
    except Exception:
        smtp.close()
        raise
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            env = Env(server, browser)
            env.smtp = smtp
            env.fixtures = {}
            try:
                server.experience("comics", "Comic booth", kind="comic", locale="en")
                env.fixtures["comics_terminal"] = server.terminal("comics", "booth 1")
                server.experience("game", "점수 챌린지", kind="score", locale="ko")
                env.fixtures["game_terminal"] = server.terminal("game", "부스 2")
            except AssertionError as e:
                print(f"setup failed: {e}\n{server.log_tail()}")
                return 1
            for test in tests:
                started = time.monotonic()
                try:
                    test(env)
                except Exception as e:  # noqa: BLE001 - report and go on
                    failed.append(test.__name__)
                    print(f"FAIL {test.__name__} ({time.monotonic() - started:.1f}s)")
                    traceback.print_exc(file=sys.stdout)
                    for ctx in env.contexts:
                        for i, page in enumerate(ctx.pages):
                            try:
                                shot(page, f"failed-{test.__name__}-{len(failed)}-{i}", settle=False)
                            except Exception:  # noqa: BLE001
                                pass
                    print("---- server log (tail) ----")
                    print(server.log_tail(25))
                    print("----")
                else:
                    passed += 1
                    print(f"ok   {test.__name__} ({time.monotonic() - started:.1f}s)")
                # The comics display of test 1 stays open for the tests that
                # follow it (up to the rejection test); every other page closes.
                if test is test_rejection_shows_on_both_pages:
                    env.fixtures.pop("comics_display", None)
                keep = env.fixtures.get("comics_display")
                for ctx in list(env.contexts):
                    if keep is None or ctx is not keep.context:
                        ctx.close()
                        env.contexts.remove(ctx)
            browser.close()
    finally:
        errors = server.errors()
        if errors:
            print(f"---- the server logged {len(errors)} ERROR line(s) ----")
            print("\n".join(errors[:10]))
        server.stop()
        smtp.close()
    print(f"screenshots: {SHOTS}")
    print(f"browser: {passed} passed, {len(failed)} failed")
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
