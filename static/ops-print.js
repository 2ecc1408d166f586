// /ops: the print stations and the event's brand.
//
// Printers come live over the operators' socket (the `print.printers`
// frame, which ops-socket.js hands to renderPrinters): each
// printer's state and the reason that holds its queue (out of paper, a
// jam, offline), and the open prints with Cancel (while no printer has
// them), Approve (a guest's print waiting for review) and Reprint. An
// admin adds a printer (it is asked what it takes, and refused with the
// reason), uploads the brand's overlay and logo, and previews the brand
// on a sample before the event. The buttons drawn here come after
// ops-roles.js hid the [data-needs] ones, so they are drawn only for a
// role that may use them.
import { $, call, enc, newKey } from "./ops-api.js";
import { may, state } from "./ops-state.js";

function note(id, text, isError) {
  const n = $(id);
  if (!n) return;
  n.textContent = text || "";
  n.classList.toggle("error", !!isError);
}

function errorText(err) {
  return (err && (err.message || err.code)) || String(err);
}

// ---- printers ---------------------------------------------------------------

function stateText(printer) {
  if (printer.waiting_because) return printer.waiting_because;
  return SH.t(`ops.printerState.${printer.state}`, {}) || printer.state;
}

export function renderPrinters(frame) {
  const list = $("printers");
  if (!list) return;
  const printers = frame.printers || [];
  list.replaceChildren(
    ...printers.map((p) => {
      const held = !!p.waiting_because;
      return SH.el(
        "li",
        { class: `printer ${held ? "printer-held" : "printer-ok"}`, "data-printer": p.printer_id },
        SH.el("strong", { text: p.name }),
        SH.el("span", { class: "printer-state", text: ` ${stateText(p)}` }),
        SH.el("span", { class: "muted small", text: ` · ${p.media} · ${p.dpi} dpi · ${SH.t("ops.printerQueued", { n: p.queued })}` }),
        p.state_reasons && p.state_reasons.length
          ? SH.el("div", { class: "muted small", text: p.state_reasons.join(", ") })
          : "",
        may("admin")
          ? SH.el("button", { type: "button", class: "btn btn-small", text: SH.t("ops.removePrinter"), onclick: () => removePrinter(p) })
          : "",
      );
    }),
  );
  if (!printers.length) list.replaceChildren(SH.el("li", { class: "muted", text: SH.t("ops.noPrinters") }));
  renderQueue(frame.prints || []);
}

function renderQueue(prints) {
  const list = $("print-queue");
  if (!list) return;
  if (!prints.length) {
    list.replaceChildren(SH.el("li", { class: "muted", text: SH.t("ops.printQueueEmpty") }));
    return;
  }
  list.replaceChildren(
    ...prints.map((p) =>
      SH.el(
        "li",
        { class: `print print-${p.status.toLowerCase()}`, "data-print": p.print_id },
        SH.el("span", { class: "print-status", text: p.status }),
        SH.el("span", { text: ` ${p.experience || ""} · ${p.requested_by}` }),
        p.reason ? SH.el("span", { class: "print-reason", text: ` · ${p.reason}` }) : "",
        p.awaiting_review && may("moderator")
          ? SH.el("button", { type: "button", class: "btn btn-small", text: SH.t("ops.approvePrint"), onclick: () => decide(p, "approve") })
          : "",
        p.status === "QUEUED" && may("moderator")
          ? SH.el("button", { type: "button", class: "btn btn-small", text: SH.t("ops.cancelPrint"), onclick: () => decide(p, "cancel") })
          : "",
        may("moderator")
          ? SH.el("button", { type: "button", class: "btn btn-small", text: SH.t("ops.reprint"), onclick: () => reprint(p) })
          : "",
      ),
    ),
  );
}

async function loadPrinters() {
  if (!state.token) return;
  try {
    const { data } = await call("/api/admin/printers");
    renderPrinters(data);
  } catch (err) {
    note("printers-note", errorText(err), true);
  }
}

async function decide(print, action) {
  try {
    await call(`/api/admin/prints/${enc(print.print_id)}/${action}`, { method: "POST" });
    loadPrinters();
  } catch (err) {
    note("printers-note", errorText(err), true);
  }
}

async function reprint(print) {
  try {
    await call(`/api/admin/sessions/${enc(print.session_id)}/print`, { method: "POST", key: newKey() });
    note("printers-note", SH.t("ops.reprinted"));
    loadPrinters();
  } catch (err) {
    note("printers-note", errorText(err), true);
  }
}

async function removePrinter(printer) {
  if (!window.confirm(SH.t("ops.removePrinterConfirm", { name: printer.name }))) return;
  try {
    await call(`/api/admin/printers/${enc(printer.printer_id)}`, { method: "DELETE" });
    loadPrinters();
  } catch (err) {
    note("printers-note", errorText(err), true);
  }
}

async function addPrinter(ev) {
  ev.preventDefault();
  const form = ev.target;
  const experiences = form.experiences.value.split(",").map((s) => s.trim()).filter(Boolean);
  note("printers-note", SH.t("ops.addingPrinter"));
  try {
    await call("/api/admin/printers", {
      method: "POST",
      body: { name: form.name.value, uri: form.uri.value, media: form.media.value, experiences },
    });
    form.reset();
    note("printers-note", SH.t("ops.printerAdded"));
    loadPrinters();
  } catch (err) {
    note("printers-note", errorText(err), true);
  }
}

// ---- the brand --------------------------------------------------------------

async function loadBrandExperiences() {
  const select = $("brand-experience");
  if (!select || !state.token) return;
  try {
    const { data } = await call("/api/experiences");
    const list = Array.isArray(data) ? data : data.experiences || [];
    const chosen = select.value;
    select.replaceChildren(...list.map((e) => SH.el("option", { value: e.slug, text: `${e.title} (${e.slug})` })));
    if (chosen) select.value = chosen;
  } catch (_) {
    // The experiences card says why; this one waits for the next try.
  }
}

async function upload(slug, part, file) {
  const res = await fetch(`/api/admin/experiences/${enc(slug)}/brand/${part}`, {
    method: "PUT",
    headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "image/png" },
    body: file,
  });
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(data.message || `${res.status}`);
  return data;
}

async function uploadBrand(ev) {
  ev.preventDefault();
  const form = ev.target;
  const slug = form.experience.value;
  try {
    for (const part of ["overlay", "logo"]) {
      const file = form[part].files[0];
      if (file) {
        const size = await upload(slug, part, file);
        note("brand-note", SH.t("ops.brandTaken", { part, w: size.width, h: size.height }));
      }
    }
    await preview();
  } catch (err) {
    note("brand-note", errorText(err), true);
  }
}

async function preview() {
  const slug = $("brand-experience").value;
  const img = $("brand-preview");
  try {
    const res = await fetch(`/api/admin/experiences/${enc(slug)}/brand/preview`, {
      method: "POST",
      headers: { Authorization: `Bearer ${state.token}` },
    });
    if (!res.ok) {
      const data = await res.json().catch(() => ({}));
      throw new Error(data.message || `${res.status}`);
    }
    // As a data: URL: the pages' Content-Security-Policy takes no blob: images.
    const blob = await res.blob();
    img.src = await new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(blob);
    });
    img.hidden = false;
    note("brand-note", SH.t("ops.brandPreviewShown"));
  } catch (err) {
    img.hidden = true;
    note("brand-note", errorText(err), true);
  }
}

// Started by ops-main.js once the page is parsed.
export function initPrint() {
  const form = $("new-printer");
  if (form) form.addEventListener("submit", addPrinter);
  const brand = $("brand-form");
  if (brand) brand.addEventListener("submit", uploadBrand);
  const button = $("brand-preview-button");
  if (button) button.addEventListener("click", preview);
  loadPrinters();
  loadBrandExperiences();
  // Signing in shows the dashboard: read them then (at load this tab had
  // no token yet, and the brand form's experiences would stay empty
  // until the slow refresh below).
  const dashboard = $("dashboard");
  if (dashboard) {
    let shown = !dashboard.hidden;
    new MutationObserver(() => {
      if (!dashboard.hidden && !shown) {
        loadPrinters();
        loadBrandExperiences();
      }
      shown = !dashboard.hidden;
    }).observe(dashboard, { attributes: true, attributeFilter: ["hidden"] });
  }
  // The experiences change rarely; the list follows them slowly.
  setInterval(loadBrandExperiences, 15000);
}
