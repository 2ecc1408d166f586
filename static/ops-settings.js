// /ops: an experience's live settings (an admin's), edited in place under
// it in the list: the title, max_in_flight, the AI provider and its
// weight, credits, when it closes (Close now, Reopen), review, the
// language, the gallery and its PIN, and how long photos and results are
// kept. Saving sends only the changed fields (PATCH, with an
// Idempotency-Key), after a confirm before what stops people: closing now,
// or a max_in_flight below the AI jobs running now. A field the operator
// changed keeps what they typed when the server's values arrive.
import { enc, flash, newKey, send } from "./ops-api.js";
import { state } from "./ops-state.js";

// The fields the editor shows, as the PATCH names them.
const EDIT_FIELDS = ["title", "max_in_flight", "provider", "weight", "credits", "credits_add", "closes_at",
  "review", "review_timeout", "locale", "gallery", "gallery_pin", "photo_retention", "retention"];
const NUMBER_FIELDS = ["max_in_flight", "weight", "credits", "credits_add"];
// A closing time this close (or past) stops people now: it asks first.
const CLOSE_NOW_MS = 60000;

// The editor of `slug`'s settings; `replace(e, redraw)` puts what the
// server saved into the list.
export function experienceEditor(slug, replace) {
  const ed = { slug, shown: {}, exp: null, saving: false, replace };
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

export function fillEditorProviders(ed) {
  const select = ed.form.elements.provider;
  const was = select.value || (ed.shown.provider ?? "");
  const names = [...state.providerNames];
  if (was && !names.includes(was)) names.push(was);
  select.replaceChildren(...names.map((n) => SH.el("option", { value: n, text: n })));
  if (was) select.value = was;
}

// Shows `e`'s values; with `keepEdits`, a field the operator changed
// keeps what they typed.
export function fillEditor(ed, e, keepEdits) {
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

export function editorMessage(ed, text, isError) {
  ed.error.textContent = isError ? text : "";
  ed.error.hidden = !isError || !text;
  ed.status.textContent = isError ? "" : text;
  ed.status.hidden = isError || !text;
}

function runningOf(slug) {
  return state.running.has(slug) ? state.running.get(slug) : 0;
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
    ed.replace(saved, true);
    editorMessage(ed, SH.t("ops.edit.saved", { fields: Object.keys(body).join(", ") }), false);
    flash(SH.t("ops.edit.savedFlash", { slug: ed.slug }));
  } catch (err) {
    editorMessage(ed, SH.errorText(err), true);
  } finally {
    ed.saving = false;
    for (const b of ed.form.querySelectorAll("button")) b.disabled = false;
  }
}
