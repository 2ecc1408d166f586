// /ops: the experiences. The list (each with its kind, when it closes,
// its participant link and PIN gallery, what it holds with Export, and an
// admin's Edit button opening its live settings editor in place), the
// experience choices of the other panels' selects, and the New experience
// form (with the AI providers' names as its provider choices).
import { $, call, enc, flash, submitForm } from "./ops-api.js";
import { may, state } from "./ops-state.js";
import { guestsBlock, loadAllHeld } from "./ops-guests.js";
import { renderReviewHead } from "./ops-review.js";
import { editorMessage, experienceEditor, fillEditor, fillEditorProviders } from "./ops-settings.js";

// The experiences' editors, by slug, kept across redraws of the list.
const editors = new Map();

export async function loadExperiences() {
  try {
    const { data } = await call("/api/experiences");
    state.experiences = (data && data.experiences) || [];
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

export function renderExperienceList() {
  if (!state.token) return;
  // The review queue shows when any experience reviews its results.
  renderReviewHead();
  for (const slug of [...editors.keys()]) {
    if (!may("admin") || !state.experiences.some((e) => e.slug === slug)) editors.delete(slug);
  }
  $("experience-list").replaceChildren(
    ...(state.experiences.length
      ? state.experiences.map((e) =>
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
      ...state.experiences.map((e) => SH.el("option", { value: e.slug, text: `${e.title} (${e.slug})` })));
    if ([...select.options].some((o) => o.value === was)) select.value = was;
  };
  fill($("f-experience"), true);
  fill($("new-terminal").elements.experience, false);
  fill($("g-experience"), true);
}

// ---- the live settings editors (ops-settings.js), in place -----------------

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
  const e = state.experiences.find((x) => x.slug === slug);
  if (!e) return;
  let ed = editors.get(slug);
  if (ed && !ed.root.hidden) {
    ed.root.hidden = true;
  } else {
    if (!ed) {
      ed = experienceEditor(slug, replaceExperience);
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

// An experience as the server now has it, in the list (and, with
// `redraw`, drawn again).
function replaceExperience(e, redraw) {
  const i = state.experiences.findIndex((x) => x.slug === e.slug);
  if (i < 0) return;
  const before = JSON.stringify(state.experiences[i]);
  state.experiences[i] = e;
  if (redraw || before !== JSON.stringify(e)) {
    renderExperienceList();
    loadAllHeld();
  }
}

// ---- new experience ---------------------------------------------------------

// The new-experience form's provider choices.
function fillProviderSelect() {
  const select = $("new-experience").elements.provider;
  const was = select.value;
  select.replaceChildren(...state.providerNames.map((n) => SH.el("option", { value: n, text: n })));
  if (state.providerNames.includes(was)) select.value = was;
  else if (state.providerNames.includes("default")) select.value = "default";
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

// The AI providers' names changed: the forms' provider choices follow.
export function providersChanged() {
  fillProviderSelect();
  for (const ed of editors.values()) fillEditorProviders(ed);
}

// Signed out: the list and its editors go.
export function clearExperiences() {
  state.experiences = [];
  editors.clear();
  $("experience-list").replaceChildren();
}

export function initExperiences() {
  $("new-experience").addEventListener("submit", onNewExperience);
}
