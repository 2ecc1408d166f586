// The operator dashboard, /ops: live counts from the operator socket, the
// review queue (results waiting for approval before the public screen:
// big previews, a / r / j / k keys, approve all), the sagas table with
// search, Retry and Cancel and "retry all AI failed of the last hour", QR
// codes of the terminals, and forms to create experiences and terminals. The operator token is asked once and
// kept in sessionStorage (this tab only).
//
// The guests' data: under each experience, what is held (photos, results,
// the next purge) and an Export button (a ZIP of every kept result, fetched
// with the token and saved); "Find a guest" searches sessions by nickname,
// with Hide / Unhide (the gallery) and Erase (on a guest's request).
//
// Operators and roles: the header says who is signed in (GET
// /api/admin/me); what the role may not do is not shown at all (a viewer
// reads, a moderator also approves, rejects, hides and unhides, an admin
// does everything). An admin edits each experience's live settings in
// place (PATCH, only the changed fields, a confirm before what stops
// people), creates and revokes operators (a new token is shown once) and
// reads the audit log (refreshed every 2 s, filtered by operator and
// action). A revoked token (401, or the socket's 4401) returns to the
// sign-in form and says so.
"use strict";

(() => {
  const TOKEN_KEY = "stagehand:ops:token";
  const STEPS = ["AI_PENDING", "AI_DONE", "IN_REVIEW", "RANKING_DONE", "COMPLETED", "ABORTED"];
  const FINAL = ["COMPLETED", "ABORTED"];
  const REASONS = ["INPUT_REJECTED", "AI_FAILED", "AI_TIMEOUT", "RANKING_FAILED", "PERSIST_FAILED", "ORPHANED", "CANCELLED", "REVIEW_REJECTED", "INPUT_MISSING"];
  const SAGA_PAGE = 50;
  // The providers section (slots, queues, breakers) is read this often.
  const PROVIDERS_MS = 2000;
  // How long the Pause button keeps a provider's breaker open (seconds);
  // Resume closes it at any time.
  const PAUSE_CHOICES = [30, 300, 1800, 3600];
  // The sagas table follows the live figures: reloaded when the socket
  // reports a change, at most once per this period (and once more at its
  // end, so the last change always shows).
  const AUTO_REFRESH_MS = 1000;

  let token = SH.session.get(TOKEN_KEY);
  let experiences = [];
  let terminals = [];
  let ws = null;
  let wsAttempt = 0;
  let wsTimer = null;
  let wsCountdown = null;
  let wsHeard = false;
  let sagas = [];
  let sagasCursor = null;
  let sagasPaged = false;
  let sagasLoading = false;
  let sagasAgain = false;
  let sagasLoadedAt = 0;
  let sagasShown = "";
  let refreshTimer = null;
  let followTimer = null;
  let lastRecent = "";
  let providersTimer = null;
  let providersLoading = false;
  let providerNames = [];
  // The card of each provider, by name, updated in place so that a button
  // is never replaced under the pointer.
  const providerCards = new Map();
  let flashTimer = null;
  // The review queue as the socket tells it: saga id -> item, and the
  // selected item's saga id (the keys act on it).
  const reviewItems = new Map();
  let reviewSelected = null;
  let reviewOldest = null;
  let reviewWaiting = 0;
  let reviewTimer = null;
  // The filter of the armed "retry all AI failed" button (its dry run's).
  let retryFailedArmed = null;
  let qTimer = null;
  // What each experience holds is read this often (and after an erase).
  const HELD_MS = 30000;
  let heldTimer = null;

  // Who is signed in ({operator_id, name, role}) and what each role may do.
  const ME_KEY = "stagehand:ops:me";
  const ROLES = ["viewer", "moderator", "admin"];
  let me = null;
  let meTimer = null;
  let meAttempt = 0;
  // The experiences' editors, by slug, kept across redraws of the list.
  const editors = new Map();
  // AI jobs running now per experience (the socket's stats and the
  // providers' list), for the confirm before lowering max_in_flight.
  const running = new Map();
  // Operators (admin).
  let operators = [];
  // The audit log (admin): newest first, the first page read every 2 s.
  const AUDIT_MS = 2000;
  const AUDIT_PAGE = 50;
  const AUDIT_ACTIONS = [
    "experience.create", "experience.update", "terminal.create", "saga.approve", "saga.reject", "saga.cancel",
    "saga.retry", "sagas.bulk", "session.hide", "session.unhide", "session.erase", "breaker.open", "breaker.close",
    "operator.create", "operator.revoke", "experience.export",
  ];
  let auditItems = [];
  let auditNext = null;
  let auditPaged = false;
  let auditGen = 0;
  let auditLoop = 0;
  let auditTimer = null;
  let auditChain = Promise.resolve();
  let auditShown = "";

  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;

  // ---- requests ------------------------------------------------------------

  // An operator request; a 401 signs out (the token was revoked, or the
  // server no longer takes it).
  async function call(path, opts = {}) {
    const used = token;
    try {
      return await SH.api(path, { ...opts, token: used });
    } catch (err) {
      if (err instanceof SH.ApiError && err.status === 401 && used && used === token) signOut(SH.t("ops.tokenRevoked"));
      throw err;
    }
  }

  // A request that changes something, with an Idempotency-Key: sent again
  // with the same key when no answer came (or the server was busy).
  async function send(method, path, body, key) {
    for (let attempt = 0; ; attempt++) {
      try {
        return await call(path, { method, body, key });
      } catch (err) {
        if (!SH.retryable(err) || attempt >= 4 || !token) throw err;
        await SH.sleep(SH.backoff(attempt, 5000));
      }
    }
  }

  // A fresh Idempotency-Key (crypto.randomUUID where the page is a secure
  // context; the shared helper elsewhere).
  function newKey() {
    return typeof crypto !== "undefined" && crypto.randomUUID ? crypto.randomUUID() : SH.uuid();
  }

  // A POST that creates or changes something: one Idempotency-Key per
  // intent, sent again as it was when no answer came.
  async function post(path, body, key) {
    for (let attempt = 0; ; attempt++) {
      try {
        return await call(path, { method: "POST", body, key });
      } catch (err) {
        if (!SH.retryable(err) || attempt >= 4) throw err;
        await SH.sleep(SH.backoff(attempt, 5000));
      }
    }
  }

  function flash(text, isError) {
    const n = $("flash");
    n.textContent = text;
    n.classList.toggle("error", Boolean(isError));
    n.hidden = false;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => {
      n.hidden = true;
    }, 6000);
  }

  // ---- signing in ----------------------------------------------------------

  function showLogin(error) {
    $("dashboard").hidden = true;
    $("sign-out").hidden = true;
    $("conn").hidden = true;
    $("whoami").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = error || "";
    $("login-error").hidden = !error;
    $("token").value = "";
    $("token").focus();
  }

  function signOut(error) {
    token = null;
    me = null;
    SH.session.set(TOKEN_KEY, null);
    SH.session.set(ME_KEY, null);
    closeSocket();
    clearInterval(refreshTimer);
    clearInterval(providersTimer);
    providersTimer = null;
    clearInterval(heldTimer);
    heldTimer = null;
    clearTimeout(meTimer);
    meTimer = null;
    stopAudit();
    forgetSignedIn();
    showLogin(error);
  }

  // What the last operator saw goes with them: the next one (perhaps of
  // another role) starts from a clean page.
  function forgetSignedIn() {
    delete document.body.dataset.role;
    experiences = [];
    running.clear();
    editors.clear();
    $("experience-list").replaceChildren();
    $("guests").tBodies[0].replaceChildren();
    $("guests").hidden = true;
    guestsNote("");
    $("sagas").tBodies[0].replaceChildren();
    sagasShown = "";
    reviewItems.clear();
    $("review-queue").replaceChildren();
    for (const card of providerCards.values()) card.root.remove();
    providerCards.clear();
    operators = [];
    $("operators").tBodies[0].replaceChildren();
    closeOperatorResult();
    closeTerminalResult();
    auditItems = [];
    auditNext = null;
    auditPaged = false;
    auditShown = "";
    $("audit").tBodies[0].replaceChildren();
    $("audit-more").hidden = true;
  }

  // Who the token is: {ok: true, me} when the server takes it, {ok:
  // false} on a 401; anything else (no answer, a server without
  // /api/admin/me) lets the dashboard start, {ok: true, me: null}.
  async function whoIs(candidate) {
    try {
      const { data } = await SH.api("/api/admin/me", { token: candidate });
      return { ok: true, me: data && ROLES.includes(data.role) ? data : null };
    } catch (err) {
      if (err instanceof SH.ApiError && err.status === 401) return { ok: false };
      return { ok: true, me: null };
    }
  }

  async function onLogin(ev) {
    ev.preventDefault();
    const candidate = $("token").value.trim();
    if (!candidate) return;
    $("sign-in").disabled = true;
    const who = await whoIs(candidate);
    $("sign-in").disabled = false;
    if (!who.ok) {
      showLogin(SH.t("ops.tokenWrong"));
      return;
    }
    token = candidate;
    SH.session.set(TOKEN_KEY, token);
    setMe(who.me);
    start();
  }

  // ---- roles -----------------------------------------------------------------

  // `me` as the server said it; unknown (no answer yet): the last one this
  // tab knew, else asked again shortly, the page meanwhile a viewer's.
  function setMe(who) {
    clearTimeout(meTimer);
    meTimer = null;
    if (who) {
      me = who;
      meAttempt = 0;
      SH.session.set(ME_KEY, who);
      return;
    }
    const kept = SH.session.get(ME_KEY);
    me = kept && ROLES.includes(kept.role) ? kept : null;
    meTimer = setTimeout(askMeAgain, 2000 + SH.backoff(meAttempt, 60000));
    meAttempt += 1;
  }

  async function askMeAgain() {
    meTimer = null;
    if (!token) return;
    const used = token;
    const who = await whoIs(used);
    if (used !== token) return;
    if (!who.ok) {
      signOut(SH.t("ops.tokenRevoked"));
      return;
    }
    const before = role();
    setMe(who.me);
    if (role() !== before || who.me) {
      applyRole();
      redrawForRole();
    }
  }

  function role() {
    return me && ROLES.includes(me.role) ? me.role : "viewer";
  }

  // True when the signed-in role may do what needs `need` (a role name).
  function may(need) {
    return ROLES.indexOf(role()) >= ROLES.indexOf(need);
  }

  // The header's "name (role)", and what the role may not use hidden.
  function applyRole() {
    document.body.dataset.role = role();
    const who = $("whoami");
    who.textContent = me ? SH.t("ops.whoami", { name: me.name || "?", role: SH.t(`ops.role.${role()}`) }) : "";
    who.title = me && me.operator_id ? me.operator_id : "";
    who.hidden = !me;
    document.querySelectorAll("[data-needs]").forEach((n) => {
      n.hidden = !may(n.dataset.needs);
    });
  }

  // The parts drawn with buttons, drawn again for a role that changed.
  function redrawForRole() {
    sagasShown = "";
    renderSagas();
    renderReview();
    renderExperienceList();
    loadAllHeld();
    for (const card of providerCards.values()) {
      if (card.root.dataset.breaker) showBreaker(card, card.root.dataset.breaker);
    }
    if (may("admin")) {
      loadOperators();
      startAudit();
    } else {
      stopAudit();
    }
  }

  // ---- the live socket -----------------------------------------------------

  function setConn(state, text) {
    $("conn").hidden = false;
    $("conn").dataset.state = state;
    $("conn-text").textContent = text;
  }

  function closeSocket() {
    clearTimeout(wsTimer);
    clearInterval(wsCountdown);
    wsTimer = null;
    if (ws) {
      const s = ws;
      ws = null;
      s.close();
    }
  }

  function connect() {
    if (!token) return;
    clearTimeout(wsTimer);
    clearInterval(wsCountdown);
    wsTimer = null;
    wsHeard = false;
    setConn("connecting", SH.t("ops.conn.connecting"));
    const socket = new WebSocket(SH.wsUrl(`/ws/operators?token=${enc(token)}`));
    ws = socket;
    // A new socket announces every waiting item again.
    reviewItems.clear();
    renderReview();
    socket.onmessage = (m) => {
      if (ws !== socket) return;
      let msg;
      try {
        msg = JSON.parse(m.data);
      } catch (_) {
        return;
      }
      if (!wsHeard) {
        wsHeard = true;
        wsAttempt = 0;
        setConn("live", SH.t("ops.conn.live"));
      }
      if (msg.type === "stats") onStats(msg);
      else if (msg.type === "review.added") onReviewAdded(msg.item);
      else if (msg.type === "review.removed") onReviewRemoved(msg.saga_id);
      // The print stations' panel (ops-print.js) follows its own frame.
      else if (msg.type === "print.printers") window.dispatchEvent(new CustomEvent("stagehand:printers", { detail: msg }));
    };
    socket.onclose = (ev) => {
      if (ws !== socket) return;
      ws = null;
      if (ev.code === 4401) {
        // The token was revoked (on this instance or another).
        signOut(SH.t("ops.tokenRevoked"));
        return;
      }
      reconnectLater();
    };
  }

  async function reconnectLater() {
    if (wsHeard) wsAttempt = 0;
    const delay = SH.backoff(wsAttempt, 30000);
    wsAttempt += 1;
    if (wsAttempt === 3 && token && !(await whoIs(token)).ok) {
      signOut(SH.t("ops.tokenRevoked"));
      return;
    }
    if (!token) return;
    const at = Date.now() + delay;
    const tick = () =>
      setConn("reconnecting", SH.t("ops.conn.reconnecting", { s: Math.max(0, Math.ceil((at - Date.now()) / 1000)) }));
    tick();
    wsCountdown = setInterval(tick, 1000);
    wsTimer = setTimeout(connect, delay);
  }

  // ---- live figures --------------------------------------------------------

  function onStats(s) {
    for (const e of s.experiences || []) {
      if (e && e.slug) running.set(e.slug, Number(e.in_flight) || 0);
    }
    renderSteps(s.steps || {}, s.queue_depth);
    if (s.review) {
      reviewWaiting = Number(s.review.waiting) || 0;
      reviewOldest = s.review.oldest_waiting_since ? Date.parse(s.review.oldest_waiting_since) : null;
      renderReviewHead();
    }
    renderCapacity(s.experiences || []);
    renderReasons(s.aborted_by_reason || {});
    if (Array.isArray(s.terminals)) {
      terminals = s.terminals;
      renderTerminals();
    }
    renderRecent(s.recent || []);
    // The table follows the live figures when a saga changed.
    const recent = JSON.stringify((s.recent || []).map((r) => [r.saga_id, r.step, r.updated_at, r.stuck]));
    if (recent !== lastRecent) {
      lastRecent = recent;
      followSagas();
    }
  }

  function followSagas() {
    if (sagasPaged || followTimer) return;
    const wait = Math.max(0, sagasLoadedAt + AUTO_REFRESH_MS - Date.now());
    followTimer = setTimeout(() => {
      followTimer = null;
      if (token && !sagasPaged) loadSagas();
    }, wait);
  }

  function tile(id, label, value, extraClass) {
    return SH.el("div", { class: `tile ${extraClass || ""}`, id },
      SH.el("span", { class: "value", text: value == null ? "–" : SH.fmtNumber(value) }),
      SH.el("span", { class: "label", text: label }));
  }

  function renderSteps(steps, queueDepth) {
    $("steps").replaceChildren(
      ...STEPS.map((step) => tile(`step-${step}`, SH.t(`step.${step}`), steps[step] || 0, `step-${step}`)),
      tile("queue-depth", SH.t("ops.queueDepth"), queueDepth, "queue"));
  }

  function renderCapacity(list) {
    if (!list.length) {
      $("capacity").replaceChildren(SH.el("li", { class: "muted", text: SH.t("ops.noExperiences") }));
      return;
    }
    $("capacity").replaceChildren(
      ...list.map((e) => {
        const max = Number(e.max_in_flight) || 0;
        const n = Number(e.in_flight) || 0;
        const pct = max ? Math.min(100, Math.round((100 * n) / max)) : 0;
        return SH.el("li", { dataset: { slug: e.slug } },
          SH.el("div", { class: "cap-head" },
            SH.el("strong", { text: e.title || e.slug }),
            SH.el("span", { class: "muted", text: ` ${e.slug}` })),
          SH.el("div", { class: `bar${n >= max && max ? " full" : ""}` },
            SH.el("span", { style: { width: `${pct}%` } })),
          SH.el("div", { class: "cap-text" },
            SH.el("span", { class: "in-flight", text: SH.t("ops.inFlight", { n, max }) }),
            SH.el("span", { class: "queued", text: SH.t("ops.queued", { n: e.queued || 0 }) })),
          galleryAlarm(e));
      }));
  }

  // A PIN gallery someone is guessing (locked until its lock ends), or
  // whose PIN is too short to open it any more: what to do about it.
  function galleryAlarm(e) {
    if (e.gallery_locked_until) {
      return SH.el("p", { class: "gallery-alarm error small", role: "status",
        text: SH.t("ops.galleryLocked", { time: SH.fmtTime(e.gallery_locked_until) }) });
    }
    if (e.gallery_pin_outdated) {
      return SH.el("p", { class: "gallery-alarm error small", role: "status", text: SH.t("ops.galleryPinOutdated") });
    }
    return null;
  }

  function renderReasons(counts) {
    const names = [...REASONS, ...Object.keys(counts).filter((r) => !REASONS.includes(r))];
    $("reasons").replaceChildren(
      ...names.map((r) =>
        SH.el("li", { id: `reason-${r}`, class: counts[r] ? "some" : "none" },
          SH.el("span", { text: SH.t(`reason.${r}`) }),
          SH.el("span", { class: "count", text: SH.fmtNumber(counts[r] || 0) }))));
  }

  function renderRecent(list) {
    if (!list.length) {
      $("recent").replaceChildren(SH.el("li", { class: "muted", text: SH.t("ops.noRecent") }));
      return;
    }
    $("recent").replaceChildren(
      ...list.slice(0, 12).map((r) =>
        SH.el("li", { dataset: { sagaId: r.saga_id } },
          SH.el("span", { class: "muted time", text: SH.fmtTime(r.updated_at) }),
          SH.el("span", { class: "who", text: `${r.nickname || "?"} · ${r.experience || ""}` }),
          r.forgotten
            ? SH.el("span", { class: "step-badge step-forgotten", text: SH.t(`forgotten.${r.forgotten}`) })
            : SH.el("span", { class: `step-badge step-${r.step}`, text: r.abort_reason ? SH.t(`reason.${r.abort_reason}`) : SH.t(`step.${r.step}`) }))));
  }

  function qrUrl(t) {
    return `/api/experiences/${enc(t.experience)}/qr.svg?terminal=${enc(t.terminal_id)}`;
  }

  function participantUrl(slug, terminalId) {
    return `${location.origin}/p/${enc(slug)}${terminalId ? `?terminal=${enc(terminalId)}` : ""}`;
  }

  function renderTerminals() {
    if (!terminals.length) {
      $("terminals").replaceChildren(SH.el("li", { class: "muted", text: SH.t("ops.noTerminals") }));
      return;
    }
    $("terminals").replaceChildren(
      ...terminals.map((t) => {
        const unacked = Number(t.unacked) || 0;
        return SH.el("li", { class: `terminal-card ${t.online ? "online" : "offline"}`, dataset: { terminalId: t.terminal_id } },
          SH.el("a", { href: qrUrl(t), target: "_blank", rel: "noopener", class: "qr-link" },
            SH.el("img", { class: "qr", src: qrUrl(t), alt: SH.t("ops.qrAlt", { name: t.name }), loading: "lazy" })),
          SH.el("div", { class: "terminal-info" },
            SH.el("strong", { text: t.name }),
            SH.el("span", { class: "muted", text: t.experience }),
            SH.el("span", { class: "presence" },
              SH.el("span", { class: "dot", "aria-hidden": "true" }),
              t.online ? SH.t("ops.online") : SH.t("ops.offline"),
              t.online && t.connected_since ? ` · ${SH.t("ops.since", { time: SH.fmtTime(t.connected_since) })}` : ""),
            SH.el("span", { class: `unacked${unacked ? " warn" : ""}`, text: SH.t("ops.unacked", { n: unacked }) }),
            SH.el("span", { class: "muted small", text: SH.t("ops.seq", { acked: t.acked_seq ?? 0, last: t.last_seq ?? 0 }) }),
            SH.el("a", { class: "small", href: participantUrl(t.experience, t.terminal_id), target: "_blank", rel: "noopener", text: SH.t("ops.participantLink") })));
      }));
  }

  // Before the socket speaks (or when it cannot), the terminals come from
  // the HTTP list.
  async function loadTerminals() {
    let all;
    try {
      const { data } = await call("/api/terminals");
      all = (data && data.terminals) || [];
    } catch (_) {
      return;
    }
    if (!wsHeard) {
      terminals = all;
      renderTerminals();
    }
  }

  // ---- AI providers --------------------------------------------------------

  async function loadProviders() {
    if (!token || providersLoading) return;
    providersLoading = true;
    try {
      const { data } = await call("/api/admin/providers");
      const list = (data && data.providers) || [];
      $("providers-note").hidden = true;
      renderProviders(list);
    } catch (err) {
      if (err instanceof SH.ApiError && err.status === 404) {
        // A server without providers: no section.
        $("providers-section").hidden = true;
        clearInterval(providersTimer);
        providersTimer = null;
        return;
      }
      // What was shown stays; a note says it is not current.
      $("providers-note").textContent = SH.errorText(err);
      $("providers-note").hidden = false;
    } finally {
      providersLoading = false;
    }
  }

  function renderProviders(list) {
    $("providers-section").hidden = false;
    for (const p of list) {
      for (const e of p.experiences || []) {
        if (e && e.slug) running.set(e.slug, Number(e.in_flight) || 0);
      }
    }
    const names = list.map((p) => p.name);
    if (names.join("\n") !== providerNames.join("\n")) {
      providerNames = names;
      fillProviderSelect();
      for (const ed of editors.values()) fillEditorProviders(ed);
    }
    for (const name of [...providerCards.keys()]) {
      if (!names.includes(name)) {
        providerCards.get(name).root.remove();
        providerCards.delete(name);
      }
    }
    if (!list.length) {
      $("providers").replaceChildren(SH.el("li", { class: "muted", text: SH.t("ops.noProviders") }));
      return;
    }
    const cards = list.map((p) => {
      let card = providerCards.get(p.name);
      if (!card) {
        card = providerCard(p.name);
        providerCards.set(p.name, card);
      }
      updateProviderCard(card, p);
      return card.root;
    });
    // Keep the order of the list; moving a node keeps its state.
    const ul = $("providers");
    if ([...ul.children].some((n, i) => n !== cards[i]) || ul.children.length !== cards.length) {
      ul.replaceChildren(...cards);
    }
  }

  function providerCard(name) {
    const c = {};
    c.name = SH.el("strong", { class: "provider-name", text: name });
    c.kind = SH.el("span", { class: "badge" });
    c.breaker = SH.el("span", { class: "breaker-badge" });
    c.inFlight = SH.el("span", { class: "value" });
    c.cap = SH.el("span", { class: "label" });
    c.queued = SH.el("span", { class: "value" });
    c.rate = SH.el("span", { class: "value rate" });
    c.bar = SH.el("span");
    c.barBox = SH.el("div", { class: "bar" }, c.bar);
    c.pauseFor = SH.el("select", { class: "pause-for", "aria-label": SH.t("ops.breaker.for") },
      ...PAUSE_CHOICES.map((sec) => SH.el("option", { value: sec, text: durationText(sec) })));
    c.pauseFor.value = "300";
    c.open = SH.el("button", { type: "button", class: "btn btn-small breaker-open", text: SH.t("ops.breaker.pause") });
    c.close = SH.el("button", { type: "button", class: "btn btn-small breaker-close", text: SH.t("ops.breaker.resume") });
    c.rows = SH.el("tbody");
    // Why the breaker is open (out of quota: staff must act), and models
    // whose shutdown the vendor has announced.
    c.reason = SH.el("p", { class: "breaker-reason", role: "status", hidden: true });
    c.models = SH.el("ul", { class: "model-notices", hidden: true });
    c.root = SH.el("li", { class: "provider-card", dataset: { provider: name } },
      SH.el("div", { class: "provider-head" }, c.name, " ", c.kind, " ", c.breaker),
      c.reason,
      c.models,
      SH.el("div", { class: "provider-figures" },
        SH.el("div", { class: "tile in-flight" }, c.inFlight, c.cap),
        SH.el("div", { class: "tile queued" }, c.queued, SH.el("span", { class: "label", text: SH.t("ops.provider.queued") })),
        SH.el("div", { class: "tile rate-limit" }, c.rate, SH.el("span", { class: "label", text: SH.t("ops.provider.rateLimit") }))),
      c.barBox,
      (c.actions = SH.el("div", { class: "provider-actions" }, c.open, c.pauseFor, c.close)),
      SH.el("div", { class: "table-wrap" },
        SH.el("table", { class: "provider-experiences" },
          SH.el("thead", {}, SH.el("tr", {},
            SH.el("th", { text: SH.t("ops.col.experience") }),
            SH.el("th", { class: "num", text: SH.t("ops.col.weight") }),
            SH.el("th", { class: "num", text: SH.t("ops.col.inFlight") }),
            SH.el("th", { class: "num", text: SH.t("ops.col.queued") }),
            SH.el("th", { class: "num", text: SH.t("ops.col.share") }))),
          c.rows)));
    // Pausing stops every experience on the provider: two clicks, like
    // Cancel. Resuming takes one.
    let armTimer = null;
    c.open.addEventListener("click", () => {
      if (!c.open.classList.contains("armed")) {
        c.open.classList.add("armed");
        c.open.textContent = SH.t("ops.breaker.confirmPause");
        armTimer = setTimeout(() => {
          c.open.classList.remove("armed");
          c.open.textContent = SH.t("ops.breaker.pause");
        }, 4000);
        return;
      }
      clearTimeout(armTimer);
      c.open.classList.remove("armed");
      c.open.textContent = SH.t("ops.breaker.pause");
      breakerAction(c, name, "open", { for_seconds: Number(c.pauseFor.value) || 300 });
    });
    c.close.addEventListener("click", () => breakerAction(c, name, "close", undefined));
    return c;
  }

  function durationText(sec) {
    return sec < 60 ? SH.t("ops.seconds", { n: sec }) : SH.t("ops.minutes", { n: Math.round(sec / 60) });
  }

  async function breakerAction(card, name, action, body) {
    card.open.disabled = true;
    card.close.disabled = true;
    try {
      const { data } = await call(`/api/admin/breaker/${action}?provider=${enc(name)}`, { method: "POST", body, key: SH.uuid() });
      if (data && data.state) showBreaker(card, data.state);
      flash(SH.t(`ops.breaker.done.${action}`, { name }));
    } catch (err) {
      flash(SH.errorText(err), true);
    } finally {
      card.open.disabled = false;
      card.close.disabled = false;
    }
    loadProviders();
  }

  function showBreaker(card, state) {
    const known = ["closed", "open", "probing"].includes(state) ? state : "open";
    card.root.dataset.breaker = known;
    card.breaker.dataset.state = known;
    card.breaker.textContent = SH.t(`ops.breaker.${known}`);
    card.breaker.title = SH.t(`ops.breaker.${known}.help`);
    // Closed: it can be paused; open or probing: it can be resumed (by an
    // admin: others see no buttons).
    const admin = may("admin");
    card.open.hidden = !admin || known !== "closed";
    card.pauseFor.hidden = !admin || known !== "closed";
    card.close.hidden = !admin || known === "closed";
    card.actions.hidden = !admin;
  }

  function updateProviderCard(c, p) {
    c.kind.textContent = p.kind || "";
    c.kind.hidden = !p.kind;
    showBreaker(c, p.breaker);
    c.reason.textContent = p.reason || "";
    c.reason.hidden = !p.reason;
    const dated = (p.models || []).filter((m) => m.shutdown_date);
    const notices = JSON.stringify(dated);
    if (c.models.dataset.shown !== notices) {
      c.models.dataset.shown = notices;
      c.models.replaceChildren(...dated.map((m) =>
        SH.el("li", { class: "model-shutdown", text: SH.t("ops.provider.modelShutdown", { model: m.model, use: m.use, date: m.shutdown_date }) })));
      c.models.hidden = !dated.length;
    }
    const n = Number(p.in_flight) || 0;
    const cap = p.max_in_flight == null ? null : Number(p.max_in_flight);
    c.inFlight.textContent = cap == null ? SH.fmtNumber(n) : `${SH.fmtNumber(n)} / ${SH.fmtNumber(cap)}`;
    c.cap.textContent = cap == null ? SH.t("ops.provider.noCap") : SH.t("ops.provider.inFlight");
    c.barBox.hidden = cap == null;
    if (cap != null) {
      c.bar.style.width = `${cap ? Math.min(100, Math.round((100 * n) / cap)) : 0}%`;
      c.barBox.classList.toggle("full", cap > 0 && n >= cap);
    }
    c.queued.textContent = SH.fmtNumber(Number(p.queued) || 0);
    c.rate.textContent = p.rate_limit || SH.t("ops.provider.noRateLimit");
    const list = p.experiences || [];
    const shown = JSON.stringify(list);
    if (c.rows.dataset.shown === shown) return;
    c.rows.dataset.shown = shown;
    if (!list.length) {
      c.rows.replaceChildren(SH.el("tr", {}, SH.el("td", { colspan: 5, class: "muted", text: SH.t("ops.provider.noExperiences") })));
      return;
    }
    c.rows.replaceChildren(
      ...list.map((e) =>
        SH.el("tr", { dataset: { slug: e.slug } },
          SH.el("td", { class: "slug", text: e.slug }),
          SH.el("td", { class: "num weight", text: SH.fmtNumber(e.weight) }),
          SH.el("td", { class: "num in-flight", text: `${SH.fmtNumber(e.in_flight || 0)} / ${SH.fmtNumber(e.max_in_flight)}` }),
          SH.el("td", { class: "num queued", text: SH.fmtNumber(e.queued || 0) }),
          SH.el("td", { class: "num share", title: SH.t("ops.provider.shareHelp"), text: e.share == null ? SH.t("common.none") : SH.fmtNumber(e.share) }))));
  }

  // The new-experience form's provider choices.
  function fillProviderSelect() {
    const select = $("new-experience").elements.provider;
    const was = select.value;
    select.replaceChildren(...providerNames.map((n) => SH.el("option", { value: n, text: n })));
    if (providerNames.includes(was)) select.value = was;
    else if (providerNames.includes("default")) select.value = "default";
  }

  // ---- experiences -----------------------------------------------------------

  async function loadExperiences() {
    try {
      const { data } = await call("/api/experiences");
      experiences = (data && data.experiences) || [];
    } catch (err) {
      flash(SH.errorText(err), true);
      return;
    }
    renderExperienceList();
    loadAllHeld();
  }

  // When it closes: "closed" once its closes_at has passed, "closes at"
  // before.
  function closingBadge(e) {
    const at = e.closes_at ? Date.parse(e.closes_at) : NaN;
    if (!Number.isFinite(at)) return null;
    const closed = at <= Date.now();
    return SH.el("span", {
      class: `badge ${closed ? "closed-badge" : "closing-badge"}`,
      title: e.closes_at,
      text: closed ? SH.t("ops.edit.closed") : SH.t("ops.edit.closesAt", { time: SH.fmtDateTime(e.closes_at) }),
    });
  }

  function renderExperienceList() {
    if (!token) return;
    // The review queue shows when any experience reviews its results.
    renderReviewHead();
    for (const slug of [...editors.keys()]) {
      if (!may("admin") || !experiences.some((e) => e.slug === slug)) editors.delete(slug);
    }
    $("experience-list").replaceChildren(
      ...(experiences.length
        ? experiences.map((e) =>
          SH.el("li", { dataset: { slug: e.slug } },
            SH.el("strong", { class: "experience-title", text: e.title }), " ",
            SH.el("span", { class: `badge kind-${e.kind}`, text: SH.t(`kind.${e.kind}`) }), " ",
            closingBadge(e), " ",
            SH.el("span", { class: "muted small experience-summary", text: `${e.locale || "en"} · ${SH.t("ops.maxShort", { n: e.max_in_flight })}` }), " ",
            SH.el("a", { href: `/p/${enc(e.slug)}`, target: "_blank", rel: "noopener", text: `/p/${e.slug}` }),
            e.gallery && e.gallery !== "off"
              ? [" ", SH.el("a", { href: `/g/${enc(e.slug)}`, target: "_blank", rel: "noopener", class: "gallery-link", text: `/g/${e.slug}` })]
              : null,
            may("admin") ? [" ", editButton(e)] : null,
            guestsBlock(e),
            editors.has(e.slug) ? editors.get(e.slug).root : null))
        : [SH.el("li", { class: "muted", text: SH.t("ops.noExperiences") })]));
    const fill = (select, withAny) => {
      const was = select.value;
      select.replaceChildren(
        ...(withAny ? [SH.el("option", { value: "", text: SH.t("ops.filter.any") })] : []),
        ...experiences.map((e) => SH.el("option", { value: e.slug, text: `${e.title} (${e.slug})` })));
      if ([...select.options].some((o) => o.value === was)) select.value = was;
    };
    fill($("f-experience"), true);
    fill($("new-terminal").elements.experience, false);
    fill($("g-experience"), true);
  }

  // ---- experiences: live settings (admin) ------------------------------------

  // The fields the editor shows, as the PATCH names them.
  const EDIT_FIELDS = ["title", "max_in_flight", "provider", "weight", "credits", "credits_add", "closes_at",
    "review", "review_timeout", "locale", "gallery", "gallery_pin", "photo_retention", "retention"];
  const NUMBER_FIELDS = ["max_in_flight", "weight", "credits", "credits_add"];
  // A closing time this close (or past) stops people now: it asks first.
  const CLOSE_NOW_MS = 60000;

  function editButton(e) {
    const open = editors.has(e.slug) && !editors.get(e.slug).root.hidden;
    const b = SH.el("button", {
      type: "button",
      class: "btn btn-small edit-experience",
      "aria-expanded": String(open),
      text: SH.t(open ? "ops.edit.hide" : "ops.edit.open"),
    });
    b.addEventListener("click", () => toggleEditor(e.slug));
    return b;
  }

  function toggleEditor(slug) {
    const e = experiences.find((x) => x.slug === slug);
    if (!e) return;
    let ed = editors.get(slug);
    if (ed && !ed.root.hidden) {
      ed.root.hidden = true;
    } else {
      if (!ed) {
        ed = experienceEditor(slug);
        editors.set(slug, ed);
      }
      ed.root.hidden = false;
      editorMessage(ed, "", false);
      fillEditor(ed, e, false);
      // What the server has now (another operator may have changed it).
      refreshEditor(ed);
    }
    // In place: the rest of the item (what it holds) stays as it is.
    const li = [...$("experience-list").children].find((n) => n.dataset.slug === slug);
    if (li) {
      if (ed.root.parentNode !== li) li.append(ed.root);
      const b = li.querySelector("button.edit-experience");
      if (b) {
        b.textContent = SH.t(ed.root.hidden ? "ops.edit.open" : "ops.edit.hide");
        b.setAttribute("aria-expanded", String(!ed.root.hidden));
      }
    }
    if (!ed.root.hidden) ed.form.elements.title.focus();
  }

  async function refreshEditor(ed) {
    try {
      const { data } = await call(`/api/experiences/${enc(ed.slug)}`);
      if (data && data.slug === ed.slug && editors.get(ed.slug) === ed) {
        fillEditor(ed, data, true);
        replaceExperience(data, false);
      }
    } catch (_) {
      /* the list's values stay */
    }
  }

  function experienceEditor(slug) {
    const ed = { slug, shown: {}, exp: null, saving: false };
    const field = (label, input, extra) =>
      SH.el("label", { class: `field field-${input.name}${extra ? ` ${extra}` : ""}` }, SH.el("span", { text: SH.t(label) }), input);
    const input = (name, props) => SH.el("input", { name, ...props });
    const select = (name, options) =>
      SH.el("select", { name }, ...options.map(([value, label]) => SH.el("option", { value, text: label })));
    const hint = (key) => SH.el("p", { class: "muted small field-hint", text: SH.t(key) });
    ed.closeNow = SH.el("button", { type: "button", class: "btn btn-small btn-danger close-now", text: SH.t("ops.edit.closeNow") });
    ed.reopen = SH.el("button", { type: "button", class: "btn btn-small reopen", text: SH.t("ops.edit.reopen") });
    ed.closesState = SH.el("p", { class: "closes-state small", role: "status" });
    ed.error = SH.el("p", { class: "error edit-error", role: "alert", hidden: true });
    ed.status = SH.el("p", { class: "muted small edit-status", role: "status", hidden: true });
    ed.save = SH.el("button", { type: "submit", class: "btn btn-primary btn-small save-experience", text: SH.t("ops.edit.save") });
    ed.pinField = field("ops.edit.galleryPin",
      input("gallery_pin", { inputmode: "numeric", pattern: "[0-9]{6,12}", maxlength: "12", autocomplete: "off", placeholder: SH.t("ops.edit.galleryPinKeep") }),
      "pin-field");
    ed.form = SH.el("form", { class: "form experience-edit", dataset: { slug }, "aria-label": SH.t("ops.edit.label", { slug }) },
      field("ops.field.title", input("title", { required: true, maxlength: "200" })),
      SH.el("div", { class: "row" },
        field("ops.field.maxInFlight", input("max_in_flight", { type: "number", min: "1", max: "10000", step: "1", required: true })),
        field("ops.field.weight", input("weight", { type: "number", min: "1", max: "100", step: "1", required: true }))),
      field("ops.field.provider", select("provider", [])),
      SH.el("div", { class: "row" },
        field("ops.edit.credits", input("credits", { type: "number", min: "0", step: "1", placeholder: SH.t("ops.edit.unlimited") })),
        field("ops.edit.creditsAdd", input("credits_add", { type: "number", min: "1", step: "1", placeholder: "0" }))),
      SH.el("div", { class: "closing" },
        field("ops.edit.closesAtField", input("closes_at", { type: "datetime-local", step: "1" })),
        ed.closesState,
        SH.el("div", { class: "row closing-actions" }, ed.closeNow, ed.reopen)),
      SH.el("div", { class: "row" },
        field("ops.field.review", select("review", [["off", SH.t("ops.field.reviewOff")], ["before_display", SH.t("ops.field.reviewOn")]])),
        field("ops.edit.reviewTimeout", input("review_timeout", { maxlength: "40", placeholder: SH.t("ops.edit.none") }))),
      SH.el("div", { class: "row" },
        field("ops.field.locale", select("locale", [["en", "English"], ["ko", "한국어"]])),
        field("ops.edit.gallery", select("gallery", [
          ["off", SH.t("ops.edit.galleryOff")],
          ["public", SH.t("ops.edit.galleryPublic")],
          ["pin", SH.t("ops.edit.galleryPinOption")],
        ]))),
      ed.pinField,
      SH.el("div", { class: "row" },
        field("ops.edit.photoRetention", input("photo_retention", { maxlength: "40", placeholder: "1h" })),
        field("ops.edit.retention", input("retention", { maxlength: "40", placeholder: "30d" }))),
      hint("ops.edit.help"),
      ed.error,
      ed.status,
      SH.el("div", { class: "row edit-actions" }, ed.save));
    ed.root = SH.el("div", { class: "experience-editor", dataset: { slug }, hidden: true }, ed.form);
    ed.form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      saveEditor(ed, null);
    });
    ed.form.elements.gallery.addEventListener("change", () => showPinField(ed));
    ed.form.addEventListener("input", () => showClosesState(ed));
    ed.closeNow.addEventListener("click", () => saveEditor(ed, { closes_at: new Date().toISOString() }));
    ed.reopen.addEventListener("click", () => saveEditor(ed, { closes_at: null }));
    return ed;
  }

  // "2026-12-05T14:30:00" in this browser's time zone, as a
  // datetime-local field takes it.
  function localInput(iso) {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return "";
    const p = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
  }

  // The editor's value of each field for an experience, as text.
  function editorValues(e) {
    return {
      title: e.title || "",
      max_in_flight: e.max_in_flight == null ? "" : String(e.max_in_flight),
      provider: e.provider || "",
      weight: e.weight == null ? "1" : String(e.weight),
      credits: e.credits == null ? "" : String(e.credits),
      credits_add: "",
      closes_at: e.closes_at ? localInput(e.closes_at) : "",
      review: e.review || "off",
      review_timeout: e.review_timeout || "",
      locale: e.locale || "en",
      gallery: e.gallery || "off",
      gallery_pin: "",
      photo_retention: e.photo_retention || "",
      retention: e.retention || "",
    };
  }

  // A field's text as compared: trimmed, a number as a number, a time as
  // its instant (the field may drop ":00" seconds).
  function normal(name, text) {
    const v = String(text == null ? "" : text).trim();
    if (!v) return "";
    if (NUMBER_FIELDS.includes(name)) return Number.isFinite(Number(v)) ? String(Number(v)) : v;
    if (name === "closes_at") {
      const ms = new Date(v).getTime();
      return Number.isFinite(ms) ? String(Math.floor(ms / 1000)) : v;
    }
    return v;
  }

  function setSelect(select, value) {
    if (![...select.options].some((o) => o.value === value)) {
      select.append(SH.el("option", { value, text: value }));
    }
    select.value = value;
  }

  function fillEditorProviders(ed) {
    const select = ed.form.elements.provider;
    const was = select.value || (ed.shown.provider ?? "");
    const names = [...providerNames];
    if (was && !names.includes(was)) names.push(was);
    select.replaceChildren(...names.map((n) => SH.el("option", { value: n, text: n })));
    if (was) select.value = was;
  }

  // Shows `e`'s values; with `keepEdits`, a field the operator changed
  // keeps what they typed.
  function fillEditor(ed, e, keepEdits) {
    const values = editorValues(e);
    const edited = keepEdits ? new Set(changedFields(ed)) : new Set();
    fillEditorProviders(ed);
    for (const name of EDIT_FIELDS) {
      if (edited.has(name)) continue;
      const el = ed.form.elements[name];
      if (el.tagName === "SELECT") setSelect(el, values[name]);
      else el.value = values[name];
    }
    ed.shown = values;
    ed.exp = e;
    showPinField(ed);
    showClosesState(ed);
  }

  function showPinField(ed) {
    ed.pinField.hidden = ed.form.elements.gallery.value !== "pin";
  }

  function showClosesState(ed) {
    const e = ed.exp || {};
    const at = e.closes_at ? Date.parse(e.closes_at) : NaN;
    let text;
    if (!Number.isFinite(at)) text = SH.t("ops.edit.openNow");
    else if (at <= Date.now()) text = SH.t("ops.edit.closedSince", { time: SH.fmtDateTime(e.closes_at) });
    else text = SH.t("ops.edit.closesAt", { time: SH.fmtDateTime(e.closes_at) });
    ed.closesState.textContent = text;
    ed.closesState.classList.toggle("closed", Number.isFinite(at) && at <= Date.now());
    ed.reopen.hidden = !Number.isFinite(at);
  }

  // The fields whose value differs from what the server said.
  function changedFields(ed) {
    return EDIT_FIELDS.filter((name) => {
      const el = ed.form.elements[name];
      if (!el) return false;
      if (name === "credits_add" || name === "gallery_pin") return el.value.trim() !== "";
      return normal(name, el.value) !== normal(name, ed.shown[name]);
    });
  }

  // The PATCH body: only the changed fields, each as the API takes it.
  function changedBody(ed) {
    const body = {};
    for (const name of changedFields(ed)) {
      const v = ed.form.elements[name].value.trim();
      if (NUMBER_FIELDS.includes(name)) body[name] = v === "" ? null : Number(v);
      else if (name === "closes_at") body[name] = v === "" ? null : new Date(v).toISOString();
      else if (name === "review_timeout") body[name] = v === "" ? null : v;
      else body[name] = v;
    }
    return body;
  }

  function editorMessage(ed, text, isError) {
    ed.error.textContent = isError ? text : "";
    ed.error.hidden = !isError || !text;
    ed.status.textContent = isError ? "" : text;
    ed.status.hidden = isError || !text;
  }

  function runningOf(slug) {
    return running.has(slug) ? running.get(slug) : 0;
  }

  // What stops people asks first: closing now, and a max_in_flight below
  // the jobs running now (they finish; nothing new starts until fewer
  // run). True when the operator went on.
  function confirmStops(ed, body) {
    const title = (ed.exp && ed.exp.title) || ed.slug;
    if (body.closes_at) {
      const at = Date.parse(body.closes_at);
      if (Number.isFinite(at) && at <= Date.now() + CLOSE_NOW_MS
          && !window.confirm(SH.t("ops.edit.confirmClose", { title }))) return false;
    }
    if (body.max_in_flight != null) {
      const now = runningOf(ed.slug);
      if (body.max_in_flight < now
          && !window.confirm(SH.t("ops.edit.confirmLower", { title, n: now, max: body.max_in_flight }))) return false;
    }
    return true;
  }

  // Saves the changed fields (or `only`, for Close now and Reopen, which
  // leave any other edit in the form as typed).
  async function saveEditor(ed, only) {
    if (ed.saving) return;
    if (!only && !ed.form.reportValidity()) return;
    const body = only || changedBody(ed);
    if (!Object.keys(body).length) {
      editorMessage(ed, SH.t("ops.edit.nothing"), false);
      return;
    }
    if (!confirmStops(ed, body)) {
      editorMessage(ed, SH.t("ops.edit.notSaved"), false);
      return;
    }
    ed.saving = true;
    for (const b of ed.form.querySelectorAll("button")) b.disabled = true;
    editorMessage(ed, SH.t("ops.edit.saving"), false);
    try {
      const { data } = await send("PATCH", `/api/experiences/${enc(ed.slug)}`, body, newKey());
      const saved = data && data.slug ? data : { ...(ed.exp || {}), ...body };
      fillEditor(ed, saved, Boolean(only));
      replaceExperience(saved, true);
      editorMessage(ed, SH.t("ops.edit.saved", { fields: Object.keys(body).join(", ") }), false);
      flash(SH.t("ops.edit.savedFlash", { slug: ed.slug }));
    } catch (err) {
      editorMessage(ed, SH.errorText(err), true);
    } finally {
      ed.saving = false;
      for (const b of ed.form.querySelectorAll("button")) b.disabled = false;
    }
  }

  // An experience as the server now has it, in the list (and, with
  // `redraw`, drawn again).
  function replaceExperience(e, redraw) {
    const i = experiences.findIndex((x) => x.slug === e.slug);
    if (i < 0) return;
    const before = JSON.stringify(experiences[i]);
    experiences[i] = e;
    if (redraw || before !== JSON.stringify(e)) {
      renderExperienceList();
      loadAllHeld();
    }
  }

  // ---- operators (admin) ------------------------------------------------------

  async function loadOperators() {
    if (!token || !may("admin")) return;
    try {
      const { data } = await call("/api/admin/operators");
      operators = (data && data.operators) || [];
      $("operators-note").hidden = true;
      renderOperators();
    } catch (err) {
      $("operators-note").textContent = SH.errorText(err);
      $("operators-note").hidden = false;
    }
  }

  function renderOperators() {
    const body = $("operators").tBodies[0];
    fillAuditOperators();
    if (!operators.length) {
      body.replaceChildren(SH.el("tr", {}, SH.el("td", { colspan: 5, class: "muted", text: SH.t("ops.operators.none") })));
      return;
    }
    body.replaceChildren(...operators.map(operatorRow));
  }

  function operatorRow(o) {
    const revoked = Boolean(o.revoked_at);
    const self = me && me.operator_id && me.operator_id === o.operator_id;
    const actions = SH.el("td", { class: "actions" });
    if (!revoked) {
      const b = SH.el("button", { type: "button", class: "btn btn-small btn-danger action-revoke", text: SH.t("ops.operators.revoke") });
      b.addEventListener("click", () => revokeOperator(o, b));
      actions.append(b);
    }
    return SH.el("tr", { class: revoked ? "revoked" : null, dataset: { operatorId: o.operator_id, role: o.role, revoked: String(revoked) } },
      SH.el("td", { class: "name" }, SH.el("span", { text: o.name || "" }),
        self ? SH.el("span", { class: "muted small", text: ` ${SH.t("ops.operators.you")}` }) : null),
      SH.el("td", { class: "role", text: ROLES.includes(o.role) ? SH.t(`ops.role.${o.role}`) : String(o.role || "") }),
      SH.el("td", { class: "time", title: o.created_at || "", text: SH.fmtDateTime(o.created_at) }),
      SH.el("td", { class: "revoked-at", title: o.revoked_at || "", text: revoked ? SH.fmtDateTime(o.revoked_at) : SH.t("common.none") }),
      actions);
  }

  async function onNewOperator(ev) {
    ev.preventDefault();
    const f = ev.target;
    if (!f.reportValidity()) return;
    const body = { name: f.elements.name.value.trim(), role: f.elements.role.value };
    const created = await submitForm(f, "/api/admin/operators", body);
    if (!created) return;
    f.elements.name.value = "";
    // The token is shown now and never again (the server keeps a digest).
    $("new-operator-text").textContent = SH.t("ops.operators.created", {
      name: created.name || body.name,
      role: SH.t(`ops.role.${ROLES.includes(created.role) ? created.role : body.role}`),
    });
    $("new-operator-token").textContent = created.token || "";
    $("new-operator-copy").textContent = SH.t("ops.copy");
    $("new-operator-result").hidden = false;
    loadOperators();
  }

  async function copyOperatorToken() {
    const ok = await SH.copyText($("new-operator-token").textContent);
    $("new-operator-copy").textContent = SH.t(ok ? "ops.copied" : "ops.copy");
    if (!ok) {
      const range = document.createRange();
      range.selectNodeContents($("new-operator-token"));
      const sel = getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
    }
  }

  function closeOperatorResult() {
    $("new-operator-result").hidden = true;
    $("new-operator-token").textContent = "";
    $("new-operator-text").textContent = "";
  }

  async function revokeOperator(o, button) {
    const self = me && me.operator_id && me.operator_id === o.operator_id;
    if (!window.confirm(SH.t(self ? "ops.operators.confirmRevokeSelf" : "ops.operators.confirmRevoke", { name: o.name || o.operator_id }))) return;
    button.disabled = true;
    try {
      // Revoking is idempotent by itself (again: the same answer).
      const { data } = await send("DELETE", `/api/admin/operators/${enc(o.operator_id)}`, undefined, undefined);
      const i = operators.findIndex((x) => x.operator_id === o.operator_id);
      if (i >= 0) operators[i] = data && data.operator_id ? data : { ...o, revoked_at: new Date().toISOString() };
      renderOperators();
      flash(SH.t("ops.operators.revokedDone", { name: o.name || o.operator_id }));
    } catch (err) {
      button.disabled = false;
      flash(SH.errorText(err), true);
    }
  }

  // ---- the audit log (admin) ------------------------------------------------

  function fillAuditOperators() {
    const select = $("a-operator");
    const was = select.value;
    const seen = new Set();
    const opts = [SH.el("option", { value: "", text: SH.t("ops.filter.any") }),
      SH.el("option", { value: "bootstrap", text: "bootstrap" })];
    for (const o of operators) {
      if (!o.operator_id || seen.has(o.operator_id)) continue;
      seen.add(o.operator_id);
      opts.push(SH.el("option", { value: o.operator_id, text: `${o.name} (${ROLES.includes(o.role) ? SH.t(`ops.role.${o.role}`) : o.role})` }));
    }
    select.replaceChildren(...opts);
    if ([...select.options].some((x) => x.value === was)) select.value = was;
  }

  // One audit request at a time: each waits for the one before.
  function auditRun(fn) {
    const p = auditChain.then(fn, fn);
    auditChain = p.catch(() => {});
    return p;
  }

  function startAudit() {
    if (!may("admin")) return;
    const loop = ++auditLoop;
    clearTimeout(auditTimer);
    const tick = async () => {
      auditTimer = null;
      if (loop !== auditLoop || !token || !may("admin")) return;
      await auditRun(refreshAudit);
      if (loop === auditLoop) auditTimer = setTimeout(tick, AUDIT_MS);
    };
    tick();
  }

  function stopAudit() {
    auditLoop += 1;
    clearTimeout(auditTimer);
    auditTimer = null;
  }

  function auditQuery(after) {
    const q = new URLSearchParams({ limit: String(AUDIT_PAGE) });
    if ($("a-operator").value) q.set("operator", $("a-operator").value);
    if ($("a-action").value) q.set("action", $("a-action").value);
    if (after) q.set("after", after);
    return `/api/admin/audit?${q}`;
  }

  function auditNote(text) {
    $("audit-note").textContent = text || "";
    $("audit-note").hidden = !text;
  }

  // The newest page: new entries go on top of what is shown (a gap, when
  // more came than a page holds, starts the list again).
  async function refreshAudit() {
    if (!token || !may("admin")) return;
    const gen = auditGen;
    let data;
    try {
      ({ data } = await call(auditQuery(null)));
    } catch (err) {
      if (gen === auditGen) auditNote(SH.errorText(err));
      return;
    }
    if (gen !== auditGen || !token) return;
    const page = (data && data.items) || [];
    if (!auditPaged || !auditItems.length) {
      auditItems = page;
      auditNext = (data && data.next) || null;
      auditPaged = false;
    } else {
      const known = new Set(auditItems.map((i) => i.id));
      if (page.length && !page.some((i) => known.has(i.id)) && page.length >= AUDIT_PAGE) {
        auditItems = page;
        auditNext = (data && data.next) || null;
        auditPaged = false;
      } else {
        auditItems = page.filter((i) => !known.has(i.id)).concat(auditItems);
      }
    }
    auditNote("");
    renderAudit();
  }

  async function moreAudit() {
    if (!token || !auditNext) return;
    const gen = auditGen;
    $("audit-more").disabled = true;
    try {
      const { data } = await call(auditQuery(auditNext));
      if (gen !== auditGen) return;
      const known = new Set(auditItems.map((i) => i.id));
      auditItems = auditItems.concat(((data && data.items) || []).filter((i) => !known.has(i.id)));
      auditNext = (data && data.next) || null;
      auditPaged = true;
      auditNote("");
      renderAudit();
    } catch (err) {
      auditNote(SH.errorText(err));
    } finally {
      $("audit-more").disabled = false;
    }
  }

  function resetAudit() {
    auditGen += 1;
    auditItems = [];
    auditNext = null;
    auditPaged = false;
    auditShown = "";
    $("audit").tBodies[0].replaceChildren();
    $("audit-more").hidden = true;
    auditRun(refreshAudit);
  }

  function renderAudit() {
    $("audit-more").hidden = !auditNext;
    const shown = JSON.stringify(auditItems.map((i) => i.id));
    if (shown === auditShown) return;
    auditShown = shown;
    const body = $("audit").tBodies[0];
    if (!auditItems.length) {
      body.replaceChildren(SH.el("tr", {}, SH.el("td", { colspan: 5, class: "muted", text: SH.t("ops.audit.none") })));
      return;
    }
    // Every server string as text.
    body.replaceChildren(...auditItems.map((i) =>
      SH.el("tr", { dataset: { id: String(i.id), action: String(i.action || "") } },
        SH.el("td", { class: "time", title: String(i.at || ""), text: SH.fmtDateTime(i.at) }),
        SH.el("td", { class: "operator", title: i.operator_id ? String(i.operator_id) : "", text: String(i.operator || "") }),
        SH.el("td", { class: "action" }, SH.el("code", { text: String(i.action || "") })),
        SH.el("td", { class: "target", text: String(i.target || "") }),
        SH.el("td", { class: "detail", text: String(i.detail || "") }))));
  }

  // ---- the guests' data: held, export ----------------------------------------

  // Under an experience: what it holds, and its Export button.
  function guestsBlock(e) {
    const held = SH.el("p", { class: "held small", dataset: { slug: e.slug } });
    const kept = SH.el("p", { class: "held-retention muted small" });
    const result = SH.el("span", { class: "export-result muted small", role: "status" });
    const button = may("admin") ? SH.el("button", { type: "button", class: "btn btn-small export", text: SH.t("ops.export") }) : null;
    if (button) button.addEventListener("click", () => exportZip(e.slug, button, result));
    return SH.el("div", { class: "guests-data", dataset: { slug: e.slug } },
      held, kept, button ? SH.el("div", { class: "export-line" }, button, " ", result) : null);
  }

  function loadAllHeld() {
    clearInterval(heldTimer);
    heldTimer = setInterval(() => {
      if (token) experiences.forEach((e) => loadHeld(e.slug));
    }, HELD_MS);
    experiences.forEach((e) => loadHeld(e.slug));
  }

  async function loadHeld(slug) {
    const box = document.querySelector(`.guests-data[data-slug="${CSS.escape(slug)}"]`);
    if (!box) return;
    const [held, kept] = box.querySelectorAll("p");
    try {
      const { data } = await call(`/api/admin/experiences/${enc(slug)}/held`);
      const d = data || {};
      const parts = [SH.t("ops.held", {
        photos: SH.fmtNumber(d.photos || 0),
        size: SH.fmtBytes(d.photo_bytes || 0),
        results: SH.fmtNumber(d.results || 0),
      })];
      // The next purge of anything: a photo's or a result's, whichever
      // comes first.
      const times = [d.next_purge_at, d.next_photo_purge_at].filter((x) => x && Number.isFinite(Date.parse(x)));
      times.sort((a, b) => Date.parse(a) - Date.parse(b));
      parts.push(times.length ? SH.t("ops.nextPurge", { time: SH.fmtDateTime(times[0]) }) : SH.t("ops.noPurge"));
      parts.push(SH.t("ops.forgotten", { n: SH.fmtNumber(d.forgotten || 0) }));
      held.textContent = parts.join("; ");
      held.title = [
        d.next_photo_purge_at ? SH.t("ops.nextPhotoPurge", { time: SH.fmtDateTime(d.next_photo_purge_at) }) : null,
        d.next_purge_at ? SH.t("ops.nextResultPurge", { time: SH.fmtDateTime(d.next_purge_at) }) : null,
      ].filter(Boolean).join("\n");
      held.classList.remove("error");
      kept.textContent = d.photo_retention || d.retention
        ? SH.t("ops.retention", { photos: d.photo_retention || SH.t("common.none"), results: d.retention || SH.t("common.none") })
        : "";
      kept.hidden = !kept.textContent;
    } catch (err) {
      held.textContent = SH.errorText(err);
      held.classList.add("error");
    }
  }

  // The export needs the token in its Authorization header, so it is
  // fetched here and saved from memory under <slug>-export.zip.
  async function exportZip(slug, button, out) {
    if (button.disabled) return;
    const file = `${slug}-export.zip`;
    button.disabled = true;
    button.textContent = SH.t("ops.exporting");
    out.textContent = "";
    try {
      let res;
      try {
        res = await fetch(`/api/admin/experiences/${enc(slug)}/export`, {
          headers: { Authorization: `Bearer ${token}`, Accept: "application/zip, application/json" },
          cache: "no-store",
        });
      } catch (e) {
        throw new SH.NetworkError(e && e.message ? e.message : String(e));
      }
      if (!res.ok) {
        let body = null;
        try {
          body = await res.json();
        } catch (_) {
          /* not JSON */
        }
        const err = new SH.ApiError(res.status, body && body.error, body && body.message, body);
        if (res.status === 401) signOut(SH.t("ops.tokenRevoked"));
        throw err;
      }
      const blob = await res.blob();
      const url = URL.createObjectURL(blob);
      const a = SH.el("a", { href: url, download: file, class: "visually-hidden" });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      out.textContent = SH.t("ops.exported", { file, size: SH.fmtBytes(blob.size) });
    } catch (err) {
      out.textContent = "";
      flash(SH.errorText(err), true);
    } finally {
      button.disabled = false;
      button.textContent = SH.t("ops.export");
    }
  }

  // ---- the guests' data: find a guest -----------------------------------------

  async function findGuests(ev) {
    if (ev) ev.preventDefault();
    const nickname = $("g-nickname").value.trim();
    const experience = $("g-experience").value;
    if (!nickname) {
      guestsNote(SH.t("ops.findEmpty"));
      $("guests").hidden = true;
      return;
    }
    const q = new URLSearchParams({ nickname });
    if (experience) q.set("experience", experience);
    $("guest-find").disabled = true;
    try {
      const { data } = await call(`/api/admin/sessions?${q}`);
      renderGuests((data && data.sessions) || []);
    } catch (err) {
      guestsNote(SH.errorText(err));
    } finally {
      $("guest-find").disabled = false;
    }
  }

  function guestsNote(text) {
    $("guests-note").textContent = text || "";
    $("guests-note").hidden = !text;
  }

  function renderGuests(list) {
    const body = $("guests").tBodies[0];
    $("guests").hidden = !list.length;
    guestsNote(list.length ? "" : SH.t("ops.findNone"));
    body.replaceChildren(...list.map(guestRow));
  }

  function guestRow(g) {
    const link = SH.shownUrl(g.share_url, false);
    const own = link && link.startsWith("/") ? link : null;
    const row = SH.el("tr", { class: g.hidden ? "hidden-result" : null, dataset: { sessionId: g.session_id, hidden: String(Boolean(g.hidden)) } },
      SH.el("td", { class: "time", title: g.created_at || "", text: SH.fmtDateTime(g.created_at) }),
      SH.el("td", { text: g.experience || "" }),
      SH.el("td", { class: "nickname", text: g.nickname || "" }),
      SH.el("td", {},
        SH.el("span", { class: `step-badge step-${String(g.status || "").replace(/[^A-Z_]/g, "")}`, text: g.status || "" }),
        g.hidden ? SH.el("span", { class: "step-badge hidden-badge", text: SH.t("ops.hidden") }) : null),
      SH.el("td", { class: "link" }, own ? SH.el("a", { href: own, target: "_blank", rel: "noopener", text: own }) : SH.t("common.none")),
      SH.el("td", { class: "actions" }));
    const actions = row.lastChild;
    // Hide / Unhide: a moderator's; Erase: an admin's.
    if (may("moderator")) {
      const toggle = SH.el("button", {
        type: "button",
        class: `btn btn-small action-${g.hidden ? "unhide" : "hide"}`,
        text: SH.t(g.hidden ? "ops.unhide" : "ops.hide"),
      });
      toggle.addEventListener("click", () => hideGuest(g, toggle));
      actions.append(toggle);
    }
    // Print (or print again) a finished result: no bound, no review.
    if (may("moderator") && g.status === "COMPLETED") {
      const print = SH.el("button", { type: "button", class: "btn btn-small action-print", text: SH.t("ops.reprint") });
      print.addEventListener("click", () => printGuest(g, print));
      actions.append(" ", print);
    }
    if (may("admin")) {
      const erase = SH.el("button", { type: "button", class: "btn btn-small btn-danger action-erase", text: SH.t("ops.erase") });
      erase.addEventListener("click", () => eraseGuest(g, erase));
      actions.append(" ", erase);
    }
    return row;
  }

  async function hideGuest(g, button) {
    const action = g.hidden ? "unhide" : "hide";
    button.disabled = true;
    try {
      const { data } = await post(`/api/admin/sessions/${enc(g.session_id)}/${action}`, {}, SH.uuid());
      g.hidden = data && typeof data.hidden === "boolean" ? data.hidden : action === "hide";
      const row = button.closest("tr");
      if (row) row.replaceWith(guestRow(g));
      flash(SH.t(`ops.done.${action}`, { name: g.nickname || g.session_id }));
    } catch (err) {
      button.disabled = false;
      flash(SH.errorText(err), true);
    }
  }

  async function printGuest(g, button) {
    button.disabled = true;
    try {
      await post(`/api/admin/sessions/${enc(g.session_id)}/print`, {}, SH.uuid());
      flash(SH.t("ops.reprinted"));
    } catch (err) {
      flash(SH.errorText(err), true);
    } finally {
      button.disabled = false;
    }
  }

  async function eraseGuest(g, button) {
    if (!window.confirm(SH.t("ops.eraseConfirm", { name: g.nickname || g.session_id }))) return;
    button.disabled = true;
    try {
      await call(`/api/admin/sessions/${enc(g.session_id)}`, { method: "DELETE" });
      const row = button.closest("tr");
      if (row) row.remove();
      if (!$("guests").tBodies[0].rows.length) renderGuests([]);
      flash(SH.t("ops.done.erase", { name: g.nickname || g.session_id }));
      if (g.experience) loadHeld(g.experience);
    } catch (err) {
      button.disabled = false;
      flash(SH.errorText(err), true);
    }
  }

  // ---- review queue --------------------------------------------------------

  function onReviewAdded(item) {
    if (!item || !item.saga_id) return;
    reviewItems.set(item.saga_id, item);
    renderReview();
  }

  function onReviewRemoved(sagaId) {
    if (!reviewItems.delete(sagaId)) return;
    if (reviewSelected === sagaId) reviewSelected = null;
    renderReview();
  }

  // Oldest first, as they arrived.
  function reviewOrder() {
    return [...reviewItems.values()].sort((a, b) =>
      a.waiting_since === b.waiting_since ? (a.saga_id < b.saga_id ? -1 : 1) : a.waiting_since < b.waiting_since ? -1 : 1);
  }

  function secondsSince(ms) {
    return Math.max(0, Math.floor((Date.now() - ms) / 1000));
  }

  function renderReviewHead() {
    const shown = reviewItems.size || reviewWaiting;
    $("review-section").hidden = !shown && !experiences.some((e) => e.review === "before_display");
    $("review-count").textContent = SH.t("ops.review.waiting", { n: Math.max(reviewWaiting, reviewItems.size) });
    const oldest = reviewItems.size ? Date.parse(reviewOrder()[0].waiting_since) : reviewOldest;
    $("review-oldest").textContent = oldest ? SH.t("ops.review.oldest", { s: secondsSince(oldest) }) : "";
    $("review-oldest").classList.toggle("late", Boolean(oldest) && secondsSince(oldest) >= 60);
    $("review-approve-all").disabled = !reviewItems.size;
  }

  function renderReview() {
    const items = reviewOrder();
    if (!items.some((i) => i.saga_id === reviewSelected)) reviewSelected = items.length ? items[0].saga_id : null;
    renderReviewHead();
    if (!items.length) {
      $("review-queue").replaceChildren(SH.el("li", { class: "muted empty", text: SH.t("ops.review.empty") }));
      return;
    }
    $("review-queue").replaceChildren(...items.map(reviewCard));
    // The waiting time ticks while anything waits.
    if (!reviewTimer) {
      reviewTimer = setInterval(() => {
        if (!reviewItems.size && !reviewWaiting) return;
        renderReviewHead();
        document.querySelectorAll(".review-card .waited").forEach((n) => {
          n.textContent = SH.t("ops.review.waited", { s: secondsSince(Date.parse(n.dataset.since)) });
        });
      }, 1000);
    }
  }

  function reviewCard(item) {
    const selected = item.saga_id === reviewSelected;
    // A viewer sees the queue without the buttons.
    const decides = may("moderator");
    const approve = decides ? SH.el("button", { type: "button", class: "btn btn-primary action-approve", text: SH.t("ops.review.approve") }) : null;
    const reject = decides ? SH.el("button", { type: "button", class: "btn action-reject", text: SH.t("ops.review.reject") }) : null;
    if (decides) {
      approve.addEventListener("click", () => decide(item.saga_id, "approve"));
      reject.addEventListener("click", () => decide(item.saga_id, "reject"));
    }
    const content = Array.isArray(item.content) ? item.content : item.content ? [item.content] : [];
    const card = SH.el("li", {
      class: `review-card${selected ? " selected" : ""}`,
      dataset: { sagaId: item.saga_id, sessionId: item.session_id },
      tabindex: "0",
    },
      SH.el("div", { class: "review-preview" }, ...SH.renderContent(content)),
      SH.el("div", { class: "review-meta" },
        SH.el("strong", { class: "nickname", text: item.nickname || "?" }),
        SH.el("span", { class: "muted", text: ` · ${item.experience || ""}` }),
        item.score != null ? SH.el("span", { class: "score", text: ` · ${SH.fmtNumber(item.score)}` }) : null,
        SH.el("span", { class: "waited muted", dataset: { since: item.waiting_since }, text: SH.t("ops.review.waited", { s: secondsSince(Date.parse(item.waiting_since)) }) })),
      decides ? SH.el("div", { class: "review-actions" }, approve, reject) : null);
    card.addEventListener("click", (ev) => {
      if (ev.target.closest("button")) return;
      reviewSelected = item.saga_id;
      renderReview();
    });
    return card;
  }

  // One decision; the item leaves at once (the socket confirms it).
  async function decide(sagaId, action) {
    const item = reviewItems.get(sagaId);
    if (!item || item.deciding) return;
    item.deciding = true;
    try {
      await post(`/api/admin/sagas/${enc(sagaId)}/${action}`, {}, SH.uuid());
      onReviewRemoved(sagaId);
      flash(SH.t(action === "approve" ? "ops.review.approved" : "ops.review.rejected", { name: item.nickname || "?" }));
    } catch (err) {
      item.deciding = false;
      flash(SH.errorText(err), true);
      // Decided elsewhere (409): the socket removes it; nothing to undo.
    }
  }

  function moveSelection(delta) {
    const items = reviewOrder();
    if (!items.length) return;
    const at = Math.max(0, items.findIndex((i) => i.saga_id === reviewSelected));
    reviewSelected = items[Math.min(items.length - 1, Math.max(0, at + delta))].saga_id;
    renderReview();
    const card = document.querySelector(`.review-card[data-saga-id="${reviewSelected}"]`);
    if (card && card.scrollIntoView) card.scrollIntoView({ block: "nearest" });
  }

  function onReviewKey(ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const tag = (ev.target && ev.target.tagName) || "";
    if (["INPUT", "SELECT", "TEXTAREA"].includes(tag) || $("dashboard").hidden) return;
    if (!reviewItems.size) return;
    const key = ev.key.toLowerCase();
    // Deciding is a moderator's (a viewer only moves through the queue).
    if ((key === "a" || key === "r") && !may("moderator")) return;
    if (key === "a" && reviewSelected) decide(reviewSelected, "approve");
    else if (key === "r" && reviewSelected) decide(reviewSelected, "reject");
    else if (key === "j" || key === "arrowdown") moveSelection(1);
    else if (key === "k" || key === "arrowup") moveSelection(-1);
    else return;
    ev.preventDefault();
  }

  // Approve all: the first click arms the button with the count, the
  // second approves every item in review (one bulk request).
  function armApproveAll() {
    const b = $("review-approve-all");
    if (!b.classList.contains("armed")) {
      b.classList.add("armed");
      b.textContent = SH.t("ops.review.confirmApproveAll", { n: Math.max(reviewWaiting, reviewItems.size) });
      setTimeout(() => {
        b.classList.remove("armed");
        b.textContent = SH.t("ops.review.approveAll");
      }, 4000);
      return;
    }
    b.classList.remove("armed");
    b.textContent = SH.t("ops.review.approveAll");
    b.disabled = true;
    post("/api/admin/sagas/bulk", { action: "approve", filter: { step: "IN_REVIEW" }, dry_run: false }, SH.uuid())
      .then(({ data }) => flash(SH.t("ops.review.approvedAll", { done: data.done, matched: data.matched })))
      .catch((err) => flash(SH.errorText(err), true))
      .finally(() => {
        b.disabled = !reviewItems.size;
      });
  }

  // "Retry all AI failed of the last hour": the first click runs a dry
  // run and shows its count on the button; the second retries that set
  // (the same time window).
  async function retryFailed() {
    const b = $("retry-failed");
    if (!retryFailedArmed) {
      const filter = { reason: "AI_FAILED", updated_after: new Date(Date.now() - 3600 * 1000).toISOString() };
      b.disabled = true;
      try {
        const { data } = await post("/api/admin/sagas/bulk", { action: "retry", filter, dry_run: true }, SH.uuid());
        if (!data.matched) {
          flash(SH.t("ops.retryFailedNone"));
          return;
        }
        retryFailedArmed = filter;
        b.classList.add("armed");
        b.textContent = SH.t("ops.retryFailedCount", { n: data.matched });
        setTimeout(() => {
          retryFailedArmed = null;
          b.classList.remove("armed");
          b.textContent = SH.t("ops.retryFailed");
        }, 6000);
      } catch (err) {
        flash(SH.errorText(err), true);
      } finally {
        b.disabled = false;
      }
      return;
    }
    const filter = retryFailedArmed;
    retryFailedArmed = null;
    b.classList.remove("armed");
    b.textContent = SH.t("ops.retryFailed");
    b.disabled = true;
    try {
      const { data } = await post("/api/admin/sagas/bulk", { action: "retry", filter, dry_run: false }, SH.uuid());
      flash(SH.t("ops.retryFailedDone", { done: data.done, matched: data.matched }));
    } catch (err) {
      flash(SH.errorText(err), true);
    } finally {
      b.disabled = false;
      sagasShown = "";
      loadSagas();
    }
  }

  // ---- sagas ---------------------------------------------------------------

  function sagaQuery(cursor) {
    const q = new URLSearchParams();
    if ($("f-step").value) q.set("step", $("f-step").value);
    if ($("f-reason").value) q.set("reason", $("f-reason").value);
    if ($("f-experience").value) q.set("experience", $("f-experience").value);
    if ($("f-q").value.trim()) q.set("q", $("f-q").value.trim());
    q.set("limit", String(SAGA_PAGE));
    if (cursor) q.set("cursor", cursor);
    return `/api/admin/sagas?${q}`;
  }

  // Loads the first page again (or the next one with `more`).
  async function loadSagas(more) {
    if (sagasLoading) {
      // One more load after this one, so a change made meanwhile shows.
      if (!more) sagasAgain = true;
      return;
    }
    sagasLoading = true;
    sagasLoadedAt = Date.now();
    try {
      const { data } = await call(sagaQuery(more ? sagasCursor : null));
      const page = (data && data.sagas) || [];
      sagas = more ? sagas.concat(page) : page;
      sagasCursor = (data && data.next_cursor) || null;
      sagasPaged = Boolean(more);
      $("sagas-note").hidden = true;
      renderSagas();
    } catch (err) {
      $("sagas-note").textContent = SH.errorText(err);
      $("sagas-note").hidden = false;
    } finally {
      sagasLoading = false;
      sagasLoadedAt = Date.now();
      if (sagasAgain) {
        sagasAgain = false;
        loadSagas();
      }
    }
  }

  function renderSagas() {
    const stuckOnly = $("f-stuck").checked;
    const rows = stuckOnly ? sagas.filter((s) => s.stuck) : sagas;
    $("sagas-more").hidden = !sagasCursor;
    // Redraw only when something changed, so a button is not replaced under
    // the pointer for nothing.
    const shown = JSON.stringify([stuckOnly, rows]);
    if (shown === sagasShown) return;
    sagasShown = shown;
    const body = $("sagas").tBodies[0];
    if (!rows.length) {
      body.replaceChildren(SH.el("tr", {}, SH.el("td", { colspan: 7, class: "muted", text: SH.t("ops.noSagas") })));
      return;
    }
    body.replaceChildren(...rows.map(sagaRow));
  }

  function sagaRow(s) {
    // Retry and Cancel are an admin's.
    const canCancel = may("admin") && !FINAL.includes(s.step);
    // The server retries only an ABORTED saga (a stuck one is cancelled
    // first, or left to the cleanup, which aborts it as ORPHANED).
    const canRetry = may("admin") && s.step === "ABORTED";
    const actions = SH.el("td", { class: "actions" },
      canRetry ? actionButton(s, "retry") : null,
      canCancel ? actionButton(s, "cancel") : null);
    return SH.el("tr", { class: s.stuck ? "stuck" : null, dataset: { sagaId: s.saga_id, sessionId: s.session_id, step: s.step } },
      SH.el("td", { class: "time", title: s.created_at || "", text: SH.fmtTime(s.updated_at) }),
      SH.el("td", { text: s.experience || "" }),
      SH.el("td", { class: "nickname", text: s.nickname || "" }),
      SH.el("td", {},
        SH.el("span", { class: `step-badge step-${s.step}`, text: SH.t(`step.${s.step}`) }),
        s.stuck ? SH.el("span", { class: "step-badge stuck", text: SH.t("ops.stuck") }) : null),
      SH.el("td", { class: "reason", title: s.abort_detail || "", text: s.abort_reason ? SH.t(`reason.${s.abort_reason}`) : "" }),
      SH.el("td", { class: "num", text: `${s.attempts ?? 0}${s.recoveries ? ` (+${s.recoveries})` : ""}` }),
      actions);
  }

  // Retry and Cancel take two clicks: the first arms the button for a few
  // seconds, the second sends. The table is redrawn whenever a saga
  // changes, so the arming is kept here, by saga and action, and a redrawn
  // button comes back armed for the time it has left.
  const ARM_MS = 4000;
  const armedUntil = new Map();

  function actionButton(saga, action) {
    const label = SH.t(`ops.${action}`);
    const confirmLabel = SH.t(action === "cancel" ? "ops.confirmCancel" : "ops.confirmRetry");
    const key = `${saga.saga_id}:${action}`;
    const b = SH.el("button", { type: "button", class: `btn btn-small action-${action}`, dataset: { action }, text: label });
    const arm = (ms) => {
      b.classList.add("armed");
      b.textContent = confirmLabel;
      setTimeout(() => {
        if ((armedUntil.get(key) || 0) > Date.now()) return;
        armedUntil.delete(key);
        b.classList.remove("armed");
        b.textContent = label;
      }, ms);
    };
    const left = (armedUntil.get(key) || 0) - Date.now();
    if (left > 0) arm(left);
    b.addEventListener("click", async () => {
      if (!b.classList.contains("armed")) {
        armedUntil.set(key, Date.now() + ARM_MS);
        arm(ARM_MS);
        return;
      }
      armedUntil.delete(key);
      b.disabled = true;
      try {
        await post(`/api/admin/sagas/${enc(saga.saga_id)}/${action}`, {}, SH.uuid());
        flash(SH.t(`ops.done.${action}`));
      } catch (err) {
        flash(SH.errorText(err), true);
      }
      sagasShown = "";
      await loadSagas();
    });
    return b;
  }

  // ---- forms ---------------------------------------------------------------

  // A form's pending request: {key, json}. The same body sent again (after
  // no answer) reuses the key; a changed body is a new request.
  const pendingKeys = new Map();

  async function submitForm(form, path, body) {
    const json = JSON.stringify(body);
    let p = pendingKeys.get(form.id);
    if (!p || p.json !== json) {
      p = { key: SH.uuid(), json };
      pendingKeys.set(form.id, p);
    }
    const error = form.querySelector(".form-error");
    const button = form.querySelector("button[type=submit]");
    error.hidden = true;
    button.disabled = true;
    try {
      const res = await post(path, body, p.key);
      pendingKeys.delete(form.id);
      return res.data;
    } catch (err) {
      if (!SH.retryable(err)) pendingKeys.delete(form.id);
      error.textContent = SH.errorText(err);
      error.hidden = false;
      return null;
    } finally {
      button.disabled = false;
    }
  }

  async function onNewExperience(ev) {
    ev.preventDefault();
    const f = ev.target;
    if (!f.reportValidity()) return;
    const body = {
      slug: f.elements.slug.value.trim(),
      title: f.elements.title.value.trim(),
      kind: f.elements.kind.value,
      max_in_flight: Number(f.elements.max_in_flight.value),
      locale: f.elements.locale.value,
    };
    // Optional: the server's defaults are the `default` provider, weight 1.
    if (f.elements.provider.value) body.provider = f.elements.provider.value;
    if (f.elements.weight.value.trim()) body.weight = Number(f.elements.weight.value);
    if (f.elements.review.value === "before_display") {
      body.review = "before_display";
      if (f.elements.review_timeout.value.trim()) {
        body.review_timeout = f.elements.review_timeout.value.trim();
        body.review_timeout_action = f.elements.review_timeout_action.value;
      }
    }
    const created = await submitForm(f, "/api/experiences", body);
    if (!created) return;
    flash(SH.t("ops.createdExperience", { slug: created.slug || body.slug }));
    f.reset();
    fillProviderSelect();
    await loadExperiences();
    $("new-terminal").elements.experience.value = created.slug || body.slug;
  }

  async function onNewTerminal(ev) {
    ev.preventDefault();
    const f = ev.target;
    if (!f.reportValidity()) return;
    const body = { experience: f.elements.experience.value, name: f.elements.name.value.trim() };
    const created = await submitForm(f, "/api/terminals", body);
    if (!created) return;
    f.elements.name.value = "";
    // The token is shown now and never again (the server keeps only its hash).
    const link = `${location.origin}/terminal/${enc(created.terminal_id)}#token=${enc(created.token)}`;
    $("new-terminal-text").textContent = SH.t("ops.createdTerminal", { name: created.name || body.name });
    $("new-terminal-link").href = link;
    $("new-terminal-link").textContent = link;
    $("new-terminal-qr").src = qrUrl({ experience: created.experience || body.experience, terminal_id: created.terminal_id });
    $("new-terminal-qr").alt = SH.t("ops.qrAlt", { name: created.name || body.name });
    $("new-terminal-result").hidden = false;
    $("new-terminal-copy").textContent = SH.t("ops.copy");
    if (!wsHeard) loadTerminals();
  }

  async function copyLink() {
    const text = $("new-terminal-link").textContent;
    try {
      await navigator.clipboard.writeText(text);
    } catch (_) {
      // Not a secure context: select the text so Ctrl+C does it.
      const range = document.createRange();
      range.selectNodeContents($("new-terminal-link"));
      const sel = getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      document.execCommand && document.execCommand("copy");
    }
    $("new-terminal-copy").textContent = SH.t("ops.copied");
  }

  function closeTerminalResult() {
    $("new-terminal-result").hidden = true;
    $("new-terminal-link").textContent = "";
    $("new-terminal-link").removeAttribute("href");
  }

  // ---- start ---------------------------------------------------------------

  function fillFilters() {
    const opts = (values, prefix) => [
      SH.el("option", { value: "", text: SH.t("ops.filter.any") }),
      ...values.map((v) => SH.el("option", { value: v, text: SH.t(`${prefix}.${v}`) })),
    ];
    $("f-step").replaceChildren(...opts(STEPS, "step"));
    $("f-reason").replaceChildren(...opts(REASONS, "reason"));
    $("f-experience").replaceChildren(SH.el("option", { value: "", text: SH.t("ops.filter.any") }));
    $("a-action").replaceChildren(
      SH.el("option", { value: "", text: SH.t("ops.filter.any") }),
      ...AUDIT_ACTIONS.map((a) => SH.el("option", { value: a, text: a })));
    fillAuditOperators();
  }

  async function start() {
    $("login").hidden = true;
    $("dashboard").hidden = false;
    $("sign-out").hidden = false;
    applyRole();
    sagasShown = "";
    renderSteps({}, null);
    renderReasons({});
    connect();
    if (may("admin")) {
      loadOperators();
      startAudit();
    }
    loadProviders();
    clearInterval(providersTimer);
    providersTimer = setInterval(loadProviders, PROVIDERS_MS);
    await loadExperiences();
    loadTerminals();
    loadSagas();
    // A safety net for when the socket is down: the table still refreshes.
    clearInterval(refreshTimer);
    refreshTimer = setInterval(() => {
      if (!ws && !sagasPaged) loadSagas();
    }, 10000);
  }

  async function init() {
    await SH.loadLocale("en");
    fillFilters();
    $("login").addEventListener("submit", onLogin);
    $("sign-out").addEventListener("click", () => signOut());
    $("saga-filters").addEventListener("submit", (ev) => {
      ev.preventDefault();
      sagasShown = "";
      loadSagas();
    });
    for (const id of ["f-step", "f-reason", "f-experience"]) {
      $(id).addEventListener("change", () => {
        sagasShown = "";
        loadSagas();
      });
    }
    $("f-stuck").addEventListener("change", renderSagas);
    $("f-q").addEventListener("input", () => {
      clearTimeout(qTimer);
      qTimer = setTimeout(() => {
        sagasShown = "";
        loadSagas();
      }, 250);
    });
    $("retry-failed").addEventListener("click", retryFailed);
    $("review-approve-all").addEventListener("click", armApproveAll);
    document.addEventListener("keydown", onReviewKey);
    $("sagas-more").addEventListener("click", () => loadSagas(true));
    $("new-experience").addEventListener("submit", onNewExperience);
    $("new-terminal").addEventListener("submit", onNewTerminal);
    $("new-terminal-copy").addEventListener("click", copyLink);
    $("new-terminal-close").addEventListener("click", closeTerminalResult);
    $("guest-search").addEventListener("submit", findGuests);
    $("new-operator").addEventListener("submit", onNewOperator);
    $("new-operator-copy").addEventListener("click", copyOperatorToken);
    $("new-operator-close").addEventListener("click", closeOperatorResult);
    $("a-operator").addEventListener("change", resetAudit);
    $("a-action").addEventListener("change", resetAudit);
    $("audit-filters").addEventListener("submit", (ev) => {
      ev.preventDefault();
      resetAudit();
    });
    $("audit-more").addEventListener("click", () => auditRun(moreAudit));
    if (!token) {
      showLogin();
      return;
    }
    const who = await whoIs(token);
    if (!who.ok) {
      signOut(SH.t("ops.tokenWrong"));
      return;
    }
    setMe(who.me);
    start();
  }

  init();
})();
