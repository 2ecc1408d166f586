// /ops: mail to guests.
//
// The log of the newest mails (GET /api/admin/mails): when each was
// asked for, its experience, the address masked, its status, attempts
// and the mail server's last answer, filtered by status. A failed mail has
// a box to tick; "Retry selected" queues the ticked ones again
// (moderators and admins; a viewer reads). A note says when this server
// has no SMTP server (guests are then not offered mail). An admin edits
// the mail's subject and body in each language, or goes back to the
// built-in words. Read every 5 s while the dashboard shows (as the
// webhooks panel), every 1.5 s while a mail is being sent or due within
// seconds, and on Refresh. What needs a role (ops-state.js's `may`) is
// drawn only for a role that may use it.
import { $, call, enc } from "./ops-api.js";
import { may, state } from "./ops-state.js";

const STATUSES = ["QUEUED", "SENDING", "SENT", "FAILED", "CANCELED"];
// What the log can be filtered by (the API's statuses; "" is all).
const FILTERS = ["", "QUEUED", "SENT", "FAILED", "CANCELED"];
const LOCALE_NAMES = { en: "English", ko: "한국어" };
const REFRESH_MS = 5000;
const FOLLOW_MS = 1500;
// A queued mail due this soon is followed closely.
const SOON_MS = 15000;

// The failed mails ticked for "Retry selected".
const selected = new Set();
let mails = [];
let shown = "";
let loading = false;
let again = false;
let followTimer = null;
// The templates' forms by locale, once read (admins).
const templateForms = new Map();
let templatesRead = false;

const dashboardShown = () => {
  const d = $("dashboard");
  return Boolean(d && !d.hidden);
};

function note(text, isError) {
  const n = $("mail-note");
  if (!n) return;
  n.textContent = text || "";
  n.classList.toggle("error", Boolean(isError));
}

// ---- the log ------------------------------------------------------------------

function statusText(status) {
  const key = `ops.mail.status.${status}`;
  const text = SH.t(key);
  return text === key ? String(status || "") : text;
}

function reasonText(m) {
  const parts = [];
  if (m.last_error) parts.push(m.last_error);
  if (m.status === "QUEUED" && m.next_attempt_at && m.attempts > 0) {
    parts.push(SH.t("ops.mail.nextAttempt", { time: SH.fmtTime(m.next_attempt_at) }));
  }
  return parts.join(" · ");
}

function row(m, canRetry) {
  const status = STATUSES.includes(m.status) ? m.status : String(m.status || "");
  const id = String(m.email_id || "");
  let pick = null;
  if (canRetry) {
    pick = SH.el("td", { class: "select" });
    if (status === "FAILED") {
      const box = SH.el("input", {
        type: "checkbox",
        class: "mail-select",
        "aria-label": SH.t("ops.mail.selectOne", { address: m.address || "" }),
      });
      box.checked = selected.has(id);
      box.addEventListener("change", () => {
        if (box.checked) selected.add(id);
        else selected.delete(id);
        showRetryButton();
      });
      pick.append(box);
    }
  }
  return SH.el(
    "tr",
    { class: `mail mail-${status.toLowerCase().replace(/[^a-z]/g, "")}`, dataset: { emailId: id, status, sessionId: m.session_id || "" } },
    pick,
    SH.el("td", { class: "time", text: SH.fmtDateTime(m.created_at) }),
    SH.el("td", { class: "experience", text: m.experience || "" }),
    SH.el("td", { class: "address", text: m.address || SH.t("ops.mail.addressGone") }),
    SH.el("td", { class: "mail-status", text: statusText(status), title: m.sent_at ? SH.fmtDateTime(m.sent_at) : null }),
    SH.el("td", { class: "num attempts", text: String(m.attempts == null ? "" : m.attempts) }),
    SH.el("td", { class: "last-error", text: reasonText(m) }),
  );
}

function showRetryButton() {
  const b = $("mail-retry");
  if (!b) return;
  b.disabled = selected.size === 0;
  b.textContent = selected.size
    ? SH.t("ops.mail.retrySelectedN", { n: selected.size })
    : SH.t("ops.mail.retrySelected");
}

function render(data) {
  const table = $("mail-log");
  if (!table) return;
  $("mail-unavailable").hidden = data.available !== false;
  mails = Array.isArray(data.mails) ? data.mails : [];
  // A ticked mail that is no longer failed (retried elsewhere) is let go.
  for (const id of [...selected]) {
    if (!mails.some((m) => m.email_id === id && m.status === "FAILED")) selected.delete(id);
  }
  const canRetry = may("moderator");
  // Drawn again only when something changed: a box under the pointer
  // stays where it is.
  const key = JSON.stringify([canRetry, SH.locale(), mails]);
  if (key !== shown) {
    shown = key;
    table.tBodies[0].replaceChildren(...mails.map((m) => row(m, canRetry)));
  }
  $("mail-empty").hidden = mails.length > 0;
  showRetryButton();
}

function clear() {
  shown = "";
  mails = [];
  selected.clear();
  const table = $("mail-log");
  if (table) table.tBodies[0].replaceChildren();
  const list = $("mail-templates");
  if (list) list.replaceChildren();
  templateForms.clear();
  templatesRead = false;
  note("");
}

// Whether a mail in the log is being sent, or due within seconds.
function moving() {
  const now = Date.now();
  return mails.some((m) => m.status === "SENDING"
    || (m.status === "QUEUED" && (!m.next_attempt_at || Date.parse(m.next_attempt_at) - now < SOON_MS)));
}

async function load() {
  if (!state.token || !dashboardShown() || !$("mail-log")) return;
  if (loading) {
    again = true;
    return;
  }
  loading = true;
  clearTimeout(followTimer);
  followTimer = null;
  try {
    const status = $("mail-status-filter").value;
    const { data } = await call(`/api/admin/mails${status ? `?status=${enc(status)}` : ""}`);
    render(data || {});
  } catch (err) {
    note(SH.errorText(err), true);
  } finally {
    loading = false;
  }
  if (again) {
    again = false;
    load();
    return;
  }
  if (moving()) followTimer = setTimeout(load, FOLLOW_MS);
}

async function retrySelected() {
  const ids = [...selected];
  if (!ids.length || !may("moderator")) return;
  const b = $("mail-retry");
  b.disabled = true;
  try {
    const { data } = await call("/api/admin/mails/retry", { method: "POST", body: { email_ids: ids } });
    const retried = (data && data.retried) || [];
    for (const id of ids) selected.delete(id);
    note(retried.length ? SH.t("ops.mail.retried", { n: retried.length }) : SH.t("ops.mail.noneRetried"), !retried.length);
  } catch (err) {
    note(SH.errorText(err), true);
  }
  shown = "";
  await load();
}

// ---- the templates (admins) ---------------------------------------------------

function templateState(tpl) {
  return tpl.custom
    ? SH.t("ops.mail.custom", { time: SH.fmtDateTime(tpl.updated_at) })
    : SH.t("ops.mail.builtIn");
}

function fillTemplate(f, tpl) {
  f.form.elements.subject.value = tpl.subject || "";
  f.form.elements.body.value = tpl.body || "";
  f.state.textContent = templateState(tpl);
  f.reset.disabled = !tpl.custom;
  f.form.dataset.custom = String(Boolean(tpl.custom));
}

function templateMessage(f, text, isError) {
  f.error.textContent = isError ? text : "";
  f.error.hidden = !isError || !text;
  f.status.textContent = isError ? "" : text;
  f.status.hidden = isError || !text;
}

function templateForm(locale) {
  const f = { locale };
  f.state = SH.el("span", { class: "muted small template-state" });
  f.error = SH.el("p", { class: "error template-error", role: "alert", hidden: true });
  f.status = SH.el("p", { class: "muted small template-status", role: "status", hidden: true });
  f.reset = SH.el("button", { type: "button", class: "btn btn-small template-reset", text: SH.t("ops.mail.reset") });
  f.save = SH.el("button", { type: "submit", class: "btn btn-small btn-primary template-save", text: SH.t("ops.mail.save") });
  f.form = SH.el("form", { class: "form mail-template", dataset: { locale } },
    SH.el("h4", {}, `${LOCALE_NAMES[locale] || locale} `, f.state),
    SH.el("label", { class: "field" }, SH.el("span", { text: SH.t("ops.mail.subject") }),
      SH.el("input", { name: "subject", required: true, maxlength: "200", autocomplete: "off" })),
    SH.el("label", { class: "field" }, SH.el("span", { text: SH.t("ops.mail.body") }),
      SH.el("textarea", { name: "body", required: true, rows: "8", maxlength: "5000" })),
    f.error,
    f.status,
    SH.el("div", { class: "row" }, f.save, f.reset));
  f.form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    saveTemplate(f);
  });
  f.reset.addEventListener("click", () => resetTemplate(f));
  return f;
}

async function loadTemplates() {
  const list = $("mail-templates");
  if (!list || !state.token || !dashboardShown()) return;
  if (!may("admin")) {
    list.replaceChildren();
    templateForms.clear();
    templatesRead = false;
    return;
  }
  if (templatesRead) return;
  templatesRead = true;
  try {
    const { data } = await call("/api/admin/mail/templates");
    const templates = (data && data.templates) || [];
    for (const tpl of templates) {
      let f = templateForms.get(tpl.locale);
      if (!f) {
        f = templateForm(tpl.locale);
        templateForms.set(tpl.locale, f);
        list.append(f.form);
      }
      fillTemplate(f, tpl);
    }
  } catch (err) {
    templatesRead = false;
    note(SH.errorText(err), true);
  }
}

async function saveTemplate(f) {
  const subject = f.form.elements.subject.value.trim();
  const body = f.form.elements.body.value;
  if (!subject) {
    templateMessage(f, SH.t("ops.mail.needsSubject"), true);
    f.form.elements.subject.focus();
    return;
  }
  if (!body.includes("{link}")) {
    templateMessage(f, SH.t("ops.mail.needsLink"), true);
    f.form.elements.body.focus();
    return;
  }
  f.save.disabled = true;
  templateMessage(f, "", false);
  try {
    const { data } = await call(`/api/admin/mail/templates/${enc(f.locale)}`, { method: "PUT", body: { subject, body } });
    fillTemplate(f, data);
    templateMessage(f, SH.t("ops.mail.saved"), false);
  } catch (err) {
    templateMessage(f, SH.errorText(err), true);
  } finally {
    f.save.disabled = false;
  }
}

async function resetTemplate(f) {
  if (!window.confirm(SH.t("ops.mail.resetConfirm", { language: LOCALE_NAMES[f.locale] || f.locale }))) return;
  f.reset.disabled = true;
  try {
    const { data } = await call(`/api/admin/mail/templates/${enc(f.locale)}`, { method: "DELETE" });
    fillTemplate(f, data);
    templateMessage(f, SH.t("ops.mail.resetDone"), false);
  } catch (err) {
    f.reset.disabled = false;
    templateMessage(f, SH.errorText(err), true);
  }
}

// ---- start ------------------------------------------------------------------

// Started by ops-main.js once the page is parsed.
export function initMail() {
  const filter = $("mail-status-filter");
  if (!filter) return;
  filter.replaceChildren(...FILTERS.map((s) => SH.el("option", { value: s, text: s ? statusText(s) : SH.t("ops.mail.all") })));
  // A ticked mail the filter hides is let go when the log is drawn.
  filter.addEventListener("change", () => load());
  $("mail-filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    shown = "";
    load();
  });
  $("mail-retry").addEventListener("click", retrySelected);
  const dashboard = $("dashboard");
  if (dashboard) {
    // Shown (signed in): read it all; hidden (signed out): what the last
    // operator saw goes.
    new MutationObserver(() => {
      if (dashboard.hidden) {
        clear();
        return;
      }
      load();
      loadTemplates();
    }).observe(dashboard, { attributes: true, attributeFilter: ["hidden"] });
  }
  // The role became known or changed: drawn again for it.
  new MutationObserver(() => {
    shown = "";
    if (!may("admin")) templatesRead = false;
    load();
    loadTemplates();
  }).observe(document.body, { attributes: true, attributeFilter: ["data-role"] });
  // The language table arrives after this script starts: the filter's
  // words follow it.
  new MutationObserver(() => {
    for (const o of filter.options) o.textContent = o.value ? statusText(o.value) : SH.t("ops.mail.all");
    shown = "";
    if (mails.length) render({ mails, available: $("mail-unavailable").hidden });
  }).observe(document.documentElement, { attributes: true, attributeFilter: ["lang"] });
  load();
  loadTemplates();
  setInterval(load, REFRESH_MS);
}
