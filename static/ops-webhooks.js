// /ops: the organiser's webhook endpoints.
//
// Each endpoint with the events it takes and whether it is sent to: a
// disabled one (it kept failing) is an alert, with Enable; one failing
// now says since when. "Log" opens its deliveries (newest first: the
// event, status, attempts, the last answer and its latency) with
// Redeliver. An admin adds an endpoint (the URL, the events) and is shown
// its secret this once, and removes one. Read every 5 s while the
// dashboard shows (the endpoints change rarely; a delivery's outcome
// shows within that).
import { $, call, enc } from "./ops-api.js";
import { may, state } from "./ops-state.js";

const EVENTS = ["session.completed", "session.rejected", "session.removed", "print.completed", "email.sent", "email.failed"];
let open = null; // the endpoint whose log is shown

function note(text, isError) {
  const n = $("webhooks-note");
  if (!n) return;
  n.textContent = text || "";
  n.classList.toggle("error", !!isError);
}

function stateOf(w) {
  if (!w.enabled) return SH.t("ops.webhookDisabled", { reason: w.disabled_reason || "" });
  if (w.failing_since) return SH.t("ops.webhookFailing", { since: SH.fmtDateTime(w.failing_since) });
  return SH.t("ops.webhookOk");
}

function render(list) {
  const ul = $("webhooks");
  if (!ul) return;
  if (!list.length) {
    ul.replaceChildren(SH.el("li", { class: "muted", text: SH.t("ops.noWebhooks") }));
    return;
  }
  ul.replaceChildren(...list.map((w) => SH.el(
    "li",
    { class: `webhook ${w.enabled ? (w.failing_since ? "webhook-failing" : "webhook-ok") : "webhook-disabled"}`, "data-webhook": w.webhook_id },
    SH.el("strong", { class: "webhook-url", text: w.url }),
    SH.el("span", { class: "webhook-state", text: ` ${stateOf(w)}` }),
    SH.el("div", { class: "muted small", text: w.events.join(", ") }),
    SH.el("button", { type: "button", class: "btn btn-small action-log", text: SH.t("ops.webhookLog"), onclick: () => showLog(w.webhook_id) }),
    !w.enabled && may("admin")
      ? SH.el("button", { type: "button", class: "btn btn-small action-enable", text: SH.t("ops.webhookEnable"), onclick: () => enable(w) })
      : "",
    may("admin")
      ? SH.el("button", { type: "button", class: "btn btn-small btn-danger action-remove", text: SH.t("ops.webhookRemove"), onclick: () => remove(w) })
      : "",
  )));
}

async function load() {
  if (!state.token || $("dashboard").hidden) return;
  try {
    const { data } = await call("/api/admin/webhooks");
    render((data && data.webhooks) || []);
    if (open) await showLog(open);
  } catch (err) {
    note(SH.errorText(err), true);
  }
}

async function showLog(id) {
  open = id;
  const table = $("webhook-log");
  try {
    const { data } = await call(`/api/admin/webhooks/${enc(id)}/deliveries`);
    const rows = (data.deliveries || []).map((d) => SH.el(
      "tr",
      { class: `delivery delivery-${String(d.status).toLowerCase()}`, dataset: { delivery: d.delivery_id } },
      SH.el("td", { class: "time", text: SH.fmtDateTime(d.created_at) }),
      SH.el("td", { text: d.event }),
      SH.el("td", { class: "delivery-status", text: d.status }),
      SH.el("td", { text: String(d.attempts) }),
      SH.el("td", { text: [d.last_status, d.last_error].filter((x) => x != null && x !== "").join(" · ") }),
      SH.el("td", { text: d.last_latency_ms == null ? "" : `${d.last_latency_ms} ms` }),
      SH.el("td", {}, may("moderator")
        ? SH.el("button", { type: "button", class: "btn btn-small action-redeliver", text: SH.t("ops.redeliver"), onclick: () => redeliver(id, d) })
        : ""),
    ));
    table.tBodies[0].replaceChildren(...rows);
    $("webhook-log-title").textContent = SH.t("ops.webhookLogOf", { url: data.webhook.url });
    $("webhook-log-box").hidden = false;
  } catch (err) {
    note(SH.errorText(err), true);
  }
}

async function redeliver(id, d) {
  try {
    await call(`/api/admin/webhooks/${enc(id)}/deliveries/${enc(d.delivery_id)}/redeliver`, { method: "POST" });
    note(SH.t("ops.redelivered"));
    await showLog(id);
  } catch (err) {
    note(SH.errorText(err), true);
  }
}

async function enable(w) {
  try {
    await call(`/api/admin/webhooks/${enc(w.webhook_id)}/enable`, { method: "POST" });
    await load();
  } catch (err) {
    note(SH.errorText(err), true);
  }
}

async function remove(w) {
  if (!window.confirm(SH.t("ops.webhookRemoveConfirm", { url: w.url }))) return;
  try {
    await call(`/api/admin/webhooks/${enc(w.webhook_id)}`, { method: "DELETE" });
    if (open === w.webhook_id) {
      open = null;
      $("webhook-log-box").hidden = true;
    }
    await load();
  } catch (err) {
    note(SH.errorText(err), true);
  }
}

async function add(ev) {
  ev.preventDefault();
  const form = ev.target;
  const events = EVENTS.filter((e) => form.querySelector(`input[value="${e}"]`).checked);
  try {
    const { data } = await call("/api/admin/webhooks", { method: "POST", body: { url: form.url.value.trim(), events } });
    form.reset();
    $("webhook-secret").textContent = data.secret;
    $("webhook-secret-box").hidden = false;
    note(SH.t("ops.webhookAdded"));
    await load();
  } catch (err) {
    note(SH.errorText(err), true);
  }
}

// Started by ops-main.js once the page is parsed.
export function initWebhooks() {
  const boxes = $("webhook-events");
  if (boxes) {
    boxes.replaceChildren(...EVENTS.map((e) => SH.el("label", { class: "check" },
      SH.el("input", { type: "checkbox", name: "events", value: e, checked: e === "session.completed" }), ` ${e}`)));
  }
  const form = $("new-webhook");
  if (form) form.addEventListener("submit", add);
  const dashboard = $("dashboard");
  if (dashboard) {
    new MutationObserver(() => load()).observe(dashboard, { attributes: true, attributeFilter: ["hidden"] });
  }
  load();
  setInterval(load, 5000);
}
