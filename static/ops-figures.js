// /ops: the live figures the socket's stats frames draw: sagas by step
// (with the queue depth), AI jobs in flight per experience against its
// max_in_flight (and a PIN gallery someone is guessing, or whose PIN is
// too short), aborted sagas by reason over the last hour, and the recent
// activity.
import { $ } from "./ops-api.js";

export const STEPS = ["AI_PENDING", "AI_DONE", "IN_REVIEW", "RANKING_DONE", "COMPLETED", "ABORTED"];
export const REASONS = ["INPUT_REJECTED", "AI_FAILED", "AI_TIMEOUT", "RANKING_FAILED", "PERSIST_FAILED", "ORPHANED", "CANCELLED", "REVIEW_REJECTED", "INPUT_MISSING"];

function tile(id, label, value, extraClass) {
  return SH.el("div", { class: `tile ${extraClass || ""}`, id },
    SH.el("span", { class: "value", text: value == null ? "–" : SH.fmtNumber(value) }),
    SH.el("span", { class: "label", text: label }));
}

export function renderSteps(steps, queueDepth) {
  $("steps").replaceChildren(
    ...STEPS.map((step) => tile(`step-${step}`, SH.t(`step.${step}`), steps[step] || 0, `step-${step}`)),
    tile("queue-depth", SH.t("ops.queueDepth"), queueDepth, "queue"));
}

export function renderCapacity(list) {
  if (!list.length) {
    $("capacity").replaceChildren(SH.el("li", { class: "muted", text: SH.t("ops.noExperiences") }));
    return;
  }
  $("capacity").replaceChildren(
    ...list.map((e) => {
      const max = Number(e.max_in_flight) || 0;
      const n = Number(e.in_flight) || 0;
      const pct = max ? Math.min(100, Math.round((100 * n) / max)) : 0;
      return SH.el("li", { dataset: { slug: e.slug } },
        SH.el("div", { class: "cap-head" },
          SH.el("strong", { text: e.title || e.slug }),
          SH.el("span", { class: "muted", text: ` ${e.slug}` })),
        SH.el("div", { class: `bar${n >= max && max ? " full" : ""}` },
          SH.el("span", { style: { width: `${pct}%` } })),
        SH.el("div", { class: "cap-text" },
          SH.el("span", { class: "in-flight", text: SH.t("ops.inFlight", { n, max }) }),
          SH.el("span", { class: "queued", text: SH.t("ops.queued", { n: e.queued || 0 }) })),
        galleryAlarm(e));
    }));
}

// A PIN gallery someone is guessing (locked until its lock ends), or
// whose PIN is too short to open it any more: what to do about it.
function galleryAlarm(e) {
  if (e.gallery_locked_until) {
    return SH.el("p", { class: "gallery-alarm error small", role: "status",
      text: SH.t("ops.galleryLocked", { time: SH.fmtTime(e.gallery_locked_until) }) });
  }
  if (e.gallery_pin_outdated) {
    return SH.el("p", { class: "gallery-alarm error small", role: "status", text: SH.t("ops.galleryPinOutdated") });
  }
  return null;
}

export function renderReasons(counts) {
  const names = [...REASONS, ...Object.keys(counts).filter((r) => !REASONS.includes(r))];
  $("reasons").replaceChildren(
    ...names.map((r) =>
      SH.el("li", { id: `reason-${r}`, class: counts[r] ? "some" : "none" },
        SH.el("span", { text: SH.t(`reason.${r}`) }),
        SH.el("span", { class: "count", text: SH.fmtNumber(counts[r] || 0) }))));
}

export function renderRecent(list) {
  if (!list.length) {
    $("recent").replaceChildren(SH.el("li", { class: "muted", text: SH.t("ops.noRecent") }));
    return;
  }
  $("recent").replaceChildren(
    ...list.slice(0, 12).map((r) =>
      SH.el("li", { dataset: { sagaId: r.saga_id } },
        SH.el("span", { class: "muted time", text: SH.fmtTime(r.updated_at) }),
        SH.el("span", { class: "who", text: `${r.nickname || "?"} · ${r.experience || ""}` }),
        r.forgotten
          ? SH.el("span", { class: "step-badge step-forgotten", text: SH.t(`forgotten.${r.forgotten}`) })
          : SH.el("span", { class: `step-badge step-${r.step}`, text: r.abort_reason ? SH.t(`reason.${r.abort_reason}`) : SH.t(`step.${r.step}`) }))));
}
