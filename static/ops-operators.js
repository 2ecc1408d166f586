// /ops: the operators (an admin's): each with its role, when it was
// created and revoked, and Revoke (after a confirm; revoking oneself says
// so); Create operator shows the new token once (the server keeps only a
// digest), with Copy.
import { $, call, enc, flash, send, submitForm } from "./ops-api.js";
import { ROLES, may, state } from "./ops-state.js";
import { fillAuditOperators } from "./ops-audit.js";

let operators = [];

export async function loadOperators() {
  if (!state.token || !may("admin")) return;
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
  fillAuditOperators(operators);
  if (!operators.length) {
    body.replaceChildren(SH.el("tr", {}, SH.el("td", { colspan: 5, class: "muted", text: SH.t("ops.operators.none") })));
    return;
  }
  body.replaceChildren(...operators.map(operatorRow));
}

function operatorRow(o) {
  const revoked = Boolean(o.revoked_at);
  const self = state.me && state.me.operator_id && state.me.operator_id === o.operator_id;
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

export function closeOperatorResult() {
  $("new-operator-result").hidden = true;
  $("new-operator-token").textContent = "";
  $("new-operator-text").textContent = "";
}

async function revokeOperator(o, button) {
  const self = state.me && state.me.operator_id && state.me.operator_id === o.operator_id;
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

// Signed out: the list goes.
export function clearOperators() {
  operators = [];
  $("operators").tBodies[0].replaceChildren();
}

export function initOperators() {
  $("new-operator").addEventListener("submit", onNewOperator);
  $("new-operator-copy").addEventListener("click", copyOperatorToken);
  $("new-operator-close").addEventListener("click", closeOperatorResult);
}
