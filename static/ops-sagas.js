// /ops: the sagas table: filtered by step, reason and experience, a search
// (nickname, id), "stuck only", 50 at a time with Load more. It follows
// the live figures (reloaded when the socket reports a change, at most
// once a second) and is redrawn only when something changed. An admin's
// Retry (an aborted saga) and Cancel take two clicks; "Retry all AI failed
// of the last hour" shows its dry run's count first.
import { $, call, enc, flash, post } from "./ops-api.js";
import { may, state } from "./ops-state.js";
import { REASONS, STEPS } from "./ops-figures.js";

const FINAL = ["COMPLETED", "ABORTED"];
const SAGA_PAGE = 50;
// The sagas table follows the live figures: reloaded when the socket
// reports a change, at most once per this period (and once more at its
// end, so the last change always shows).
const AUTO_REFRESH_MS = 1000;

let sagas = [];
let sagasCursor = null;
let sagasPaged = false;
let sagasLoading = false;
let sagasAgain = false;
let sagasLoadedAt = 0;
let sagasShown = "";
let followTimer = null;
let lastRecent = "";
// The filter of the armed "retry all AI failed" button (its dry run's).
let retryFailedArmed = null;
let qTimer = null;

// Whether more than the first page is shown (the table then stays put).
export function sagasPagedNow() {
  return sagasPaged;
}

// The next render draws the table even when nothing changed.
export function forgetSagasShown() {
  sagasShown = "";
}

// Drawn again (for a role that changed: its buttons).
export function redrawSagas() {
  sagasShown = "";
  renderSagas();
}

// The first page read again and drawn.
function reloadSagas() {
  sagasShown = "";
  loadSagas();
}

// Signed out: the table goes.
export function clearSagas() {
  $("sagas").tBodies[0].replaceChildren();
  sagasShown = "";
}

// A stats frame's recent activity: the table follows when a saga changed.
export function followRecent(list) {
  const recent = JSON.stringify(list.map((r) => [r.saga_id, r.step, r.updated_at, r.stuck]));
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
    if (state.token && !sagasPaged) loadSagas();
  }, wait);
}

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
export async function loadSagas(more) {
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

export function initSagas() {
  const opts = (values, prefix) => [
    SH.el("option", { value: "", text: SH.t("ops.filter.any") }),
    ...values.map((v) => SH.el("option", { value: v, text: SH.t(`${prefix}.${v}`) })),
  ];
  $("f-step").replaceChildren(...opts(STEPS, "step"));
  $("f-reason").replaceChildren(...opts(REASONS, "reason"));
  $("f-experience").replaceChildren(SH.el("option", { value: "", text: SH.t("ops.filter.any") }));
  $("saga-filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    reloadSagas();
  });
  for (const id of ["f-step", "f-reason", "f-experience"]) $(id).addEventListener("change", reloadSagas);
  $("f-stuck").addEventListener("change", renderSagas);
  $("f-q").addEventListener("input", () => {
    clearTimeout(qTimer);
    qTimer = setTimeout(reloadSagas, 250);
  });
  $("retry-failed").addEventListener("click", retryFailed);
  $("sagas-more").addEventListener("click", () => loadSagas(true));
}
