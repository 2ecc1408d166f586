// An experience's gallery, /g/{slug}: its results as a grid of thumbnails,
// newest first, with More (and infinite scroll) for older ones and a
// lightbox for each. A PIN gallery asks for its PIN first; the PIN is sent
// as X-Gallery-Pin with every request and kept in sessionStorage (this tab
// only). Live: the first page is read again every 5 s; new results come in
// at the top, and a result that left the first page while newer than its
// oldest item (hidden by an operator, or erased by its guest) leaves the
// grid at once.
"use strict";

(() => {
  const slug = decodeURIComponent(location.pathname.split("/")[2] || "");
  const PIN_KEY = `stagehand:g:${slug}:pin`;
  const PAGE = 24;
  const POLL_MS = 5000;
  const VIEWS = ["view-loading", "view-missing", "view-error", "view-pin", "view-grid"];

  let pin = SH.session.get(PIN_KEY);
  // The results shown: session id -> {data, node}, and their order
  // (newest first).
  const shown = new Map();
  let order = [];
  // The cursor of the results older than the last one shown (null: none).
  let older = null;
  let loadingMore = false;
  let pollTimer = null;
  let pollGen = 0;
  let lightboxId = null;

  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  const show = (id) => SH.showOnly(VIEWS, id);
  const timeOf = (item) => {
    const ms = Date.parse(item && item.completed_at);
    return Number.isFinite(ms) ? ms : 0;
  };

  // ---- requests --------------------------------------------------------------

  function fetchPage(before) {
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (before) q.set("before", before);
    return SH.api(`/api/experiences/${enc(slug)}/gallery?${q}`, {
      headers: pin ? { "X-Gallery-Pin": pin } : undefined,
      timeoutMs: 15000,
    });
  }

  // An error of the gallery's API: the view it calls for. True when it
  // left the grid (no polling until the guest acts).
  function onError(err) {
    if (err instanceof SH.ApiError && err.status === 404) {
      stopPolling();
      show("view-missing");
      return true;
    }
    if (err instanceof SH.ApiError && err.status === 401) {
      const wrong = err.code === "gallery_pin_wrong";
      if (wrong || err.code === "gallery_pin_required" || err.code === "gallery_pin_outdated") {
        forgetPin();
        showPin(wrong ? SH.t("g.pinWrong") : err.code === "gallery_pin_outdated" ? SH.t("g.pinOutdated") : "");
        return true;
      }
    }
    if (err instanceof SH.ApiError && err.status === 429 && err.code === "gallery_locked") {
      forgetPin();
      showPin(SH.t("g.locked", { m: Math.max(1, Math.ceil((err.retryAfter || 60) / 60)) }));
      return true;
    }
    if (err instanceof SH.ApiError && err.status === 429) {
      forgetPin();
      showPin(SH.t("g.rateLimited", { s: Math.ceil(err.retryAfter || 30) }));
      return true;
    }
    if ($("view-grid").hidden) {
      $("error-text").textContent = SH.errorText(err);
      show("view-error");
      return true;
    }
    // What is shown stays; a note says it is not current.
    note(SH.errorText(err));
    return false;
  }

  function note(text) {
    $("grid-note").textContent = text || "";
    $("grid-note").hidden = !text;
  }

  // ---- the PIN ---------------------------------------------------------------

  function forgetPin() {
    pin = null;
    SH.session.set(PIN_KEY, null);
  }

  function showPin(error) {
    stopPolling();
    closeLightbox();
    $("pin-error").textContent = error || "";
    $("pin-error").hidden = !error;
    $("pin").value = "";
    $("pin-go").disabled = false;
    show("view-pin");
    $("pin").focus();
  }

  async function onPin(ev) {
    ev.preventDefault();
    const value = $("pin").value.trim();
    if (!/^[0-9]{1,12}$/.test(value)) {
      $("pin-error").textContent = SH.t("g.pinDigits");
      $("pin-error").hidden = false;
      $("pin").focus();
      return;
    }
    pin = value;
    SH.session.set(PIN_KEY, pin);
    $("pin-go").disabled = true;
    await loadFirst();
    $("pin-go").disabled = false;
  }

  // ---- the first page (and every 5 s) ---------------------------------------------

  function stopPolling() {
    clearTimeout(pollTimer);
    pollTimer = null;
    pollGen += 1;
  }

  async function loadFirst() {
    stopPolling();
    const gen = pollGen;
    let ok = false;
    try {
      const { data } = await fetchPage(null);
      if (gen !== pollGen) return;
      applyFirst(data || {});
      note("");
      ok = true;
    } catch (err) {
      if (gen !== pollGen) return;
      if (onError(err)) return;
    }
    if (ok || !$("view-grid").hidden) pollTimer = setTimeout(loadFirst, POLL_MS);
  }

  // The first page as the server has it now: new results at the top; a
  // shown result missing from it and newer than its oldest item is gone
  // (hidden or erased); with no next page, the page is the whole gallery.
  function applyFirst(data) {
    const page = (Array.isArray(data.items) ? data.items : []).filter((i) => i && i.session_id);
    const first = order.length === 0;
    const inPage = new Set(page.map((i) => i.session_id));
    const whole = !data.next;
    const oldest = page.length ? Math.min(...page.map(timeOf)) : Infinity;
    for (const id of order) {
      if (inPage.has(id)) continue;
      if (whole || timeOf(shown.get(id).data) > oldest) remove(id);
    }
    for (const item of page) keep(item);
    const rest = order.filter((id) => shown.has(id) && !inPage.has(id));
    order = [...page.map((i) => i.session_id), ...rest];
    if (first) older = data.next || null;
    else if (whole && !rest.length) older = null;
    render();
  }

  async function loadMore() {
    if (loadingMore || !older) return;
    loadingMore = true;
    $("more").disabled = true;
    const gen = pollGen;
    try {
      const { data } = await fetchPage(older);
      const page = ((data && data.items) || []).filter((i) => i && i.session_id);
      for (const item of page) {
        if (!shown.has(item.session_id)) {
          keep(item);
          order.push(item.session_id);
        }
      }
      older = (data && data.next) || null;
      render();
    } catch (err) {
      if (gen === pollGen) onError(err);
    } finally {
      loadingMore = false;
      $("more").disabled = false;
    }
  }

  // ---- the grid ----------------------------------------------------------------

  function keep(item) {
    const had = shown.get(item.session_id);
    if (had && JSON.stringify(had.data) === JSON.stringify(item)) return;
    const node = tile(item);
    if (had) had.node.replaceWith(node);
    shown.set(item.session_id, { data: item, node });
  }

  function remove(id) {
    const had = shown.get(id);
    if (!had) return;
    had.node.remove();
    shown.delete(id);
    if (lightboxId === id) closeLightbox();
  }

  function render() {
    const nodes = order.map((id) => shown.get(id).node);
    const grid = $("grid");
    if (nodes.length !== grid.children.length || nodes.some((n, i) => grid.children[i] !== n)) {
      grid.replaceChildren(...nodes);
    }
    $("grid-empty").hidden = nodes.length > 0;
    $("more").hidden = !older;
    show("view-grid");
  }

  // One result: its first picture's thumbnail (a video's, or the video),
  // a note for a sound, its words for a text; and the nickname.
  function tile(item) {
    const content = Array.isArray(item.content) ? item.content.filter(Boolean) : [];
    const media = content.find((c) => ["image", "video", "audio", "music"].includes(c.type) && SH.shownUrl(c.url, true));
    const main = media || content[0] || {};
    let face;
    const thumb = SH.shownUrl(main.thumb_url, true);
    const url = SH.shownUrl(main.url, true);
    if (main.type === "image" || (main.type === "video" && thumb)) {
      face = SH.el("img", { src: thumb || url, alt: main.text || "", loading: "lazy" });
      face.addEventListener("error", () => face.replaceWith(SH.el("span", { class: "g-text", text: SH.t("content.imageMissing") })));
    } else if (main.type === "video" && url) {
      face = SH.el("video", { src: url, muted: true, playsinline: true, preload: "metadata" });
    } else if ((main.type === "audio" || main.type === "music") && url) {
      face = SH.el("span", { class: "g-icon", "aria-hidden": "true", text: "♪" });
    } else {
      face = SH.el("span", { class: "g-text", text: main.text || "" });
    }
    const open = SH.el("button", {
      type: "button",
      class: `g-open g-${String(main.type || "text").replace(/[^a-z]/gi, "")}`,
      "aria-label": SH.t("g.open", { nickname: item.nickname || "" }),
    }, face);
    open.addEventListener("click", () => openLightbox(item.session_id));
    return SH.el("li", { class: "g-item", dataset: { sessionId: item.session_id } },
      open,
      SH.el("span", { class: "g-name", text: item.nickname || "" }));
  }

  // ---- the lightbox --------------------------------------------------------------

  function openLightbox(id) {
    const had = shown.get(id);
    if (!had) return;
    lightboxId = id;
    $("lightbox-content").replaceChildren(...SH.renderContent(had.data.content));
    $("lightbox-name").textContent = had.data.nickname || "";
    $("lightbox").hidden = false;
    document.body.classList.add("lightbox-open");
    $("lightbox-close").focus();
  }

  function closeLightbox() {
    if ($("lightbox").hidden) return;
    const id = lightboxId;
    lightboxId = null;
    $("lightbox").hidden = true;
    $("lightbox-content").replaceChildren();
    document.body.classList.remove("lightbox-open");
    const had = id && shown.get(id);
    if (had) had.node.querySelector("button").focus();
  }

  // ---- start -----------------------------------------------------------------------

  async function loadExperience() {
    for (let attempt = 0; ; attempt++) {
      try {
        const { data } = await SH.api(`/api/experiences/${enc(slug)}`);
        return data;
      } catch (err) {
        if (err instanceof SH.ApiError && err.status === 404) return null;
        if (!SH.retryable(err) || attempt >= 2) return undefined;
        await SH.sleep(SH.backoff(attempt, 5000));
      }
    }
  }

  async function init() {
    await SH.loadLocale(/^ko\b/i.test(navigator.language || "") ? "ko" : "en");
    const experience = slug ? await loadExperience() : null;
    if (experience === null || (experience && experience.gallery === "off")) {
      show("view-missing");
      return;
    }
    if (experience) {
      await SH.loadLocale(experience.locale || "en");
      document.title = `${experience.title} · ${SH.t("g.badge")}`;
      $("title").textContent = experience.title;
    }
    $("view-pin").addEventListener("submit", onPin);
    $("reload").addEventListener("click", () => {
      show("view-loading");
      loadFirst();
    });
    $("more").addEventListener("click", loadMore);
    $("lightbox-close").addEventListener("click", closeLightbox);
    // A click anywhere closes it, but on a video's or a sound's controls.
    $("lightbox").addEventListener("click", (ev) => {
      if (ev.target.closest("video, audio, a")) return;
      closeLightbox();
    });
    document.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape") closeLightbox();
    });
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && pollTimer) loadFirst();
    });
    if ("IntersectionObserver" in window) {
      new IntersectionObserver((entries) => {
        if (entries.some((e) => e.isIntersecting)) loadMore();
      }, { rootMargin: "400px" }).observe($("more"));
    }
    await loadFirst();
  }

  init();
})();
