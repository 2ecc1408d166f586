// The booth display, /terminal/{id}#token=...: the newest result large, the
// live top 10, and rejections as they come. It follows the terminal socket,
// reconnects by itself with backoff, resumes after the last `seq` it showed
// (kept in localStorage) and acknowledges what it showed.
//
// A result its guest erased (or an operator erased or hid) comes as
// `session.removed`: it leaves the screen at once, from the large area, the
// feed and the ranking. After a result, the experience's display_share_qr
// (e.g. "8s") long, a QR code of its result link shows for the guest to
// keep their picture.
"use strict";

(() => {
  const terminalId = decodeURIComponent(location.pathname.split("/")[2] || "");
  const STORE_KEY = `stagehand:t:${terminalId}`;
  const FEED_MAX = 8;
  const ALERT_MS = 10000;
  const RENDER_DELAY_MS = 40;
  // The experience is read this often, for whether its AI is paused.
  const PAUSED_POLL_MS = 5000;

  // {token, seq, locale}: the token from the link (so a reload without the
  // hash still works), the last seq shown, the experience's language.
  const saved = SH.local.get(STORE_KEY) || {};
  const hashToken = new URLSearchParams(location.hash.slice(1)).get("token");
  if (hashToken) saved.token = hashToken;
  let lastSeq = Number(saved.seq) || 0;

  let ws = null;
  let attempt = 0;
  let reconnectAt = 0;
  let reconnectTimer = null;
  let countdownTimer = null;
  let helloSeen = false;
  let experience = null;

  // What is on screen; events change it, render() draws it.
  let latest = null;
  let feed = [];
  let alertEvent = null;
  let alertTimer = null;
  let ranking = null;
  let renderTimer = null;
  let ackedSeq = lastSeq;
  let aiPaused = false;
  let pausedSlug = null;
  let pausedTimer = null;
  // How long the QR code of a new result's link shows (ms; 0: never), from
  // the experience's display_share_qr; the result it shows, and until when.
  let shareQrMs = 0;
  let shareShown = null;
  let shareTimer = null;

  const $ = (id) => document.getElementById(id);
  const persist = () => SH.local.set(STORE_KEY, { ...saved, seq: lastSeq });

  // ---- connection ----------------------------------------------------------

  function setConn(state, text) {
    $("conn").dataset.state = state;
    $("conn-text").textContent = text;
  }

  function connect() {
    clearTimeout(reconnectTimer);
    clearInterval(countdownTimer);
    reconnectTimer = null;
    helloSeen = false;
    setConn("connecting", SH.t("t.conn.connecting"));
    const q = `token=${encodeURIComponent(saved.token)}&after=${lastSeq}`;
    const socket = new WebSocket(SH.wsUrl(`/ws/terminals/${encodeURIComponent(terminalId)}?${q}`));
    ws = socket;
    socket.onmessage = (m) => {
      if (ws === socket) onFrame(m.data);
    };
    socket.onclose = () => {
      if (ws !== socket) return;
      ws = null;
      scheduleReconnect();
    };
    socket.onerror = () => {
      /* onclose follows */
    };
  }

  function scheduleReconnect() {
    if (reconnectTimer) return;
    if (helloSeen) attempt = 0; // it worked until now: come back quickly
    const delay = SH.backoff(attempt, 30000);
    attempt += 1;
    reconnectAt = Date.now() + delay;
    const tick = () => {
      const s = Math.max(0, Math.ceil((reconnectAt - Date.now()) / 1000));
      // Never got in after a few tries: most likely a wrong or missing token.
      if (attempt > 3 && !helloSeen) setConn("failed", `${SH.t("t.conn.failed")} · ${SH.t("t.conn.reconnecting", { s })}`);
      else setConn("reconnecting", SH.t("t.conn.reconnecting", { s }));
    };
    tick();
    countdownTimer = setInterval(tick, 1000);
    reconnectTimer = setTimeout(connect, delay);
  }

  function reconnectNow() {
    if (ws) return;
    clearTimeout(reconnectTimer);
    reconnectTimer = null;
    connect();
  }

  // ---- frames --------------------------------------------------------------

  function onFrame(text) {
    let msg;
    try {
      msg = JSON.parse(text);
    } catch (_) {
      return;
    }
    switch (msg.type) {
      case "hello":
        onHello(msg);
        break;
      case "ranking":
        ranking = Array.isArray(msg.entries) ? msg.entries : [];
        scheduleRender();
        break;
      case "session.completed":
      case "session.rejected":
      case "session.aborted":
        onEvent(msg);
        break;
      case "session.removed":
        onRemoved(msg);
        break;
      case "print.waiting":
        showPrintWait(msg);
        break;
      default:
        break;
    }
  }

  async function onHello(msg) {
    helloSeen = true;
    attempt = 0;
    clearInterval(countdownTimer);
    setConn("live", SH.t("t.conn.live"));
    const lastOnServer = Number(msg.last_seq);
    if (Number.isFinite(lastOnServer) && lastOnServer < lastSeq) {
      // Our position is past the server's end (the terminal's events were
      // reset): resume from the server's end, or nothing new would come.
      lastSeq = lastOnServer;
      ackedSeq = lastSeq;
      persist();
      if (ws) ws.close();
      return;
    }
    if (msg.experience) {
      experience = msg.experience;
      document.title = experience.title || "stagehand";
      $("title").textContent = experience.title || "stagehand";
      if ((experience.locale || "en") !== SH.locale()) {
        saved.locale = experience.locale || "en";
        persist();
        await SH.loadLocale(saved.locale);
        if (helloSeen && ws) setConn("live", SH.t("t.conn.live"));
        delete $("latest").dataset.sessionId; // redraw in the new language
      }
      if (experience.slug) {
        const qr = `/api/experiences/${encodeURIComponent(experience.slug)}/qr.svg?terminal=${encodeURIComponent(terminalId)}`;
        if ($("qr").getAttribute("src") !== qr) $("qr").src = qr;
        $("scan").hidden = false;
        if (pausedSlug !== experience.slug) {
          pausedSlug = experience.slug;
          pollPaused();
        }
      }
    }
    scheduleRender();
  }

  function onEvent(ev) {
    const seq = Number(ev.seq);
    if (Number.isFinite(seq)) {
      if (seq <= lastSeq) return; // seen already
      lastSeq = seq;
    }
    if (ev.type === "session.completed") {
      latest = ev;
      showShare(ev);
    } else {
      alertEvent = ev;
      clearTimeout(alertTimer);
      alertTimer = setTimeout(() => {
        alertEvent = null;
        scheduleRender();
      }, ALERT_MS);
    }
    feed.unshift(ev);
    if (feed.length > FEED_MAX) feed.length = FEED_MAX;
    scheduleRender();
  }

  // A session's data is gone: nothing of it stays on the screen. The large
  // area falls back to the newest result still shown in the feed.
  function onRemoved(ev) {
    const seq = Number(ev.seq);
    if (Number.isFinite(seq)) {
      if (seq <= lastSeq) return;
      lastSeq = seq;
    }
    const id = ev.session_id;
    if (id) {
      feed = feed.filter((f) => f.session_id !== id);
      if (latest && latest.session_id === id) {
        latest = feed.find((f) => f.type === "session.completed") || null;
        delete $("latest").dataset.sessionId;
        if (!latest) {
          $("latest-content").replaceChildren();
          $("latest-nickname").textContent = "";
        }
      }
      if (alertEvent && alertEvent.session_id === id) {
        alertEvent = null;
        clearTimeout(alertTimer);
      }
      if (ranking) ranking = ranking.filter((e) => e.session_id !== id);
      if (shareShown === id) hideShare();
    }
    // At once: the removal is drawn now, not with the next burst.
    clearTimeout(renderTimer);
    render();
  }

  // ---- the result link's QR code -------------------------------------------

  function showShare(ev) {
    const path = typeof ev.share_url === "string" && /^\/r\/[0-9A-Za-z_-]+$/.test(ev.share_url) ? ev.share_url : null;
    if (!path || !(shareQrMs > 0)) {
      hideShare();
      return;
    }
    const qr = `${path}/qr.svg`;
    if ($("share-qr").getAttribute("src") !== qr) $("share-qr").src = qr;
    shareShown = ev.session_id;
    $("share").dataset.sessionId = ev.session_id || "";
    $("share").hidden = false;
    clearTimeout(shareTimer);
    shareTimer = setTimeout(hideShare, shareQrMs);
  }

  function hideShare() {
    clearTimeout(shareTimer);
    shareTimer = null;
    shareShown = null;
    $("share").hidden = true;
    delete $("share").dataset.sessionId;
    $("share-qr").removeAttribute("src");
  }

  // A backlog arrives as a burst of frames: draw once for the burst, then
  // keep the position and acknowledge everything drawn.
  function scheduleRender() {
    if (!renderTimer) renderTimer = setTimeout(render, RENDER_DELAY_MS);
  }

  function render() {
    clearTimeout(renderTimer);
    renderTimer = null;
    renderLatest();
    renderPaused();
    renderAlert();
    renderRanking();
    renderFeed();
    if (lastSeq !== ackedSeq) {
      persist();
      if (ws && ws.readyState === WebSocket.OPEN) {
        ws.send(JSON.stringify({ type: "ack", seq: lastSeq }));
        ackedSeq = lastSeq;
      }
    }
  }

  const eventScore = (ev) => (ev.score != null ? ev.score : ev.result && ev.result.score);
  const eventRank = (ev) => (ev.rank != null ? ev.rank : ev.result && ev.result.rank);
  const eventMessage = (ev) => ev.message || SH.t(`abort.${ev.reason}`);

  function renderLatest() {
    $("empty").hidden = Boolean(latest) || !$("no-token").hidden;
    $("latest").hidden = !latest;
    if (!latest || $("latest").dataset.sessionId === latest.session_id) return;
    $("latest").dataset.sessionId = latest.session_id;
    $("latest").dataset.seq = latest.seq;
    $("latest-nickname").textContent = latest.nickname || "";
    const content = (latest.result && latest.result.content) || [];
    $("latest-content").replaceChildren(...SH.renderContent(content, { display: true }));
    const score = eventScore(latest);
    const rank = eventRank(latest);
    $("latest-score").hidden = score == null;
    $("latest-score").textContent = score == null ? "" : SH.t("t.score", { score: SH.fmtNumber(score) });
    $("latest-rank").hidden = rank == null;
    $("latest-rank").textContent = rank == null ? "" : SH.t("t.rank", { rank });
    // Replay the entrance animation.
    $("latest").classList.remove("enter");
    void $("latest").offsetWidth;
    $("latest").classList.add("enter");
  }

  // ---- prints waiting -------------------------------------------------------

  // The experience's prints wait for a printer that holds its queue (out of
  // paper, jammed, off): how many, and why, in the display's language,
  // until a frame says none waits (`waiting` 0).
  function showPrintWait(msg) {
    const waiting = Number(msg.waiting) || 0;
    const note = $("print-note");
    note.hidden = waiting === 0 || !msg.reason;
    if (note.hidden) {
      note.textContent = "";
      delete note.dataset.reason;
      return;
    }
    note.dataset.reason = msg.reason;
    note.textContent = `${SH.t("t.printsWaiting", { n: waiting })} · ${SH.t(`print.reason.${msg.reason}`)}`;
  }

  // ---- the AI paused --------------------------------------------------------

  // Reads the experience every few seconds: while its provider's breaker is
  // open, a calm banner says the AI is taking a break. A failed read keeps
  // what is shown (the socket's state already says when the server is gone).
  async function pollPaused() {
    clearTimeout(pausedTimer);
    const slug = pausedSlug;
    if (!slug) return;
    try {
      const { data } = await SH.api(`/api/experiences/${encodeURIComponent(slug)}`, { timeoutMs: 8000 });
      if (slug !== pausedSlug) return;
      const qrMs = SH.parseDuration(data && data.display_share_qr);
      shareQrMs = qrMs && qrMs > 0 ? qrMs : 0;
      if (!shareQrMs && shareShown) hideShare();
      const now = Boolean(data && data.ai_paused === true);
      if (now !== aiPaused) {
        aiPaused = now;
        scheduleRender();
      }
    } catch (_) {
      /* keep the banner as it is; try again later */
    }
    if (slug === pausedSlug) pausedTimer = setTimeout(pollPaused, PAUSED_POLL_MS);
  }

  function renderPaused() {
    $("paused").hidden = !aiPaused;
    if (aiPaused) $("paused").textContent = SH.t("terminal.ai_paused");
  }

  function renderAlert() {
    $("alert").hidden = !alertEvent;
    if (!alertEvent) return;
    $("alert").dataset.type = alertEvent.type;
    $("alert-who").textContent = alertEvent.nickname || "";
    $("alert-message").textContent = eventMessage(alertEvent);
  }

  function renderRanking() {
    if (!ranking) return;
    $("ranking-empty").hidden = ranking.length > 0;
    const highlight = latest && latest.session_id;
    $("ranking").replaceChildren(
      ...ranking.slice(0, 10).map((e) =>
        SH.el("li", { class: e.session_id === highlight ? "me" : null },
          SH.el("span", { class: "r-rank", text: e.rank }),
          SH.el("span", { class: "r-name", text: e.nickname }),
          SH.el("span", { class: "r-score", text: SH.fmtNumber(e.score) }))));
  }

  function renderFeed() {
    $("feed").replaceChildren(
      ...feed.map((ev) => {
        const type = ev.type.replace("session.", "");
        let detail;
        if (type === "completed") {
          const score = eventScore(ev);
          const rank = eventRank(ev);
          detail = [score != null ? SH.t("t.score", { score: SH.fmtNumber(score) }) : SH.t("t.completed"),
            rank != null ? SH.t("t.rank", { rank }) : null].filter(Boolean).join(" · ");
        } else {
          detail = eventMessage(ev);
        }
        return SH.el("li", { class: `feed-${type}`, dataset: { seq: ev.seq, sessionId: ev.session_id || "" } },
          SH.el("span", { class: "f-name", text: ev.nickname || "" }),
          SH.el("span", { class: "f-detail", text: detail }));
      }));
  }

  // ---- start ---------------------------------------------------------------

  async function init() {
    await SH.loadLocale(saved.locale || "en");
    persist();
    if (!terminalId || !saved.token) {
      $("no-token").hidden = false;
      $("empty").hidden = true;
      setConn("failed", SH.t("t.conn.failed"));
      return;
    }
    window.addEventListener("online", reconnectNow);
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) reconnectNow();
    });
    connect();
  }

  init();
})();
