// The participant page, /p/{slug}[?terminal=ID]: nickname, prompt (and a
// score for games), one button; then progress, then the result or the reason
// it was refused, with a way to try again.
//
// Safe against double taps, flaky networks and reloads: every POST carries an
// Idempotency-Key made here and kept (in localStorage, per slug) with its
// body until the server answers, so a retry, automatic or after a reload,
// sends the SAME key and the same body and can never create a second session
// or charge twice.
"use strict";

(() => {
  const slug = decodeURIComponent(location.pathname.split("/")[2] || "");
  const terminalParam = new URLSearchParams(location.search).get("terminal") || null;
  const STORE_KEY = `stagehand:p:${slug}`;
  const AUTO_RETRIES = 5;
  // An ABORTED session is still looked at now and then: an operator may
  // retry it, and then it runs again.
  const ABORTED_POLL_MS = 5000;
  const VIEWS = ["view-loading", "view-missing", "view-form", "view-waiting", "view-result", "view-aborted"];

  // What survives a reload:
  //   nickname, prompt, score   what was typed last
  //   session {id, token}       the session, once created
  //   terminal_id               the terminal the session was made for
  //   create {key, body}        a session creation not answered yet
  //   submit {key, body}        a submission not answered yet
  //   locale                    to show the right language before loading
  //   queue {position, until}   the 202's queue position and the time its
  //                             estimated wait ends (epoch ms), if given
  const st = SH.local.get(STORE_KEY) || {};
  let experience = null;
  let busy = false;
  let pollTimer = null;
  let pollFailures = 0;
  let waitingSince = Date.now();

  const $ = (id) => document.getElementById(id);
  const persist = () => SH.local.set(STORE_KEY, st);
  const show = (id) => SH.showOnly(VIEWS, id);
  const pending = () => Boolean(st.create || st.submit);

  // ---- the form ------------------------------------------------------------

  function setError(text) {
    $("form-error").textContent = text || "";
    $("form-error").hidden = !text;
  }

  function setNote(text) {
    $("form-note").textContent = text || "";
    $("form-note").hidden = !text;
  }

  function buttonLabel() {
    return SH.t(experience && experience.kind === "score" ? "p.submitScore" : "p.submit");
  }

  // Busy: the button is disabled while a request is out. A request that got
  // no answer stays pending: the fields hold what it sends, and the button
  // says Retry (it sends the same key again).
  function refreshButton() {
    const go = $("go");
    go.disabled = busy;
    go.textContent = busy ? SH.t("p.sending") : pending() ? SH.t("p.retry") : buttonLabel();
    for (const id of ["nickname", "prompt", "score"]) $(id).disabled = busy || pending();
    $("start-over").disabled = busy;
  }

  function showForm() {
    stopPolling();
    const hasSession = Boolean(st.session);
    $("who").hidden = !hasSession;
    $("who-text").textContent = SH.t("p.playingAs", { nickname: st.nickname || "" });
    $("nickname-field").hidden = hasSession;
    $("nickname").value = st.nickname || "";
    $("prompt").value = st.prompt || "";
    $("score-field").hidden = !(experience && experience.kind === "score");
    $("score").value = st.score == null ? "" : st.score;
    refreshButton();
    show("view-form");
  }

  // The form's values, or null (with the reason shown) when they are not
  // acceptable.
  function readForm() {
    const nickname = $("nickname").value.trim();
    const prompt = $("prompt").value;
    const scoreText = $("score").value.trim();
    if (!st.session && (!nickname || [...nickname].length > 40 || /[\u0000-\u001f\u007f]/.test(nickname))) {
      setError(SH.t("p.error.nickname"));
      $("nickname").focus();
      return null;
    }
    if (!prompt.trim() || [...prompt].length > 2000) {
      setError(SH.t("p.error.prompt"));
      $("prompt").focus();
      return null;
    }
    let score;
    if (experience.kind === "score") {
      score = Number(scoreText);
      if (!scoreText || !Number.isFinite(score)) {
        setError(SH.t("p.error.score"));
        $("score").focus();
        return null;
      }
    }
    return { nickname: st.session ? st.nickname : nickname, prompt, score, scoreText };
  }

  async function onSubmit(ev) {
    ev.preventDefault();
    if (busy) return; // a double tap
    setError("");
    if (!pending()) {
      const input = readForm();
      if (!input) return;
      st.nickname = input.nickname;
      st.prompt = input.prompt;
      st.score = input.scoreText || null;
      if (!st.session) {
        const body = { nickname: input.nickname };
        if (terminalParam) body.terminal_id = terminalParam;
        st.create = { key: SH.uuid(), body };
      }
      const body = { prompt: input.prompt };
      if (input.score !== undefined) body.score = input.score;
      st.submit = { key: SH.uuid(), body };
      persist();
    }
    await run();
  }

  // ---- sending -------------------------------------------------------------

  // POSTs `req` ({key, body, token}), sending it again with the same key
  // when there was no answer (or the first is still in progress).
  async function send(path, req) {
    for (let attempt = 0; ; attempt++) {
      try {
        return await SH.api(path, { body: req.body, key: req.key, token: req.token });
      } catch (err) {
        if (!SH.retryable(err) || attempt >= AUTO_RETRIES) throw err;
        setNote(SH.t("p.retrying", { n: attempt + 1 }));
        await SH.sleep(SH.backoff(attempt, 8000));
      }
    }
  }

  // Sends whatever is pending: first the session, then the submission.
  async function run() {
    if (busy || !pending()) return;
    busy = true;
    refreshButton();
    setError("");
    setNote("");
    try {
      if (st.create) {
        const { data } = await send(`/api/experiences/${encodeURIComponent(slug)}/sessions`, st.create);
        st.session = { id: data.session_id, token: data.participant_token };
        st.terminal_id = st.create.body.terminal_id || null;
        st.create = null;
        persist();
      }
      if (st.submit) {
        if (!st.session) {
          st.submit = null;
          persist();
          return;
        }
        try {
          const { data } = await send(`/api/sessions/${encodeURIComponent(st.session.id)}/submission`, {
            ...st.submit,
            token: st.session.token,
          });
          st.queue = queueOf(data);
        } catch (err) {
          // Already running (an earlier tap got through): follow it.
          if (!(err instanceof SH.ApiError && err.code === "already_submitted")) throw err;
        }
        st.submit = null;
        persist();
        busy = false;
        setNote("");
        startWaiting();
      }
    } catch (err) {
      onSendError(err);
    } finally {
      busy = false;
      if (!$("view-form").hidden) refreshButton();
    }
  }

  function onSendError(err) {
    if (SH.retryable(err)) {
      // No answer: keep the key and the body; the button now retries them.
      setNote("");
      setError(SH.t("p.networkFailed"));
      refreshButton();
      return;
    }
    const creating = Boolean(st.create);
    if (err instanceof SH.ApiError && !creating && (err.status === 401 || err.status === 404)) {
      // The stored session is gone (or its token no longer works).
      forgetSession();
      st.submit = null;
      persist();
      showForm();
      setError(SH.t("p.sessionLost"));
      return;
    }
    if (err instanceof SH.ApiError && creating && err.status === 404) {
      st.create = null;
      st.submit = null;
      persist();
      show("view-missing");
      return;
    }
    // Answered with a refusal: the key is spent; fix the input and send anew.
    st.create = null;
    st.submit = null;
    persist();
    showForm();
    const specific = err instanceof SH.ApiError ? `p.error.${err.code}` : "";
    setError(specific && SH.t(specific) !== specific ? SH.t(specific) : SH.errorText(err));
  }

  function forgetSession() {
    st.session = null;
    st.terminal_id = null;
  }

  // ---- waiting for the result ----------------------------------------------

  // Each stop starts a new generation: an answer that arrives after the
  // view moved on (Try again, Start over) is dropped.
  let pollGen = 0;

  function stopPolling() {
    clearTimeout(pollTimer);
    pollTimer = null;
    pollGen += 1;
  }

  function startWaiting() {
    waitingSince = Date.now();
    pollFailures = 0;
    $("wait-message").textContent = SH.t("session.SUBMITTING");
    $("wait-stage").textContent = SH.t("p.stage.AI_PENDING");
    markStage("AI_PENDING");
    showPaused(false);
    showQueuePlace(st.queue && st.queue.position);
    $("wait-extra").textContent = queueText("AI_PENDING").join(" · ");
    show("view-waiting");
    poll();
  }

  // GET the session about once a second until it is COMPLETED or ABORTED.
  async function poll() {
    stopPolling();
    if (!st.session) return;
    const gen = pollGen;
    let again = true;
    try {
      const { data } = await SH.api(`/api/sessions/${encodeURIComponent(st.session.id)}`, {
        token: st.session.token,
        timeoutMs: 10000,
      });
      if (gen !== pollGen) return;
      pollFailures = 0;
      again = renderSession(data);
      if (!again && data.status === "ABORTED") {
        pollTimer = setTimeout(poll, ABORTED_POLL_MS);
        return;
      }
    } catch (err) {
      if (gen !== pollGen) return;
      if (err instanceof SH.ApiError && (err.status === 401 || err.status === 404)) {
        forgetSession();
        persist();
        showForm();
        setError(SH.t("p.sessionLost"));
        return;
      }
      pollFailures += 1;
      $("wait-extra").textContent = SH.errorText(err);
    }
    if (again && !pollTimer) {
      pollTimer = setTimeout(poll, pollFailures ? SH.backoff(pollFailures, 10000) : 1000);
    }
  }

  // What the 202 said of the queue: its position and estimated wait
  // (`queue_position`, `eta_seconds`), when the server gives them.
  function queueOf(data) {
    if (!data) return null;
    const position = Number(data.queue_position);
    const wait = Number(data.eta_seconds);
    const q = {
      position: Number.isFinite(position) && position > 0 ? position : null,
      until: Number.isFinite(wait) && wait > 0 ? Date.now() + wait * 1000 : null,
    };
    return q.position || q.until ? q : null;
  }

  // The estimated wait while the AI has not started on it (the place in
  // the queue shows apart, in #wait-queue).
  function queueText(step) {
    const q = st.queue;
    if (!q || (step && step !== "AI_PENDING")) return [];
    const out = [];
    const left = q.until ? Math.ceil((q.until - Date.now()) / 1000) : 0;
    if (left > 0) out.push(SH.t("p.estimate", { s: left }));
    return out;
  }

  function showPaused(paused, message) {
    $("view-waiting").classList.toggle("paused", paused);
    $("wait-message").hidden = paused;
    $("wait-paused").hidden = !paused;
    $("wait-paused").textContent = paused ? message || SH.t("session.ai_paused") : "";
  }

  function showQueuePlace(n) {
    const ok = typeof n === "number" && Number.isFinite(n) && n > 0;
    $("wait-queue").hidden = !ok;
    $("wait-queue").textContent = ok ? SH.t("session.queue_position", { n }) : "";
  }

  function markStage(step) {
    const order = ["AI_PENDING", "AI_DONE", "RANKING_DONE"];
    // A result in review has passed the AI stage and waits at the next.
    const at = order.indexOf(step === "IN_REVIEW" ? "AI_DONE" : step);
    document.querySelectorAll(".stages li").forEach((li, i) => {
      li.className = i < at ? "done" : i === at ? "active" : "";
    });
  }

  // Shows the session; true while it is still running.
  function renderSession(s) {
    if (s.nickname) st.nickname = s.nickname;
    if (s.status === "SUBMITTING") {
      if ($("view-waiting").hidden) {
        waitingSince = Date.now();
        show("view-waiting");
      }
      // The provider paused (its breaker open): a calm word, not an
      // error; the session waits in its place and goes on by itself.
      const paused = s.ai_paused === true;
      showPaused(paused, s.message);
      if (!paused) $("wait-message").textContent = s.message || SH.t("session.SUBMITTING");
      $("wait-stage").textContent = s.step ? SH.t(`p.stage.${s.step}`) : "";
      markStage(s.step || "AI_PENDING");
      // The place in the queue: the server's, while the saga waits for an
      // AI slot (null once it has one); before it says, the 202's.
      const serverSays = "queue_position" in s;
      const place = serverSays ? Number(s.queue_position) : st.queue && st.queue.position;
      showQueuePlace(s.step === "AI_PENDING" || !s.step ? place : null);
      const secs = Math.floor((Date.now() - waitingSince) / 1000);
      const parts = [SH.t("p.elapsed", { s: secs })];
      parts.unshift(...queueText(s.step));
      $("wait-extra").textContent = parts.join(" · ");
      return true;
    }
    if (s.status === "COMPLETED") {
      renderResult(s);
      return false;
    }
    if (s.status === "ABORTED") {
      const reason = s.abort_reason || "";
      $("aborted-title").textContent = SH.t(reason === "INPUT_REJECTED" ? "p.rejectedTitle" : "p.abortedTitle");
      $("aborted-message").textContent = s.message || SH.t(`abort.${reason}`);
      $("aborted-hint").textContent = reason === "INPUT_REJECTED" ? SH.t("p.rejectedHint") : "";
      document.body.dataset.reason = reason;
      show("view-aborted");
      return false;
    }
    // OPEN: nothing submitted (yet).
    showForm();
    return false;
  }

  function renderResult(s) {
    const result = s.result || {};
    $("result-message").textContent = s.message || SH.t("session.COMPLETED");
    $("result-content").replaceChildren(...SH.renderContent(result.content));
    const stats = [];
    if (result.score != null) {
      stats.push(SH.el("div", { class: "stat" },
        SH.el("dt", { text: SH.t("p.score.label") }),
        SH.el("dd", { class: "score", text: SH.fmtNumber(result.score) })));
    }
    if (result.rank != null) {
      stats.push(SH.el("div", { class: "stat" },
        SH.el("dt", { text: SH.t("p.rank.label") }),
        SH.el("dd", { class: "rank", text: SH.t("p.rankValue", { rank: result.rank }) })));
    }
    $("result-stats").replaceChildren(...stats);
    $("result-stats").hidden = !stats.length;
    show("view-result");
  }

  // ---- buttons -------------------------------------------------------------

  function playAgain() {
    // A new session (the finished one stays as it is); keep the nickname.
    forgetSession();
    st.prompt = "";
    st.score = null;
    persist();
    setError("");
    showForm();
    $("prompt").focus();
  }

  function tryAgain() {
    // The same session accepts a new submission after ABORTED.
    setError("");
    showForm();
    $("prompt").focus();
  }

  function startOver() {
    if (busy) return;
    forgetSession();
    st.create = null;
    st.submit = null;
    persist();
    setError("");
    setNote("");
    showForm();
  }

  // ---- start ---------------------------------------------------------------

  async function loadExperience() {
    for (let attempt = 0; ; attempt++) {
      try {
        const { data } = await SH.api(`/api/experiences/${encodeURIComponent(slug)}`);
        return data;
      } catch (err) {
        if (err instanceof SH.ApiError && err.status === 404) return null;
        if (!SH.retryable(err) && attempt >= 2) return null;
        await SH.sleep(SH.backoff(attempt, 10000));
      }
    }
  }

  async function init() {
    await SH.loadLocale(st.locale || "en");
    experience = slug ? await loadExperience() : null;
    if (!experience) {
      show("view-missing");
      return;
    }
    st.locale = experience.locale || "en";
    persist();
    await SH.loadLocale(st.locale);
    document.title = experience.title;
    $("title").textContent = experience.title;
    $("kind").textContent = SH.t(`kind.${experience.kind}`);
    $("kind").className = `badge kind-${experience.kind}`;
    $("kind").hidden = false;
    document.body.dataset.kind = experience.kind;
    if (experience.kind === "score") {
      // A game: the score is what counts; the text is a word about it.
      $("prompt-label").textContent = SH.t("p.promptScore");
      $("prompt").placeholder = SH.t("p.promptScorePlaceholder");
    }

    $("view-form").addEventListener("submit", onSubmit);
    $("play-again").addEventListener("click", playAgain);
    $("try-again").addEventListener("click", tryAgain);
    $("start-over").addEventListener("click", startOver);
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && pollTimer) poll();
    });
    window.addEventListener("online", () => {
      if (pending() && !busy) run();
    });

    if (pending()) {
      // A request of an earlier visit never got its answer: send it again,
      // with its key.
      showForm();
      await run();
      return;
    }
    if (!st.session) {
      showForm();
      return;
    }
    // A session of an earlier visit: show where it stands. One opened for
    // another booth's terminal is left behind unless it is still running.
    try {
      const { data } = await SH.api(`/api/sessions/${encodeURIComponent(st.session.id)}`, {
        token: st.session.token,
      });
      if (terminalParam && terminalParam !== st.terminal_id && data.status !== "SUBMITTING") {
        forgetSession();
        persist();
        showForm();
        return;
      }
      if (data.status === "SUBMITTING") {
        startWaiting();
        return;
      }
      renderSession(data);
      if (data.status === "ABORTED") pollTimer = setTimeout(poll, ABORTED_POLL_MS);
    } catch (err) {
      if (err instanceof SH.ApiError && (err.status === 401 || err.status === 404)) {
        forgetSession();
        persist();
        showForm();
        return;
      }
      // No answer: assume it is still running and keep asking.
      startWaiting();
    }
  }

  init();
})();
