// /ops: the AI providers, read every 2 s: each provider's slots in use
// against its cap, its queue, its rate limit, its breaker (Pause for a
// while, two clicks, and Resume: an admin's), why the breaker is open
// (out of quota: staff must act), models whose shutdown the vendor has
// announced, and its experiences with their weights and shares. Each card
// is updated in place, so that a button is never replaced under the
// pointer.
import { $, call, enc, flash } from "./ops-api.js";
import { may, state } from "./ops-state.js";
import { providersChanged } from "./ops-experiences.js";

// The providers section (slots, queues, breakers) is read this often.
const PROVIDERS_MS = 2000;
// How long the Pause button keeps a provider's breaker open (seconds);
// Resume closes it at any time.
const PAUSE_CHOICES = [30, 300, 1800, 3600];

let providersTimer = null;
let providersLoading = false;
// The card of each provider, by name, updated in place so that a button
// is never replaced under the pointer.
const providerCards = new Map();

// Signed in: read now and every PROVIDERS_MS.
export function startProviders() {
  loadProviders();
  clearInterval(providersTimer);
  providersTimer = setInterval(loadProviders, PROVIDERS_MS);
}

export function stopProviders() {
  clearInterval(providersTimer);
  providersTimer = null;
}

// Signed out: the cards go.
export function clearProviders() {
  for (const card of providerCards.values()) card.root.remove();
  providerCards.clear();
}

// The buttons, drawn again for a role that changed.
export function redrawBreakers() {
  for (const card of providerCards.values()) {
    if (card.root.dataset.breaker) showBreaker(card, card.root.dataset.breaker);
  }
}

async function loadProviders() {
  if (!state.token || providersLoading) return;
  providersLoading = true;
  try {
    const { data } = await call("/api/admin/providers");
    const list = (data && data.providers) || [];
    $("providers-note").hidden = true;
    renderProviders(list);
  } catch (err) {
    if (err instanceof SH.ApiError && err.status === 404) {
      // A server without providers: no section.
      $("providers-section").hidden = true;
      clearInterval(providersTimer);
      providersTimer = null;
      return;
    }
    // What was shown stays; a note says it is not current.
    $("providers-note").textContent = SH.errorText(err);
    $("providers-note").hidden = false;
  } finally {
    providersLoading = false;
  }
}

function renderProviders(list) {
  $("providers-section").hidden = false;
  for (const p of list) {
    for (const e of p.experiences || []) {
      if (e && e.slug) state.running.set(e.slug, Number(e.in_flight) || 0);
    }
  }
  const names = list.map((p) => p.name);
  if (names.join("\n") !== state.providerNames.join("\n")) {
    state.providerNames = names;
    providersChanged();
  }
  for (const name of [...providerCards.keys()]) {
    if (!names.includes(name)) {
      providerCards.get(name).root.remove();
      providerCards.delete(name);
    }
  }
  if (!list.length) {
    $("providers").replaceChildren(SH.el("li", { class: "muted", text: SH.t("ops.noProviders") }));
    return;
  }
  const cards = list.map((p) => {
    let card = providerCards.get(p.name);
    if (!card) {
      card = providerCard(p.name);
      providerCards.set(p.name, card);
    }
    updateProviderCard(card, p);
    return card.root;
  });
  // Keep the order of the list; moving a node keeps its state.
  const ul = $("providers");
  if ([...ul.children].some((n, i) => n !== cards[i]) || ul.children.length !== cards.length) {
    ul.replaceChildren(...cards);
  }
}

function providerCard(name) {
  const c = {};
  c.name = SH.el("strong", { class: "provider-name", text: name });
  c.kind = SH.el("span", { class: "badge" });
  c.breaker = SH.el("span", { class: "breaker-badge" });
  c.inFlight = SH.el("span", { class: "value" });
  c.cap = SH.el("span", { class: "label" });
  c.queued = SH.el("span", { class: "value" });
  c.rate = SH.el("span", { class: "value rate" });
  c.bar = SH.el("span");
  c.barBox = SH.el("div", { class: "bar" }, c.bar);
  c.pauseFor = SH.el("select", { class: "pause-for", "aria-label": SH.t("ops.breaker.for") },
    ...PAUSE_CHOICES.map((sec) => SH.el("option", { value: sec, text: durationText(sec) })));
  c.pauseFor.value = "300";
  c.open = SH.el("button", { type: "button", class: "btn btn-small breaker-open", text: SH.t("ops.breaker.pause") });
  c.close = SH.el("button", { type: "button", class: "btn btn-small breaker-close", text: SH.t("ops.breaker.resume") });
  c.rows = SH.el("tbody");
  // Why the breaker is open (out of quota: staff must act), and models
  // whose shutdown the vendor has announced.
  c.reason = SH.el("p", { class: "breaker-reason", role: "status", hidden: true });
  c.models = SH.el("ul", { class: "model-notices", hidden: true });
  c.root = SH.el("li", { class: "provider-card", dataset: { provider: name } },
    SH.el("div", { class: "provider-head" }, c.name, " ", c.kind, " ", c.breaker),
    c.reason,
    c.models,
    SH.el("div", { class: "provider-figures" },
      SH.el("div", { class: "tile in-flight" }, c.inFlight, c.cap),
      SH.el("div", { class: "tile queued" }, c.queued, SH.el("span", { class: "label", text: SH.t("ops.provider.queued") })),
      SH.el("div", { class: "tile rate-limit" }, c.rate, SH.el("span", { class: "label", text: SH.t("ops.provider.rateLimit") }))),
    c.barBox,
    (c.actions = SH.el("div", { class: "provider-actions" }, c.open, c.pauseFor, c.close)),
    SH.el("div", { class: "table-wrap" },
      SH.el("table", { class: "provider-experiences" },
        SH.el("thead", {}, SH.el("tr", {},
          SH.el("th", { text: SH.t("ops.col.experience") }),
          SH.el("th", { class: "num", text: SH.t("ops.col.weight") }),
          SH.el("th", { class: "num", text: SH.t("ops.col.inFlight") }),
          SH.el("th", { class: "num", text: SH.t("ops.col.queued") }),
          SH.el("th", { class: "num", text: SH.t("ops.col.share") }))),
        c.rows)));
  // Pausing stops every experience on the provider: two clicks, like
  // Cancel. Resuming takes one.
  let armTimer = null;
  c.open.addEventListener("click", () => {
    if (!c.open.classList.contains("armed")) {
      c.open.classList.add("armed");
      c.open.textContent = SH.t("ops.breaker.confirmPause");
      armTimer = setTimeout(() => {
        c.open.classList.remove("armed");
        c.open.textContent = SH.t("ops.breaker.pause");
      }, 4000);
      return;
    }
    clearTimeout(armTimer);
    c.open.classList.remove("armed");
    c.open.textContent = SH.t("ops.breaker.pause");
    breakerAction(c, name, "open", { for_seconds: Number(c.pauseFor.value) || 300 });
  });
  c.close.addEventListener("click", () => breakerAction(c, name, "close", undefined));
  return c;
}

function durationText(sec) {
  return sec < 60 ? SH.t("ops.seconds", { n: sec }) : SH.t("ops.minutes", { n: Math.round(sec / 60) });
}

async function breakerAction(card, name, action, body) {
  card.open.disabled = true;
  card.close.disabled = true;
  try {
    const { data } = await call(`/api/admin/breaker/${action}?provider=${enc(name)}`, { method: "POST", body, key: SH.uuid() });
    if (data && data.state) showBreaker(card, data.state);
    flash(SH.t(`ops.breaker.done.${action}`, { name }));
  } catch (err) {
    flash(SH.errorText(err), true);
  } finally {
    card.open.disabled = false;
    card.close.disabled = false;
  }
  loadProviders();
}

function showBreaker(card, breaker) {
  const known = ["closed", "open", "probing"].includes(breaker) ? breaker : "open";
  card.root.dataset.breaker = known;
  card.breaker.dataset.state = known;
  card.breaker.textContent = SH.t(`ops.breaker.${known}`);
  card.breaker.title = SH.t(`ops.breaker.${known}.help`);
  // Closed: it can be paused; open or probing: it can be resumed (by an
  // admin: others see no buttons).
  const admin = may("admin");
  card.open.hidden = !admin || known !== "closed";
  card.pauseFor.hidden = !admin || known !== "closed";
  card.close.hidden = !admin || known === "closed";
  card.actions.hidden = !admin;
}

function updateProviderCard(c, p) {
  c.kind.textContent = p.kind || "";
  c.kind.hidden = !p.kind;
  showBreaker(c, p.breaker);
  c.reason.textContent = p.reason || "";
  c.reason.hidden = !p.reason;
  const dated = (p.models || []).filter((m) => m.shutdown_date);
  const notices = JSON.stringify(dated);
  if (c.models.dataset.shown !== notices) {
    c.models.dataset.shown = notices;
    c.models.replaceChildren(...dated.map((m) =>
      SH.el("li", { class: "model-shutdown", text: SH.t("ops.provider.modelShutdown", { model: m.model, use: m.use, date: m.shutdown_date }) })));
    c.models.hidden = !dated.length;
  }
  const n = Number(p.in_flight) || 0;
  const cap = p.max_in_flight == null ? null : Number(p.max_in_flight);
  c.inFlight.textContent = cap == null ? SH.fmtNumber(n) : `${SH.fmtNumber(n)} / ${SH.fmtNumber(cap)}`;
  c.cap.textContent = cap == null ? SH.t("ops.provider.noCap") : SH.t("ops.provider.inFlight");
  c.barBox.hidden = cap == null;
  if (cap != null) {
    c.bar.style.width = `${cap ? Math.min(100, Math.round((100 * n) / cap)) : 0}%`;
    c.barBox.classList.toggle("full", cap > 0 && n >= cap);
  }
  c.queued.textContent = SH.fmtNumber(Number(p.queued) || 0);
  c.rate.textContent = p.rate_limit || SH.t("ops.provider.noRateLimit");
  const list = p.experiences || [];
  const shown = JSON.stringify(list);
  if (c.rows.dataset.shown === shown) return;
  c.rows.dataset.shown = shown;
  if (!list.length) {
    c.rows.replaceChildren(SH.el("tr", {}, SH.el("td", { colspan: 5, class: "muted", text: SH.t("ops.provider.noExperiences") })));
    return;
  }
  c.rows.replaceChildren(
    ...list.map((e) =>
      SH.el("tr", { dataset: { slug: e.slug } },
        SH.el("td", { class: "slug", text: e.slug }),
        SH.el("td", { class: "num weight", text: SH.fmtNumber(e.weight) }),
        SH.el("td", { class: "num in-flight", text: `${SH.fmtNumber(e.in_flight || 0)} / ${SH.fmtNumber(e.max_in_flight)}` }),
        SH.el("td", { class: "num queued", text: SH.fmtNumber(e.queued || 0) }),
        SH.el("td", { class: "num share", title: SH.t("ops.provider.shareHelp"), text: e.share == null ? SH.t("common.none") : SH.fmtNumber(e.share) }))));
}

