// Shared helpers of the stagehand pages: JSON requests with JSON errors,
// Idempotency-Keys, the locale tables, small DOM and storage helpers.
// Plain script, no framework, no build step: every page loads it first and
// uses the global `SH`.
"use strict";

const SH = (() => {
  // ---- ids -------------------------------------------------------------

  // A random UUID v4. crypto.randomUUID exists only in secure contexts
  // (https or localhost), and a phone on the event's wifi may open the page
  // over plain http, so build it from getRandomValues, which works anywhere.
  function uuid() {
    const b = new Uint8Array(16);
    crypto.getRandomValues(b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  }

  // ---- HTTP --------------------------------------------------------------

  // The server answered with an error ({"error", "message"}).
  class ApiError extends Error {
    constructor(status, code, message, body) {
      super(message || code || `HTTP ${status}`);
      this.status = status;
      this.code = code || `http_${status}`;
      this.body = body;
    }
  }

  // No answer at all: offline, connection dropped, timed out. The request
  // may or may not have reached the server, so retry it with the same key.
  class NetworkError extends Error {}

  // fetch() with JSON in and out. Options: method, body (an object, sent as
  // JSON), token (a bearer token), key (an Idempotency-Key), headers (any
  // other request headers), timeoutMs. Resolves to {status, data,
  // replayed}; rejects with ApiError (with `retryAfter`, in seconds, when
  // the answer said Retry-After) or NetworkError.
  async function api(path, opts = {}) {
    const headers = { Accept: "application/json" };
    if (opts.body !== undefined) headers["Content-Type"] = "application/json";
    if (opts.token) headers.Authorization = `Bearer ${opts.token}`;
    if (opts.key) headers["Idempotency-Key"] = opts.key;
    if (opts.headers) Object.assign(headers, opts.headers);
    const ctrl = new AbortController();
    const timer = setTimeout(() => ctrl.abort(), opts.timeoutMs || 20000);
    let res;
    let text;
    try {
      res = await fetch(path, {
        method: opts.method || (opts.body !== undefined ? "POST" : "GET"),
        headers,
        body: opts.body !== undefined ? JSON.stringify(opts.body) : undefined,
        signal: ctrl.signal,
        cache: "no-store",
      });
      text = await res.text();
    } catch (e) {
      throw new NetworkError(e && e.message ? e.message : String(e));
    } finally {
      clearTimeout(timer);
    }
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (_) {
        data = { message: text.slice(0, 200) };
      }
    }
    if (!res.ok) {
      const err = new ApiError(res.status, data && data.error, data && data.message, data);
      const after = Number(res.headers.get("Retry-After"));
      if (Number.isFinite(after) && after > 0) err.retryAfter = after;
      throw err;
    }
    return {
      status: res.status,
      data,
      replayed: res.headers.get("Idempotent-Replayed") === "true",
    };
  }

  // Worth sending again with the same Idempotency-Key: no answer, the same
  // key still in progress, the server briefly unable to answer, or a body
  // that arrived too slowly (408).
  function retryable(err) {
    if (err instanceof NetworkError) return true;
    if (err instanceof ApiError) {
      return err.code === "request_in_progress" || err.status >= 500 || err.status === 429 || err.status === 408;
    }
    return false;
  }

  // Exponential backoff with jitter, in milliseconds: 0.5 s, 1 s, 2 s, ...
  // capped at `cap`.
  function backoff(attempt, cap = 30000) {
    const base = Math.min(cap, 500 * 2 ** Math.min(attempt, 10));
    return Math.round(base * (0.6 + Math.random() * 0.4));
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  // `ws://` or `wss://` on this host.
  function wsUrl(path) {
    return `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}${path}`;
  }

  // ---- language ----------------------------------------------------------

  let table = {};
  let fallback = {};
  let current = "en";
  const LOCALES = ["en", "ko"];

  async function fetchTable(locale) {
    const { data } = await api(`/i18n/${locale}.json`);
    return data || {};
  }

  // Loads the table of `locale` (en or ko; anything else is en), with the
  // English table behind it for any missing key, and translates the page.
  // `?lang=xx` in the address overrides the choice.
  async function loadLocale(locale) {
    const forced = new URLSearchParams(location.search).get("lang");
    if (forced && LOCALES.includes(forced)) locale = forced;
    if (!LOCALES.includes(locale)) locale = "en";
    try {
      if (!Object.keys(fallback).length) fallback = await fetchTable("en");
      table = locale === "en" ? fallback : await fetchTable(locale);
      current = locale;
    } catch (_) {
      table = fallback;
      current = Object.keys(fallback).length ? "en" : current;
    }
    document.documentElement.lang = current;
    translate(document);
    return current;
  }

  // The text of `key`, with {name} replaced from `vars`.
  function t(key, vars) {
    let s = key in table ? table[key] : key in fallback ? fallback[key] : key;
    if (vars) {
      s = s.replace(/\{(\w+)\}/g, (m, k) => (k in vars && vars[k] != null ? String(vars[k]) : m));
    }
    return s;
  }

  // Elements with data-i18n="key" get the text; data-i18n-placeholder,
  // data-i18n-title and data-i18n-aria-label set those attributes.
  function translate(root) {
    root.querySelectorAll("[data-i18n]").forEach((n) => {
      n.textContent = t(n.dataset.i18n);
    });
    for (const attr of ["placeholder", "title", "aria-label", "alt"]) {
      const data = `data-i18n-${attr}`;
      root.querySelectorAll(`[${data}]`).forEach((n) => n.setAttribute(attr, t(n.getAttribute(data))));
    }
  }

  // A human sentence for any error a request can end with.
  function errorText(err) {
    if (err instanceof NetworkError) return t("common.networkError");
    if (err instanceof ApiError) {
      if (err.body && err.body.message) return err.body.message;
      return t("common.serverError", { status: err.status });
    }
    return String(err && err.message ? err.message : err);
  }

  // ---- DOM ---------------------------------------------------------------

  // el("p", {class: "x", text: "hi", onclick: f}, child, "text", ...)
  function el(tag, props, ...children) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v == null || v === false) continue;
      if (k === "text") n.textContent = v;
      else if (k === "class") n.className = v;
      else if (k === "dataset") Object.assign(n.dataset, v);
      // Through the CSSOM: the pages' policy refuses style attributes.
      else if (k === "style") Object.assign(n.style, v);
      else if (k.startsWith("on") && typeof v === "function") n.addEventListener(k.slice(2), v);
      else if (v === true) n.setAttribute(k, "");
      else n.setAttribute(k, String(v));
    }
    for (const c of children.flat()) {
      if (c == null || c === false) continue;
      n.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return n;
  }

  const $ = (sel, root = document) => root.querySelector(sel);

  // Shows one element of a group (by id) and hides the others.
  function showOnly(ids, visible) {
    for (const id of ids) {
      const n = document.getElementById(id);
      if (n) n.hidden = id !== visible;
    }
  }

  // A result's URL as the page may use it, or null: http(s), this server's
  // own paths (not "//host"), and for a media item a data: URL of image,
  // video or audio; nothing with a control character, space or backslash.
  // The server's adapters leave out any other URL already
  // (ContentItem::url_is_shown); this is the pages' own check, so a
  // javascript: URL never becomes a link or a source.
  function shownUrl(url, media) {
    if (typeof url !== "string") return null;
    if (/[\u0000-\u0020\u007f-\u009f\\]/.test(url)) return null;
    if (/^https?:\/\//i.test(url)) return url;
    if (url.startsWith("/") && !url.startsWith("//")) return url;
    if (media && /^data:(image|video|audio)\//i.test(url)) return url;
    return null;
  }

  // The result's content items as elements: images (with a placeholder when
  // they cannot be loaded), video, audio, text, and a link for anything else
  // (only for a URL shownUrl accepts). With `display`, an image shows its
  // display-size rendition (thumb_url) when the server kept one: a booth
  // screen downloads a few dozen KB per result, the phone the full file.
  function renderContent(content, options) {
    const display = Boolean(options && options.display);
    const out = [];
    for (const item of content || []) {
      if (!item) continue;
      const type = String(item.type || "text");
      const media = ["image", "video", "audio", "music"].includes(type);
      const url = shownUrl(item.url, media);
      const thumb = display ? shownUrl(item.thumb_url, media) : null;
      const box = el("figure", { class: `content content-${type.replace(/[^a-z]/gi, "")}` });
      if (type === "image" && url) {
        const img = el("img", { src: thumb || url, alt: item.text || "", loading: "lazy" });
        img.addEventListener("error", () => {
          img.replaceWith(el("div", { class: "img-missing", text: t("content.imageMissing") }));
        });
        box.append(img);
      } else if (type === "video" && url) {
        box.append(el("video", { src: url, controls: true, playsinline: true, loop: true }));
      } else if ((type === "audio" || type === "music") && url) {
        box.append(el("audio", { src: url, controls: true }));
      } else if (url) {
        box.append(el("a", { href: url, target: "_blank", rel: "noopener", text: t("content.open") }));
      }
      if (item.text) box.append(el("figcaption", { text: item.text }));
      out.push(box);
    }
    return out;
  }

  function fmtNumber(n) {
    if (n == null || n === "") return t("common.none");
    const x = Number(n);
    if (!Number.isFinite(x)) return String(n);
    return x.toLocaleString(current, { maximumFractionDigits: 2 });
  }

  // A date and time, for what happens later than today (a purge).
  function fmtDateTime(iso) {
    if (!iso) return t("common.none");
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return d.toLocaleString(current, { dateStyle: "medium", timeStyle: "short" });
  }

  // A size in bytes as people read it: 512 B, 38 KB, 4.2 MB.
  function fmtBytes(n) {
    const x = Number(n);
    if (!Number.isFinite(x) || x < 0) return t("common.none");
    if (x < 1024) return `${x} B`;
    if (x < 1024 * 1024) return `${(x / 1024).toLocaleString(current, { maximumFractionDigits: 0 })} KB`;
    if (x < 1024 ** 3) return `${(x / 1024 ** 2).toLocaleString(current, { maximumFractionDigits: 1 })} MB`;
    return `${(x / 1024 ** 3).toLocaleString(current, { maximumFractionDigits: 2 })} GB`;
  }

  // A duration as the server writes it ("8s", "1m 30s", "2h", "30days",
  // "250ms") in milliseconds; null when it cannot be read.
  const DURATION_UNITS = [
    [/^(ms|msec|millis|milliseconds?)$/, 1],
    [/^(s|sec|secs|seconds?)$/, 1000],
    [/^(m|min|mins|minutes?)$/, 60000],
    [/^(h|hr|hrs|hours?)$/, 3600000],
    [/^(d|days?)$/, 86400000],
    [/^(w|weeks?)$/, 7 * 86400000],
  ];

  function parseDuration(text) {
    if (typeof text === "number") return Number.isFinite(text) && text >= 0 ? text * 1000 : null;
    if (typeof text !== "string" || !text.trim()) return null;
    const parts = text.trim().split(/\s+/);
    let ms = 0;
    for (const part of parts) {
      const m = /^(\d+(?:\.\d+)?)([a-z]*)$/i.exec(part);
      if (!m) return null;
      const unit = DURATION_UNITS.find(([re]) => re.test(m[2] || "s"));
      if (!unit) return null;
      ms += Number(m[1]) * unit[1];
    }
    return ms;
  }

  // Copies `text` to the clipboard; true when it went there. Without the
  // clipboard API (plain http on a phone), the old way: a selected,
  // hidden text field and the copy command.
  async function copyText(text) {
    try {
      if (navigator.clipboard && navigator.clipboard.writeText) {
        await navigator.clipboard.writeText(text);
        return true;
      }
    } catch (_) {
      /* refused: try the old way */
    }
    try {
      const field = el("textarea", { class: "visually-hidden", readonly: true });
      field.value = text;
      document.body.append(field);
      field.select();
      const ok = Boolean(document.execCommand && document.execCommand("copy"));
      field.remove();
      return ok;
    } catch (_) {
      return false;
    }
  }

  function fmtTime(iso) {
    if (!iso) return t("common.none");
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return d.toLocaleTimeString(current, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }

  // ---- storage (never throws: private modes may refuse it) ---------------

  // A session's participant token, kept by the device that made it (the
  // phone page) so that its result page (/r/...) can offer to erase it.
  const ownerKey = (sessionId) => `stagehand:owner:${sessionId}`;

  function load(store, key) {
    try {
      const s = store().getItem(key);
      return s == null ? null : JSON.parse(s);
    } catch (_) {
      return null;
    }
  }

  function save(store, key, value) {
    try {
      if (value == null) store().removeItem(key);
      else store().setItem(key, JSON.stringify(value));
    } catch (_) {
      /* storage full or refused: the page still works without it */
    }
  }

  // A guest's Print button and the status line of their newest print, as
  // the phone page and the share page show them. `els`: {box, button,
  // status}; `who()`: {sessionId, token} or null. `show(view, perGuest)`
  // draws a session view's prints under the experience's
  // prints_per_guest; a print still open is followed (every second) until
  // it ends. A press is sent with one Idempotency-Key, kept across its
  // retries, so a retry never makes a second print.
  function printBox(els, who) {
    let key = null;
    let timer = null;
    let perGuest = 0;

    function show(view, bound) {
      perGuest = Number(bound) || 0;
      const allowed = perGuest > 0 && view && view.erased !== true;
      els.box.hidden = !allowed;
      clearTimeout(timer);
      if (!allowed) return;
      const prints = Array.isArray(view.prints) ? view.prints : [];
      const last = prints[prints.length - 1];
      const used = prints.filter((p) => p.requested_by === "guest" && p.status !== "CANCELED").length;
      const left = used < perGuest;
      els.button.disabled = !left;
      els.button.textContent = t(used && left ? "participant.printAgain" : "participant.print");
      els.status.textContent = last ? [last.status_text, last.reason].filter(Boolean).join(" · ") : "";
      els.status.dataset.status = last ? last.status : "";
      if (last && ["QUEUED", "SENDING", "PRINTING"].includes(last.status)) {
        timer = setTimeout(follow, 1000);
      }
    }

    async function follow() {
      const w = who();
      if (!w) return;
      try {
        const { data } = await api(`/api/sessions/${encodeURIComponent(w.sessionId)}`, { token: w.token });
        show(data, perGuest);
      } catch (_) {
        timer = setTimeout(follow, 3000);
      }
    }

    async function ask() {
      const w = who();
      if (!w || els.button.disabled) return;
      els.button.disabled = true;
      key = key || uuid();
      try {
        for (let attempt = 0; ; attempt++) {
          try {
            await api(`/api/sessions/${encodeURIComponent(w.sessionId)}/print`, { method: "POST", token: w.token, key });
            break;
          } catch (err) {
            if (!retryable(err) || attempt >= 3) throw err;
            await sleep(backoff(attempt, 4000));
          }
        }
        key = null;
        await follow();
      } catch (err) {
        key = null;
        els.status.textContent = errorText(err);
        els.button.disabled = false;
      }
    }

    els.button.addEventListener("click", ask);
    return { show, stop: () => clearTimeout(timer) };
  }

  // A guest's mail box, as the phone page and the share page show it: an
  // address, the organiser's consent text as the label of a box to tick
  // (never ticked in advance), the marketing opt-in apart when the
  // experience offers one, Send, and the session's mails with their
  // masked address and status. `box`: an empty element it draws in;
  // `who()`: {sessionId, token} or null. `show(view, offer)` draws a
  // session view under the experience's `mail` offer: nothing at all
  // (hidden and empty) without an offer or a completed, kept result. A
  // mail still queued is followed (the session view, every 1.5 s) until
  // it ends. A press is sent with one Idempotency-Key, kept while it got
  // no answer: pressed again with the same address, the same key goes,
  // so a lost answer never makes a second mail. The address stays in the
  // field and the request body only: never in the URL, the storage or a
  // log.
  function mailBox(box, who) {
    let offer = null;
    let view = null;
    let timer = null;
    let gen = 0;
    let sending = false;
    let full = false;
    // A press that got no answer: {key, text (its body), sessionId}.
    let pending = null;
    let ui = null;

    const errorId = (field) => `mail-${field}-error`;

    function build() {
      const email = el("input", {
        id: "mail-email",
        type: "email",
        autocomplete: "email",
        inputmode: "email",
        autocapitalize: "off",
        spellcheck: "false",
        maxlength: "254",
        enterkeyhint: "send",
        required: true,
        placeholder: t("mail.placeholder"),
        "aria-describedby": errorId("email"),
      });
      const consent = el("input", { id: "mail-consent", type: "checkbox", required: true, "aria-describedby": errorId("consent") });
      const marketing = el("input", { id: "mail-marketing", type: "checkbox" });
      const u = {
        email,
        consent,
        marketing,
        consentText: el("span", { id: "mail-consent-text", class: "consent-text" }),
        marketingText: el("span", { id: "mail-marketing-text" }),
        emailError: el("p", { id: errorId("email"), class: "error field-error", role: "alert", hidden: true }),
        consentError: el("p", { id: errorId("consent"), class: "error field-error", role: "alert", hidden: true }),
        send: el("button", { id: "mail-send", type: "submit", class: "btn btn-primary" }),
        note: el("p", { id: "mail-note", class: "mail-note", role: "status", "aria-live": "polite", hidden: true }),
        left: el("p", { id: "mail-left", class: "muted small mail-left", hidden: true }),
        list: el("ul", { id: "mail-list", class: "mail-list", "aria-label": t("mail.list"), hidden: true }),
      };
      u.marketingField = el("label", { id: "mail-marketing-field", class: "check-field", hidden: true }, marketing, u.marketingText);
      // No name on the field and no action: the address never goes
      // anywhere but in the request's body.
      u.form = el("form", { id: "mail-form", class: "mail-form", novalidate: true },
        el("h3", { text: t("mail.title") }),
        el("p", { class: "muted small", text: t("mail.help") }),
        el("label", { class: "field", for: "mail-email" }, el("span", { text: t("mail.address") }), email),
        u.emailError,
        el("label", { id: "mail-consent-field", class: "check-field" }, consent, u.consentText),
        u.consentError,
        u.marketingField,
        u.send,
        u.note,
        u.left);
      u.form.addEventListener("submit", send);
      email.addEventListener("input", () => fieldError("email", ""));
      consent.addEventListener("change", () => {
        if (consent.checked) fieldError("consent", "");
      });
      box.replaceChildren(u.form, u.list);
      return u;
    }

    // The text of `texts` ({"en", "ko"} or a plain text) in the page's
    // language, else English, else any.
    function localized(texts) {
      if (texts == null) return "";
      if (typeof texts === "string") return texts;
      if (typeof texts !== "object") return "";
      return texts[current] || texts.en || Object.values(texts).find((x) => typeof x === "string" && x) || "";
    }

    function fieldError(field, text) {
      if (!ui) return;
      const n = field === "consent" ? ui.consentError : ui.emailError;
      const input = field === "consent" ? ui.consent : ui.email;
      n.textContent = text || "";
      n.hidden = !text;
      if (text) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    }

    function note(text, isError) {
      if (!ui) return;
      ui.note.textContent = text || "";
      ui.note.hidden = !text;
      ui.note.classList.toggle("error", Boolean(isError));
    }

    function refresh() {
      if (!ui) return;
      const locked = sending || full;
      ui.email.disabled = locked;
      ui.consent.disabled = locked;
      ui.marketing.disabled = locked;
      ui.send.disabled = locked;
      const used = emailsOf(view).filter((m) => m.status !== "CANCELED").length;
      ui.send.textContent = t(sending ? "mail.sending" : used && !full ? "mail.sendAnother" : "mail.send");
    }

    const emailsOf = (v) => (v && Array.isArray(v.emails) ? v.emails.filter((m) => m && typeof m === "object") : []);

    function show(v, o) {
      clearTimeout(timer);
      timer = null;
      const before = offer;
      offer = o && typeof o === "object" ? o : null;
      view = v || null;
      const allowed = Boolean(offer && view && view.status === "COMPLETED" && view.erased !== true);
      if (!allowed) {
        hide();
        return;
      }
      if (!ui) ui = build();
      box.hidden = false;
      // New texts: what was agreed to before is not agreed to these.
      if (before && before.notice_version !== offer.notice_version) {
        ui.consent.checked = false;
        ui.marketing.checked = false;
      }
      ui.consentText.textContent = localized(offer.consent);
      const marketing = offer.marketing == null ? "" : localized(offer.marketing);
      ui.marketingField.hidden = !marketing;
      ui.marketingText.textContent = marketing;
      if (!marketing) ui.marketing.checked = false;

      const emails = emailsOf(view);
      ui.list.replaceChildren(...emails.map((m) => {
        const status = String(m.status || "QUEUED");
        return el("li", { class: `mail-item mail-${status.toLowerCase().replace(/[^a-z]/g, "")}`, dataset: { status, emailId: String(m.email_id || "") } },
          el("span", { class: "mail-address", text: m.address || t("mail.addressGone") }),
          el("span", { class: "mail-status", text: t(`mail.status.${status}`) }));
      }));
      ui.list.hidden = !emails.length;
      const used = emails.filter((m) => m.status !== "CANCELED").length;
      const perGuest = Number(offer.per_guest) || 0;
      full = perGuest > 0 && used >= perGuest;
      ui.left.hidden = !used;
      ui.left.textContent = full ? t("mail.limitReached") : t("mail.left", { n: Math.max(0, perGuest - used) });
      refresh();
      if (emails.some((m) => m.status === "QUEUED" || m.status === "SENDING")) timer = setTimeout(follow, 1500);
    }

    // Nothing drawn: no offer, no result, or the result erased.
    function hide() {
      clearTimeout(timer);
      timer = null;
      gen += 1;
      ui = null;
      pending = null;
      sending = false;
      box.replaceChildren();
      box.hidden = true;
    }

    async function follow() {
      const w = who();
      if (!w || !view || w.sessionId !== view.session_id) return;
      const g = gen;
      try {
        const { data } = await api(`/api/sessions/${encodeURIComponent(w.sessionId)}`, { token: w.token });
        if (g !== gen) return;
        show(data, offer);
      } catch (err) {
        if (g !== gen) return;
        if (err instanceof ApiError && [401, 404, 410].includes(err.status)) return;
        timer = setTimeout(follow, 3000);
      }
    }

    // The offer again (the consent text changed since the page read it).
    async function reloadOffer() {
      const slug = view && view.experience;
      if (!slug) return null;
      try {
        const { data } = await api(`/api/experiences/${encodeURIComponent(slug)}`);
        return data ? data.mail || null : null;
      } catch (_) {
        return undefined;
      }
    }

    // Sent again with the same key: no answer, the same key still in
    // progress, or the server briefly unable to answer.
    function worthRetrying(err) {
      if (err instanceof NetworkError) return true;
      return err instanceof ApiError && (err.code === "request_in_progress" || (err.status >= 500 && err.code !== "mail_unavailable"));
    }

    async function send(ev) {
      ev.preventDefault();
      if (!ui || sending || full || !offer || !view) return;
      const w = who();
      if (!w) return;
      fieldError("email", "");
      fieldError("consent", "");
      note("");
      const address = ui.email.value.trim();
      if (!address || !address.includes("@") || /[\r\n]/.test(address)) {
        fieldError("email", t("mail.error.invalid_email"));
        ui.email.focus();
        return;
      }
      if (!ui.consent.checked) {
        fieldError("consent", t("mail.error.consent_required"));
        ui.consent.focus();
        return;
      }
      const body = {
        email: address,
        consent: true,
        marketing: !ui.marketingField.hidden && ui.marketing.checked,
        notice_version: offer.notice_version,
        locale: current,
      };
      const text = JSON.stringify(body);
      if (!pending || pending.text !== text || pending.sessionId !== w.sessionId) {
        pending = { key: uuid(), text, sessionId: w.sessionId };
      }
      const g = gen;
      sending = true;
      refresh();
      try {
        for (let attempt = 0; ; attempt++) {
          try {
            await api(`/api/sessions/${encodeURIComponent(w.sessionId)}/email`, {
              method: "POST",
              token: w.token,
              key: pending.key,
              body,
            });
            break;
          } catch (err) {
            if (!worthRetrying(err) || attempt >= 3) throw err;
            await sleep(backoff(attempt, 4000));
          }
        }
        if (g !== gen) return;
        pending = null;
        sending = false;
        ui.email.value = "";
        ui.consent.checked = false;
        ui.marketing.checked = false;
        note(t("mail.queued"), false);
        refresh();
        await follow();
      } catch (err) {
        if (g !== gen) return;
        sending = false;
        // Answered: the key is spent. No answer: it is kept for the next
        // press (the same address and boxes send the same key).
        if (!worthRetrying(err)) pending = null;
        refresh();
        await refused(err);
      }
    }

    // The refusal in plain words, next to the field it names.
    async function refused(err) {
      if (!(err instanceof ApiError)) {
        note(errorText(err), true);
        return;
      }
      const field = err.body && err.body.field;
      const key = `mail.error.${err.code}`;
      let words = t(key) !== key ? t(key, { n: offer ? offer.per_guest : "" }) : errorText(err);
      if (err.code === "conflict") {
        const fresh = await reloadOffer();
        if (fresh === null) {
          hide();
          return;
        }
        if (fresh && offer && fresh.notice_version !== offer.notice_version) {
          show(view, fresh);
          words = t("mail.error.noticeChanged");
          fieldError("consent", words);
          return;
        }
      }
      if (field === "email" || field === "consent") {
        fieldError(field, words);
        (field === "consent" ? ui.consent : ui.email).focus();
      } else {
        note(words, true);
      }
      if (err.code === "mail_limit" || err.code === "gone") await follow();
    }

    return { show, hide, stop: () => { clearTimeout(timer); gen += 1; } };
  }

  return {
    uuid,
    printBox,
    mailBox,
    api,
    ApiError,
    NetworkError,
    retryable,
    backoff,
    sleep,
    wsUrl,
    loadLocale,
    locale: () => current,
    t,
    translate,
    errorText,
    el,
    $,
    showOnly,
    renderContent,
    shownUrl,
    fmtNumber,
    fmtTime,
    fmtDateTime,
    fmtBytes,
    parseDuration,
    copyText,
    local: {
      get: (k) => load(() => localStorage, k),
      set: (k, v) => save(() => localStorage, k, v),
    },
    session: {
      get: (k) => load(() => sessionStorage, k),
      set: (k, v) => save(() => sessionStorage, k, v),
    },
    owner: {
      get: (sessionId) => load(() => localStorage, ownerKey(sessionId)),
      set: (sessionId, token) => save(() => localStorage, ownerKey(sessionId), token),
    },
  };
})();
