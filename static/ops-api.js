// /ops: the requests and small helpers every panel uses. `call` is an
// operator request with the signed-in token (a 401 signs out: the token
// was revoked, or the server no longer takes it); `send` and `post` send
// a change again with the same Idempotency-Key when no answer came;
// `submitForm` does that for a form (one key per intent); `flash` is the
// dashboard's short status line. Signing out itself is ops-main.js's: it
// hands it here with onSignOut.
import { state } from "./ops-state.js";

export const $ = (id) => document.getElementById(id);
export const enc = encodeURIComponent;

let signOutHandler = () => {};
let flashTimer = null;

// ops-main.js's sign-out (what the last operator saw goes, the sign-in
// form comes back with `error`).
export function onSignOut(fn) {
  signOutHandler = fn;
}

export function signOut(error) {
  signOutHandler(error);
}

// An operator request; a 401 while the dashboard runs signs out (the
// token was revoked, or the server no longer takes it).
export async function call(path, opts = {}) {
  const used = state.token;
  try {
    return await SH.api(path, { ...opts, token: used });
  } catch (err) {
    if (err instanceof SH.ApiError && err.status === 401 && used && used === state.token && state.started) signOut(SH.t("ops.tokenRevoked"));
    throw err;
  }
}

// A request that changes something, with an Idempotency-Key: sent again
// with the same key when no answer came (or the server was busy).
export async function send(method, path, body, key) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await call(path, { method, body, key });
    } catch (err) {
      if (!SH.retryable(err) || attempt >= 4 || !state.token) throw err;
      await SH.sleep(SH.backoff(attempt, 5000));
    }
  }
}

// A fresh Idempotency-Key (crypto.randomUUID where the page is a secure
// context; the shared helper elsewhere).
export function newKey() {
  return typeof crypto !== "undefined" && crypto.randomUUID ? crypto.randomUUID() : SH.uuid();
}

// A POST that creates or changes something: one Idempotency-Key per
// intent, sent again as it was when no answer came.
export async function post(path, body, key) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await call(path, { method: "POST", body, key });
    } catch (err) {
      if (!SH.retryable(err) || attempt >= 4) throw err;
      await SH.sleep(SH.backoff(attempt, 5000));
    }
  }
}

export function flash(text, isError) {
  const n = $("flash");
  n.textContent = text;
  n.classList.toggle("error", Boolean(isError));
  n.hidden = false;
  clearTimeout(flashTimer);
  flashTimer = setTimeout(() => {
    n.hidden = true;
  }, 6000);
}

// ---- forms ---------------------------------------------------------------

// A form's pending request: {key, json}. The same body sent again (after
// no answer) reuses the key; a changed body is a new request.
const pendingKeys = new Map();

export async function submitForm(form, path, body) {
  const json = JSON.stringify(body);
  let p = pendingKeys.get(form.id);
  if (!p || p.json !== json) {
    p = { key: SH.uuid(), json };
    pendingKeys.set(form.id, p);
  }
  const error = form.querySelector(".form-error");
  const button = form.querySelector("button[type=submit]");
  error.hidden = true;
  button.disabled = true;
  try {
    const res = await post(path, body, p.key);
    pendingKeys.delete(form.id);
    return res.data;
  } catch (err) {
    if (!SH.retryable(err)) pendingKeys.delete(form.id);
    error.textContent = SH.errorText(err);
    error.hidden = false;
    return null;
  } finally {
    button.disabled = false;
  }
}
