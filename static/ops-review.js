// /ops: the review queue: results waiting for approval before the public
// screen, as the socket announces them (oldest first, big previews, how
// long each has waited). A moderator approves or rejects each (buttons, or
// the a / r keys on the selected one; j / k move), or all at once (two
// clicks); a viewer sees the queue without the buttons. The section shows
// while anything waits or any experience reviews its results.
import { $, enc, flash, post } from "./ops-api.js";
import { may, state } from "./ops-state.js";

// The review queue as the socket tells it: saga id -> item, and the
// selected item's saga id (the keys act on it).
const reviewItems = new Map();
let reviewSelected = null;
let reviewOldest = null;
let reviewWaiting = 0;
let reviewTimer = null;

// A stats frame's review figures: how many wait, the oldest since when.
export function reviewStats(review) {
  reviewWaiting = Number(review.waiting) || 0;
  reviewOldest = review.oldest_waiting_since ? Date.parse(review.oldest_waiting_since) : null;
  renderReviewHead();
}

// A new socket announces every waiting item again.
export function resetReviewItems() {
  reviewItems.clear();
}

// Signed out: the queue goes.
export function clearReview() {
  reviewItems.clear();
  $("review-queue").replaceChildren();
}

export function onReviewAdded(item) {
  if (!item || !item.saga_id) return;
  reviewItems.set(item.saga_id, item);
  renderReview();
}

export function onReviewRemoved(sagaId) {
  if (!reviewItems.delete(sagaId)) return;
  if (reviewSelected === sagaId) reviewSelected = null;
  renderReview();
}

// Oldest first, as they arrived.
function reviewOrder() {
  return [...reviewItems.values()].sort((a, b) =>
    a.waiting_since === b.waiting_since ? (a.saga_id < b.saga_id ? -1 : 1) : a.waiting_since < b.waiting_since ? -1 : 1);
}

function secondsSince(ms) {
  return Math.max(0, Math.floor((Date.now() - ms) / 1000));
}

export function renderReviewHead() {
  const shown = reviewItems.size || reviewWaiting;
  $("review-section").hidden = !shown && !state.experiences.some((e) => e.review === "before_display");
  $("review-count").textContent = SH.t("ops.review.waiting", { n: Math.max(reviewWaiting, reviewItems.size) });
  const oldest = reviewItems.size ? Date.parse(reviewOrder()[0].waiting_since) : reviewOldest;
  $("review-oldest").textContent = oldest ? SH.t("ops.review.oldest", { s: secondsSince(oldest) }) : "";
  $("review-oldest").classList.toggle("late", Boolean(oldest) && secondsSince(oldest) >= 60);
  $("review-approve-all").disabled = !reviewItems.size;
}

export function renderReview() {
  const items = reviewOrder();
  if (!items.some((i) => i.saga_id === reviewSelected)) reviewSelected = items.length ? items[0].saga_id : null;
  renderReviewHead();
  if (!items.length) {
    $("review-queue").replaceChildren(SH.el("li", { class: "muted empty", text: SH.t("ops.review.empty") }));
    return;
  }
  $("review-queue").replaceChildren(...items.map(reviewCard));
  // The waiting time ticks while anything waits.
  if (!reviewTimer) {
    reviewTimer = setInterval(() => {
      if (!reviewItems.size && !reviewWaiting) return;
      renderReviewHead();
      document.querySelectorAll(".review-card .waited").forEach((n) => {
        n.textContent = SH.t("ops.review.waited", { s: secondsSince(Date.parse(n.dataset.since)) });
      });
    }, 1000);
  }
}

function reviewCard(item) {
  const selected = item.saga_id === reviewSelected;
  // A viewer sees the queue without the buttons.
  const decides = may("moderator");
  const approve = decides ? SH.el("button", { type: "button", class: "btn btn-primary action-approve", text: SH.t("ops.review.approve") }) : null;
  const reject = decides ? SH.el("button", { type: "button", class: "btn action-reject", text: SH.t("ops.review.reject") }) : null;
  if (decides) {
    approve.addEventListener("click", () => decide(item.saga_id, "approve"));
    reject.addEventListener("click", () => decide(item.saga_id, "reject"));
  }
  const content = Array.isArray(item.content) ? item.content : item.content ? [item.content] : [];
  const card = SH.el("li", {
    class: `review-card${selected ? " selected" : ""}`,
    dataset: { sagaId: item.saga_id, sessionId: item.session_id },
    tabindex: "0",
  },
    SH.el("div", { class: "review-preview" }, ...SH.renderContent(content)),
    SH.el("div", { class: "review-meta" },
      SH.el("strong", { class: "nickname", text: item.nickname || "?" }),
      SH.el("span", { class: "muted", text: ` · ${item.experience || ""}` }),
      item.score != null ? SH.el("span", { class: "score", text: ` · ${SH.fmtNumber(item.score)}` }) : null,
      SH.el("span", { class: "waited muted", dataset: { since: item.waiting_since }, text: SH.t("ops.review.waited", { s: secondsSince(Date.parse(item.waiting_since)) }) })),
    decides ? SH.el("div", { class: "review-actions" }, approve, reject) : null);
  card.addEventListener("click", (ev) => {
    if (ev.target.closest("button")) return;
    reviewSelected = item.saga_id;
    renderReview();
  });
  return card;
}

// One decision; the item leaves at once (the socket confirms it).
async function decide(sagaId, action) {
  const item = reviewItems.get(sagaId);
  if (!item || item.deciding) return;
  item.deciding = true;
  try {
    await post(`/api/admin/sagas/${enc(sagaId)}/${action}`, {}, SH.uuid());
    onReviewRemoved(sagaId);
    flash(SH.t(action === "approve" ? "ops.review.approved" : "ops.review.rejected", { name: item.nickname || "?" }));
  } catch (err) {
    item.deciding = false;
    flash(SH.errorText(err), true);
    // Decided elsewhere (409): the socket removes it; nothing to undo.
  }
}

function moveSelection(delta) {
  const items = reviewOrder();
  if (!items.length) return;
  const at = Math.max(0, items.findIndex((i) => i.saga_id === reviewSelected));
  reviewSelected = items[Math.min(items.length - 1, Math.max(0, at + delta))].saga_id;
  renderReview();
  const card = document.querySelector(`.review-card[data-saga-id="${reviewSelected}"]`);
  if (card && card.scrollIntoView) card.scrollIntoView({ block: "nearest" });
}

function onReviewKey(ev) {
  if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
  const tag = (ev.target && ev.target.tagName) || "";
  if (["INPUT", "SELECT", "TEXTAREA"].includes(tag) || $("dashboard").hidden) return;
  if (!reviewItems.size) return;
  const key = ev.key.toLowerCase();
  // Deciding is a moderator's (a viewer only moves through the queue).
  if ((key === "a" || key === "r") && !may("moderator")) return;
  if (key === "a" && reviewSelected) decide(reviewSelected, "approve");
  else if (key === "r" && reviewSelected) decide(reviewSelected, "reject");
  else if (key === "j" || key === "arrowdown") moveSelection(1);
  else if (key === "k" || key === "arrowup") moveSelection(-1);
  else return;
  ev.preventDefault();
}

// Approve all: the first click arms the button with the count, the
// second approves every item in review (one bulk request).
function armApproveAll() {
  const b = $("review-approve-all");
  if (!b.classList.contains("armed")) {
    b.classList.add("armed");
    b.textContent = SH.t("ops.review.confirmApproveAll", { n: Math.max(reviewWaiting, reviewItems.size) });
    setTimeout(() => {
      b.classList.remove("armed");
      b.textContent = SH.t("ops.review.approveAll");
    }, 4000);
    return;
  }
  b.classList.remove("armed");
  b.textContent = SH.t("ops.review.approveAll");
  b.disabled = true;
  post("/api/admin/sagas/bulk", { action: "approve", filter: { step: "IN_REVIEW" }, dry_run: false }, SH.uuid())
    .then(({ data }) => flash(SH.t("ops.review.approvedAll", { done: data.done, matched: data.matched })))
    .catch((err) => flash(SH.errorText(err), true))
    .finally(() => {
      b.disabled = !reviewItems.size;
    });
}

export function initReview() {
  $("review-approve-all").addEventListener("click", armApproveAll);
  document.addEventListener("keydown", onReviewKey);
}
