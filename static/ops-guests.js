// /ops: the guests' data. Under each experience, what is held (photos,
// results, the next purge) and an Export button (a ZIP of every kept
// result, fetched with the token and saved); "Find a guest" searches
// sessions by nickname, with Hide / Unhide (the gallery; a moderator's),
// Print (a finished result) and Erase (on a guest's request; an admin's).
import { $, call, enc, flash, post, signOut } from "./ops-api.js";
import { may, state } from "./ops-state.js";

// What each experience holds is read this often (and after an erase).
const HELD_MS = 30000;
let heldTimer = null;

// ---- the guests' data: held, export ----------------------------------------

// Under an experience: what it holds, and its Export button.
export function guestsBlock(e) {
  const held = SH.el("p", { class: "held small", dataset: { slug: e.slug } });
  const kept = SH.el("p", { class: "held-retention muted small" });
  const result = SH.el("span", { class: "export-result muted small", role: "status" });
  const button = may("admin") ? SH.el("button", { type: "button", class: "btn btn-small export", text: SH.t("ops.export") }) : null;
  if (button) button.addEventListener("click", () => exportZip(e.slug, button, result));
  return SH.el("div", { class: "guests-data", dataset: { slug: e.slug } },
    held, kept, button ? SH.el("div", { class: "export-line" }, button, " ", result) : null);
}

export function loadAllHeld() {
  clearInterval(heldTimer);
  heldTimer = setInterval(() => {
    if (state.token) state.experiences.forEach((e) => loadHeld(e.slug));
  }, HELD_MS);
  state.experiences.forEach((e) => loadHeld(e.slug));
}

async function loadHeld(slug) {
  const box = document.querySelector(`.guests-data[data-slug="${CSS.escape(slug)}"]`);
  if (!box) return;
  const [held, kept] = box.querySelectorAll("p");
  try {
    const { data } = await call(`/api/admin/experiences/${enc(slug)}/held`);
    const d = data || {};
    const parts = [SH.t("ops.held", {
      photos: SH.fmtNumber(d.photos || 0),
      size: SH.fmtBytes(d.photo_bytes || 0),
      results: SH.fmtNumber(d.results || 0),
    })];
    // The next purge of anything: a photo's or a result's, whichever
    // comes first.
    const times = [d.next_purge_at, d.next_photo_purge_at].filter((x) => x && Number.isFinite(Date.parse(x)));
    times.sort((a, b) => Date.parse(a) - Date.parse(b));
    parts.push(times.length ? SH.t("ops.nextPurge", { time: SH.fmtDateTime(times[0]) }) : SH.t("ops.noPurge"));
    parts.push(SH.t("ops.forgotten", { n: SH.fmtNumber(d.forgotten || 0) }));
    held.textContent = parts.join("; ");
    held.title = [
      d.next_photo_purge_at ? SH.t("ops.nextPhotoPurge", { time: SH.fmtDateTime(d.next_photo_purge_at) }) : null,
      d.next_purge_at ? SH.t("ops.nextResultPurge", { time: SH.fmtDateTime(d.next_purge_at) }) : null,
    ].filter(Boolean).join("\n");
    held.classList.remove("error");
    kept.textContent = d.photo_retention || d.retention
      ? SH.t("ops.retention", { photos: d.photo_retention || SH.t("common.none"), results: d.retention || SH.t("common.none") })
      : "";
    kept.hidden = !kept.textContent;
  } catch (err) {
    held.textContent = SH.errorText(err);
    held.classList.add("error");
  }
}

// The export needs the token in its Authorization header, so it is
// fetched here and saved from memory under <slug>-export.zip.
async function exportZip(slug, button, out) {
  if (button.disabled) return;
  const file = `${slug}-export.zip`;
  button.disabled = true;
  button.textContent = SH.t("ops.exporting");
  out.textContent = "";
  try {
    let res;
    try {
      res = await fetch(`/api/admin/experiences/${enc(slug)}/export`, {
        headers: { Authorization: `Bearer ${state.token}`, Accept: "application/zip, application/json" },
        cache: "no-store",
      });
    } catch (e) {
      throw new SH.NetworkError(e && e.message ? e.message : String(e));
    }
    if (!res.ok) {
      let body = null;
      try {
        body = await res.json();
      } catch (_) {
        /* not JSON */
      }
      const err = new SH.ApiError(res.status, body && body.error, body && body.message, body);
      if (res.status === 401) signOut(SH.t("ops.tokenRevoked"));
      throw err;
    }
    const blob = await res.blob();
    const url = URL.createObjectURL(blob);
    const a = SH.el("a", { href: url, download: file, class: "visually-hidden" });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    out.textContent = SH.t("ops.exported", { file, size: SH.fmtBytes(blob.size) });
  } catch (err) {
    out.textContent = "";
    flash(SH.errorText(err), true);
  } finally {
    button.disabled = false;
    button.textContent = SH.t("ops.export");
  }
}

// ---- the guests' data: find a guest -----------------------------------------

async function findGuests(ev) {
  if (ev) ev.preventDefault();
  const nickname = $("g-nickname").value.trim();
  const experience = $("g-experience").value;
  if (!nickname) {
    guestsNote(SH.t("ops.findEmpty"));
    $("guests").hidden = true;
    return;
  }
  const q = new URLSearchParams({ nickname });
  if (experience) q.set("experience", experience);
  $("guest-find").disabled = true;
  try {
    const { data } = await call(`/api/admin/sessions?${q}`);
    renderGuests((data && data.sessions) || []);
  } catch (err) {
    guestsNote(SH.errorText(err));
  } finally {
    $("guest-find").disabled = false;
  }
}

function guestsNote(text) {
  $("guests-note").textContent = text || "";
  $("guests-note").hidden = !text;
}

function renderGuests(list) {
  const body = $("guests").tBodies[0];
  $("guests").hidden = !list.length;
  guestsNote(list.length ? "" : SH.t("ops.findNone"));
  body.replaceChildren(...list.map(guestRow));
}

function guestRow(g) {
  const link = SH.shownUrl(g.share_url, false);
  const own = link && link.startsWith("/") ? link : null;
  const row = SH.el("tr", { class: g.hidden ? "hidden-result" : null, dataset: { sessionId: g.session_id, hidden: String(Boolean(g.hidden)) } },
    SH.el("td", { class: "time", title: g.created_at || "", text: SH.fmtDateTime(g.created_at) }),
    SH.el("td", { text: g.experience || "" }),
    SH.el("td", { class: "nickname", text: g.nickname || "" }),
    SH.el("td", {},
      SH.el("span", { class: `step-badge step-${String(g.status || "").replace(/[^A-Z_]/g, "")}`, text: g.status || "" }),
      g.hidden ? SH.el("span", { class: "step-badge hidden-badge", text: SH.t("ops.hidden") }) : null),
    SH.el("td", { class: "link" }, own ? SH.el("a", { href: own, target: "_blank", rel: "noopener", text: own }) : SH.t("common.none")),
    SH.el("td", { class: "actions" }));
  const actions = row.lastChild;
  // Hide / Unhide: a moderator's; Erase: an admin's.
  if (may("moderator")) {
    const toggle = SH.el("button", {
      type: "button",
      class: `btn btn-small action-${g.hidden ? "unhide" : "hide"}`,
      text: SH.t(g.hidden ? "ops.unhide" : "ops.hide"),
    });
    toggle.addEventListener("click", () => hideGuest(g, toggle));
    actions.append(toggle);
  }
  // Print (or print again) a finished result: no bound, no review.
  if (may("moderator") && g.status === "COMPLETED") {
    const print = SH.el("button", { type: "button", class: "btn btn-small action-print", text: SH.t("ops.reprint") });
    print.addEventListener("click", () => printGuest(g, print));
    actions.append(" ", print);
  }
  if (may("admin")) {
    const erase = SH.el("button", { type: "button", class: "btn btn-small btn-danger action-erase", text: SH.t("ops.erase") });
    erase.addEventListener("click", () => eraseGuest(g, erase));
    actions.append(" ", erase);
  }
  return row;
}

async function hideGuest(g, button) {
  const action = g.hidden ? "unhide" : "hide";
  button.disabled = true;
  try {
    const { data } = await post(`/api/admin/sessions/${enc(g.session_id)}/${action}`, {}, SH.uuid());
    g.hidden = data && typeof data.hidden === "boolean" ? data.hidden : action === "hide";
    const row = button.closest("tr");
    if (row) row.replaceWith(guestRow(g));
    flash(SH.t(`ops.done.${action}`, { name: g.nickname || g.session_id }));
  } catch (err) {
    button.disabled = false;
    flash(SH.errorText(err), true);
  }
}

async function printGuest(g, button) {
  button.disabled = true;
  try {
    await post(`/api/admin/sessions/${enc(g.session_id)}/print`, {}, SH.uuid());
    flash(SH.t("ops.reprinted"));
  } catch (err) {
    flash(SH.errorText(err), true);
  } finally {
    button.disabled = false;
  }
}

async function eraseGuest(g, button) {
  if (!window.confirm(SH.t("ops.eraseConfirm", { name: g.nickname || g.session_id }))) return;
  button.disabled = true;
  try {
    await call(`/api/admin/sessions/${enc(g.session_id)}`, { method: "DELETE" });
    const row = button.closest("tr");
    if (row) row.remove();
    if (!$("guests").tBodies[0].rows.length) renderGuests([]);
    flash(SH.t("ops.done.erase", { name: g.nickname || g.session_id }));
    if (g.experience) loadHeld(g.experience);
  } catch (err) {
    button.disabled = false;
    flash(SH.errorText(err), true);
  }
}

// Signed out: no more reading what is held.
export function stopHeld() {
  clearInterval(heldTimer);
  heldTimer = null;
}

// Signed out: the search's answers go.
export function clearGuests() {
  $("guests").tBodies[0].replaceChildren();
  $("guests").hidden = true;
  guestsNote("");
}

export function initGuests() {
  $("guest-search").addEventListener("submit", findGuests);
}
