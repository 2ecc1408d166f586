// The operator dashboard, /ops: signing in and out, and the start-up. The
// operator token is asked once and kept in sessionStorage (this tab
// only); the server is asked who it is (GET /api/admin/me) and the page
// shows only what that role may do. A revoked token (401, or the socket's
// 4401) returns to the sign-in form and says so, and what the last
// operator saw goes with them.
//
// The panels are ES modules of their own (no bundler: the browser loads
// them from /static/, this one first):
//   ops-state.js        what they share (the token, who is signed in, ...)
//   ops-api.js          requests, Idempotency-Keys, the flash line
//   ops-roles.js        who is signed in, what the role may see
//   ops-socket.js       the operators' socket and what it dispatches
//   ops-figures.js      the live figures (steps, capacity, reasons, recent)
//   ops-review.js       the review queue
//   ops-providers.js    the AI providers and their breakers
//   ops-print.js        the print stations and the event's brand
//   ops-webhooks.js     the webhook endpoints
//   ops-mail.js         mail to guests
//   ops-terminals.js    the terminals, their QR codes, New terminal
//   ops-sagas.js        the sagas table, Retry and Cancel
//   ops-guests.js       what each experience holds, Export, Find a guest
//   ops-experiences.js  the experiences, New experience
//   ops-settings.js     an experience's live settings editor
//   ops-operators.js    the operators (an admin's)
//   ops-audit.js        the audit log (an admin's)
import { $, onSignOut } from "./ops-api.js";
import { ME_KEY, TOKEN_KEY, may, state } from "./ops-state.js";
import { clearAudit, initAudit, startAudit, stopAudit } from "./ops-audit.js";
import { clearExperiences, initExperiences, loadExperiences } from "./ops-experiences.js";
import { renderReasons, renderSteps } from "./ops-figures.js";
import { clearGuests, initGuests, stopHeld } from "./ops-guests.js";
import { initMail } from "./ops-mail.js";
import { clearOperators, closeOperatorResult, initOperators, loadOperators } from "./ops-operators.js";
import { initPrint } from "./ops-print.js";
import { clearProviders, startProviders, stopProviders } from "./ops-providers.js";
import { clearReview, initReview } from "./ops-review.js";
import { applyRole, setMe, stopAskingMe, whoIs } from "./ops-roles.js";
import { clearSagas, forgetSagasShown, initSagas, loadSagas, sagasPagedNow } from "./ops-sagas.js";
import { closeSocket, connect, socketOpen } from "./ops-socket.js";
import { closeTerminalResult, initTerminals, loadTerminals } from "./ops-terminals.js";
import { initWebhooks } from "./ops-webhooks.js";

let refreshTimer = null;

// ---- signing in ----------------------------------------------------------

function showLogin(error) {
  $("dashboard").hidden = true;
  $("sign-out").hidden = true;
  $("conn").hidden = true;
  $("whoami").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = error || "";
  $("login-error").hidden = !error;
  $("token").value = "";
  $("token").focus();
}

function signOut(error) {
  state.token = null;
  state.me = null;
  state.started = false;
  SH.session.set(TOKEN_KEY, null);
  SH.session.set(ME_KEY, null);
  closeSocket();
  clearInterval(refreshTimer);
  stopProviders();
  stopHeld();
  stopAskingMe();
  stopAudit();
  forgetSignedIn();
  showLogin(error);
}

// What the last operator saw goes with them: the next one (perhaps of
// another role) starts from a clean page.
function forgetSignedIn() {
  delete document.body.dataset.role;
  clearExperiences();
  state.running.clear();
  clearGuests();
  clearSagas();
  clearReview();
  clearProviders();
  clearOperators();
  closeOperatorResult();
  closeTerminalResult();
  clearAudit();
}

async function onLogin(ev) {
  ev.preventDefault();
  const candidate = $("token").value.trim();
  if (!candidate) return;
  $("sign-in").disabled = true;
  const who = await whoIs(candidate);
  $("sign-in").disabled = false;
  if (!who.ok) {
    showLogin(SH.t("ops.tokenWrong"));
    return;
  }
  state.token = candidate;
  SH.session.set(TOKEN_KEY, state.token);
  setMe(who.me);
  start();
}

// ---- start ---------------------------------------------------------------

async function start() {
  state.started = true;
  $("login").hidden = true;
  $("dashboard").hidden = false;
  $("sign-out").hidden = false;
  applyRole();
  forgetSagasShown();
  renderSteps({}, null);
  renderReasons({});
  connect();
  if (may("admin")) {
    loadOperators();
    startAudit();
  }
  startProviders();
  await loadExperiences();
  loadTerminals();
  loadSagas();
  // A safety net for when the socket is down: the table still refreshes.
  clearInterval(refreshTimer);
  refreshTimer = setInterval(() => {
    if (!socketOpen() && !sagasPagedNow()) loadSagas();
  }, 10000);
}

async function init() {
  await SH.loadLocale("en");
  initSagas();
  initAudit();
  $("login").addEventListener("submit", onLogin);
  $("sign-out").addEventListener("click", () => signOut());
  initReview();
  initExperiences();
  initTerminals();
  initGuests();
  initOperators();
  if (!state.token) {
    showLogin();
    return;
  }
  const who = await whoIs(state.token);
  if (!who.ok) {
    signOut(SH.t("ops.tokenWrong"));
    return;
  }
  setMe(who.me);
  start();
}

onSignOut(signOut);
init();
// The print stations, the webhooks and the mail panels start now, as they
// did once the page was parsed (they wait for the dashboard themselves).
initPrint();
initWebhooks();
initMail();
