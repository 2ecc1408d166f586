// /ops: the operators' socket (/ws/operators) and what it dispatches: the
// live figures (stats: the step tiles, capacity, aborted reasons, recent
// activity, the terminals, the review queue's count, the sagas table
// following a change), the review queue's items as they come and go, and
// the print stations' frame. The header's connection badge; reconnecting
// with a countdown and backoff; a revoked token (4401, or the server
// refusing it after a few tries) signs out.
import { $, enc, signOut } from "./ops-api.js";
import { state } from "./ops-state.js";
import { renderCapacity, renderReasons, renderRecent, renderSteps } from "./ops-figures.js";
import { renderPrinters } from "./ops-print.js";
import { onReviewAdded, onReviewRemoved, renderReview, resetReviewItems, reviewStats } from "./ops-review.js";
import { whoIs } from "./ops-roles.js";
import { followRecent } from "./ops-sagas.js";
import { showTerminals } from "./ops-terminals.js";

let ws = null;
let wsAttempt = 0;
let wsTimer = null;
let wsCountdown = null;

// Whether a socket is open (or opening).
export function socketOpen() {
  return Boolean(ws);
}

function setConn(conn, text) {
  $("conn").hidden = false;
  $("conn").dataset.state = conn;
  $("conn-text").textContent = text;
}

export function closeSocket() {
  clearTimeout(wsTimer);
  clearInterval(wsCountdown);
  wsTimer = null;
  if (ws) {
    const s = ws;
    ws = null;
    s.close();
  }
}

export function connect() {
  if (!state.token) return;
  clearTimeout(wsTimer);
  clearInterval(wsCountdown);
  wsTimer = null;
  state.heard = false;
  setConn("connecting", SH.t("ops.conn.connecting"));
  const socket = new WebSocket(SH.wsUrl(`/ws/operators?token=${enc(state.token)}`));
  ws = socket;
  // A new socket announces every waiting item again.
  resetReviewItems();
  renderReview();
  socket.onmessage = (m) => {
    if (ws !== socket) return;
    let msg;
    try {
      msg = JSON.parse(m.data);
    } catch (_) {
      return;
    }
    if (!state.heard) {
      state.heard = true;
      wsAttempt = 0;
      setConn("live", SH.t("ops.conn.live"));
    }
    if (msg.type === "stats") onStats(msg);
    else if (msg.type === "review.added") onReviewAdded(msg.item);
    else if (msg.type === "review.removed") onReviewRemoved(msg.saga_id);
    // The print stations' panel (ops-print.js) follows its own frame.
    else if (msg.type === "print.printers") renderPrinters(msg);
  };
  socket.onclose = (ev) => {
    if (ws !== socket) return;
    ws = null;
    if (ev.code === 4401) {
      // The token was revoked (on this instance or another).
      signOut(SH.t("ops.tokenRevoked"));
      return;
    }
    reconnectLater();
  };
}

async function reconnectLater() {
  if (state.heard) wsAttempt = 0;
  const delay = SH.backoff(wsAttempt, 30000);
  wsAttempt += 1;
  if (wsAttempt === 3 && state.token && !(await whoIs(state.token)).ok) {
    signOut(SH.t("ops.tokenRevoked"));
    return;
  }
  if (!state.token) return;
  const at = Date.now() + delay;
  const tick = () =>
    setConn("reconnecting", SH.t("ops.conn.reconnecting", { s: Math.max(0, Math.ceil((at - Date.now()) / 1000)) }));
  tick();
  wsCountdown = setInterval(tick, 1000);
  wsTimer = setTimeout(connect, delay);
}

// ---- the stats frame ------------------------------------------------------

// A stats frame, to every panel it feeds.
function onStats(s) {
  for (const e of s.experiences || []) {
    if (e && e.slug) state.running.set(e.slug, Number(e.in_flight) || 0);
  }
  renderSteps(s.steps || {}, s.queue_depth);
  if (s.review) reviewStats(s.review);
  renderCapacity(s.experiences || []);
  renderReasons(s.aborted_by_reason || {});
  if (Array.isArray(s.terminals)) showTerminals(s.terminals);
  renderRecent(s.recent || []);
  // The table follows the live figures when a saga changed.
  followRecent(s.recent || []);
}
