// /ops: the audit log (an admin's): who did what to what, newest first,
// the first page read every 2 s (new entries go on top of what is shown),
// More for older ones, narrowed by operator and by action. Every server
// string is shown as text.
import { $, call } from "./ops-api.js";
import { ROLES, may, state } from "./ops-state.js";

// Newest first, the first page read every 2 s.
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

// The operator filter's choices: `operators` (the operators panel's list).
export function fillAuditOperators(operators) {
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

export function startAudit() {
  if (!may("admin")) return;
  const loop = ++auditLoop;
  clearTimeout(auditTimer);
  const tick = async () => {
    auditTimer = null;
    if (loop !== auditLoop || !state.token || !may("admin")) return;
    await auditRun(refreshAudit);
    if (loop === auditLoop) auditTimer = setTimeout(tick, AUDIT_MS);
  };
  tick();
}

export function stopAudit() {
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
  if (!state.token || !may("admin")) return;
  const gen = auditGen;
  let data;
  try {
    ({ data } = await call(auditQuery(null)));
  } catch (err) {
    if (gen === auditGen) auditNote(SH.errorText(err));
    return;
  }
  if (gen !== auditGen || !state.token) return;
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
  if (!state.token || !auditNext) return;
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

// Signed out: the log goes.
export function clearAudit() {
  auditItems = [];
  auditNext = null;
  auditPaged = false;
  auditShown = "";
  $("audit").tBodies[0].replaceChildren();
  $("audit-more").hidden = true;
}

export function initAudit() {
  $("a-action").replaceChildren(
    SH.el("option", { value: "", text: SH.t("ops.filter.any") }),
    ...AUDIT_ACTIONS.map((a) => SH.el("option", { value: a, text: a })));
  fillAuditOperators([]);
  $("a-operator").addEventListener("change", resetAudit);
  $("a-action").addEventListener("change", resetAudit);
  $("audit-filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    resetAudit();
  });
  $("audit-more").addEventListener("click", () => auditRun(moreAudit));
}
