// /ops: what the panels share. The operator token (asked once and kept in
// sessionStorage: this tab only), who is signed in ({operator_id, name,
// role}) and what each role may do, the experiences as last read, the AI
// jobs running per experience, the AI providers' names and whether the
// operators' socket has spoken yet. One object, read and written by the
// panels' modules; nothing here is on `window`.

export const TOKEN_KEY = "stagehand:ops:token";
export const ME_KEY = "stagehand:ops:me";
export const ROLES = ["viewer", "moderator", "admin"];

export const state = {
  // The operator token (null: signed out).
  token: SH.session.get(TOKEN_KEY),
  // The dashboard runs: signed in with a token the server took (a 401
  // then signs out; before, at load, a stale token is only refused).
  started: false,
  // Who is signed in, as /api/admin/me said it (null: not known).
  me: null,
  // The experiences (GET /api/experiences).
  experiences: [],
  // AI jobs running now per experience (the socket's stats and the
  // providers' list), for the confirm before lowering max_in_flight.
  running: new Map(),
  // The AI providers' names, in the order the server lists them.
  providerNames: [],
  // Whether the current operators' socket has said anything yet.
  heard: false,
};

export function role() {
  const me = state.me;
  return me && ROLES.includes(me.role) ? me.role : "viewer";
}

// True when the signed-in role may do what needs `need` (a role name).
export function may(need) {
  return ROLES.indexOf(role()) >= ROLES.indexOf(need);
}
