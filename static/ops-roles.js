// /ops: operators and roles. Who a token is (GET /api/admin/me), the
// header's "name (role)", and what the role may not do not shown at all
// (a viewer reads, a moderator also approves, rejects, hides and unhides,
// an admin does everything: every [data-needs] element, and the body's
// data-role the panels follow). A role not known yet is asked again
// shortly; one that changed draws the panels with buttons again.
import { $, signOut } from "./ops-api.js";
import { ME_KEY, ROLES, may, role, state } from "./ops-state.js";
import { startAudit, stopAudit } from "./ops-audit.js";
import { renderExperienceList } from "./ops-experiences.js";
import { loadAllHeld } from "./ops-guests.js";
import { loadOperators } from "./ops-operators.js";
import { redrawBreakers } from "./ops-providers.js";
import { renderReview } from "./ops-review.js";
import { redrawSagas } from "./ops-sagas.js";

let meTimer = null;
let meAttempt = 0;

// Who the token is: {ok: true, me} when the server takes it, {ok:
// false} on a 401; anything else (no answer, a server without
// /api/admin/me) lets the dashboard start, {ok: true, me: null}.
export async function whoIs(candidate) {
  try {
    const { data } = await SH.api("/api/admin/me", { token: candidate });
    return { ok: true, me: data && ROLES.includes(data.role) ? data : null };
  } catch (err) {
    if (err instanceof SH.ApiError && err.status === 401) return { ok: false };
    return { ok: true, me: null };
  }
}

// `me` as the server said it; unknown (no answer yet): the last one this
// tab knew, else asked again shortly, the page meanwhile a viewer's.
export function setMe(who) {
  clearTimeout(meTimer);
  meTimer = null;
  if (who) {
    state.me = who;
    meAttempt = 0;
    SH.session.set(ME_KEY, who);
    return;
  }
  const kept = SH.session.get(ME_KEY);
  state.me = kept && ROLES.includes(kept.role) ? kept : null;
  meTimer = setTimeout(askMeAgain, 2000 + SH.backoff(meAttempt, 60000));
  meAttempt += 1;
}

// Signed out: no more asking.
export function stopAskingMe() {
  clearTimeout(meTimer);
  meTimer = null;
}

async function askMeAgain() {
  meTimer = null;
  if (!state.token) return;
  const used = state.token;
  const who = await whoIs(used);
  if (used !== state.token) return;
  if (!who.ok) {
    signOut(SH.t("ops.tokenRevoked"));
    return;
  }
  const before = role();
  setMe(who.me);
  if (role() !== before || who.me) {
    applyRole();
    redrawForRole();
  }
}

// The header's "name (role)", and what the role may not use hidden.
export function applyRole() {
  const me = state.me;
  document.body.dataset.role = role();
  const who = $("whoami");
  who.textContent = me ? SH.t("ops.whoami", { name: me.name || "?", role: SH.t(`ops.role.${role()}`) }) : "";
  who.title = me && me.operator_id ? me.operator_id : "";
  who.hidden = !me;
  document.querySelectorAll("[data-needs]").forEach((n) => {
    n.hidden = !may(n.dataset.needs);
  });
}

// The parts drawn with buttons, drawn again for a role that changed.
function redrawForRole() {
  redrawSagas();
  renderReview();
  renderExperienceList();
  loadAllHeld();
  redrawBreakers();
  if (may("admin")) {
    loadOperators();
    startAudit();
  } else {
    stopAudit();
  }
}
