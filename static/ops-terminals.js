// /ops: the terminals (the booth displays): each with its QR code (the
// participant's link for that terminal), whether it is online and since
// when, and what it has not acknowledged yet; live from the socket's stats,
// from the HTTP list before the socket speaks. An admin creates one: its
// link (with its token, shown once), a Copy button and its QR code.
import { $, call, enc, submitForm } from "./ops-api.js";
import { state } from "./ops-state.js";

let terminals = [];

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
export async function loadTerminals() {
  let all;
  try {
    const { data } = await call("/api/terminals");
    all = (data && data.terminals) || [];
  } catch (_) {
    return;
  }
  if (!state.heard) {
    terminals = all;
    renderTerminals();
  }
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
  if (!state.heard) loadTerminals();
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

export function closeTerminalResult() {
  $("new-terminal-result").hidden = true;
  $("new-terminal-link").textContent = "";
  $("new-terminal-link").removeAttribute("href");
}

// The socket's list.
export function showTerminals(list) {
  terminals = list;
  renderTerminals();
}

export function initTerminals() {
  $("new-terminal").addEventListener("submit", onNewTerminal);
  $("new-terminal-copy").addEventListener("click", copyLink);
  $("new-terminal-close").addEventListener("click", closeTerminalResult);
}
