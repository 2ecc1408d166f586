// A result link's page, /r/{share_id}: the guest's result large, the
// experience's title, Download (the full kept file, as an attachment),
// Share (the file itself where the phone can share files, else the link,
// else the link copied), a QR code of the link for a friend's phone, and —
// only on the device that made the session (its participant token is in
// localStorage) — Print, while the experience lets guests print, the mail
// box, while it lets them ask for mail (SH.mailBox), and a button that
// erases the guest's photo and result.
// A result that is gone (erased, or past the organiser's retention) reads
// as deleted; the server answers the link itself with 410 then.
"use strict";

(() => {
  const shareId = decodeURIComponent(location.pathname.split("/")[2] || "");
  const VIEWS = ["view-loading", "view-missing", "view-gone", "view-error", "view-result", "view-erased"];

  let result = null;
  // The shared file (where the phone can share files): fetched when the
  // page loads, so that the tap on Share still counts as the guest's when
  // the share sheet opens.
  let sharedFile = null;

  const $ = (id) => document.getElementById(id);
  const show = (id) => SH.showOnly(VIEWS, id);
  const link = () => `${location.origin}/r/${encodeURIComponent(shareId)}`;

  // The language before the answer says the experience's: the browser's.
  const browserLocale = () => (/^ko\b/i.test(navigator.language || "") ? "ko" : "en");

  // ---- loading ---------------------------------------------------------------

  async function load() {
    show("view-loading");
    if (!/^[0-9A-Za-z_-]{1,128}$/.test(shareId)) {
      show("view-missing");
      return;
    }
    for (let attempt = 0; ; attempt++) {
      try {
        const { data } = await SH.api(`/api/share/${encodeURIComponent(shareId)}`);
        result = data || {};
        break;
      } catch (err) {
        if (err instanceof SH.ApiError && err.status === 404) {
          show("view-missing");
          return;
        }
        if (err instanceof SH.ApiError && err.status === 410) {
          showGone(err.body && err.body.message);
          return;
        }
        if (!SH.retryable(err) || attempt >= 2) {
          $("error-text").textContent = SH.errorText(err);
          show("view-error");
          return;
        }
        await SH.sleep(SH.backoff(attempt, 4000));
      }
    }
    await SH.loadLocale(result.locale || "en");
    render();
  }

  function showGone(detail) {
    $("gone-detail").textContent = detail || "";
    $("gone-detail").hidden = !detail;
    show("view-gone");
  }

  // ---- the result ------------------------------------------------------------

  function render() {
    const r = result;
    const title = r.title || "stagehand";
    document.title = title;
    $("title").textContent = title;
    $("byline").textContent = r.nickname ? SH.t("r.by", { nickname: r.nickname }) : "";
    $("byline").hidden = !r.nickname;
    $("result-content").replaceChildren(...SH.renderContent(r.content));
    const stats = [];
    if (r.score != null) {
      stats.push(SH.el("div", { class: "stat" },
        SH.el("dt", { text: SH.t("p.score.label") }),
        SH.el("dd", { class: "score", text: SH.fmtNumber(r.score) })));
    }
    $("result-stats").replaceChildren(...stats);
    $("result-stats").hidden = !stats.length;
    $("result-when").textContent = r.completed_at ? SH.t("r.completedAt", { time: SH.fmtDateTime(r.completed_at) }) : "";

    // Download: the server answers with the whole kept file as an
    // attachment (its own path only).
    const download = SH.shownUrl(r.download_url, false);
    $("download").hidden = !(download && download.startsWith("/"));
    if (!$("download").hidden) $("download").href = download;
    else $("download").removeAttribute("href");

    $("qr").src = `/r/${encodeURIComponent(shareId)}/qr.svg`;
    $("share-note").hidden = true;

    const token = ownerToken(r);
    $("owner").hidden = !token;
    $("erase-error").hidden = true;
    show("view-result");
    prepareFile();
    showPrints(token);
  }

  // ---- printing and mail -----------------------------------------------------

  // Print and mail, on the device that made the session only (its token):
  // the experience's prints_per_guest and `mail` offer with the session's
  // prints and mails, as on the phone page (SH.printBox, SH.mailBox).
  // Anyone else with the link sees neither.
  let printing = null;
  let mailing = null;

  async function showPrints(token) {
    $("print-box").hidden = true;
    if (mailing) mailing.hide();
    if (!token || !result.experience) return;
    printing = printing || SH.printBox(
      { box: $("print-box"), button: $("print"), status: $("print-status") },
      () => ({ sessionId: result.session_id, token: ownerToken(result) }),
    );
    mailing = mailing || SH.mailBox(
      $("mail-box"),
      () => {
        const owner = ownerToken(result);
        return owner ? { sessionId: result.session_id, token: owner } : null;
      },
    );
    try {
      const [experience, view] = await Promise.all([
        SH.api(`/api/experiences/${encodeURIComponent(result.experience)}`),
        SH.api(`/api/sessions/${encodeURIComponent(result.session_id)}`, { token }),
      ]);
      printing.show(view.data, experience.data ? experience.data.prints_per_guest : 0);
      mailing.show(view.data, experience.data ? experience.data.mail : null);
    } catch (_) {
      /* no Print or mail without the experience and the session: the rest works */
    }
  }

  // The participant token of this result's session, when this device made
  // it: kept by the phone page by session id, or still its current session.
  function ownerToken(r) {
    if (!r.session_id) return null;
    const kept = SH.owner.get(r.session_id);
    if (typeof kept === "string" && kept) return kept;
    const phone = r.experience ? SH.local.get(`stagehand:p:${r.experience}`) : null;
    if (phone && phone.session && phone.session.id === r.session_id && phone.session.token) return phone.session.token;
    return null;
  }

  // ---- sharing ---------------------------------------------------------------

  // The first picture, video or sound of the result, as a File the share
  // sheet can take (fetched from this server only).
  function prepareFile() {
    sharedFile = null;
    if (!navigator.share || !navigator.canShare) return;
    const item = (result.content || []).find((c) => c && ["image", "video", "audio", "music"].includes(c.type) && c.url);
    const url = item && SH.shownUrl(item.url, true);
    if (!url || !url.startsWith("/")) return;
    sharedFile = fetch(url, { cache: "force-cache" })
      .then((res) => (res.ok ? res.blob() : null))
      .then((blob) => {
        if (!blob) return null;
        const ext = (url.split("?")[0].match(/\.(\w{2,5})$/) || [])[1] || (blob.type.split("/")[1] || "bin");
        const name = `${result.experience || "result"}-${shareId.slice(0, 8)}.${ext}`;
        return new File([blob], name, { type: blob.type || "application/octet-stream" });
      })
      .catch(() => null);
  }

  function note(text) {
    $("share-note").textContent = text;
    $("share-note").hidden = !text;
  }

  async function onShare() {
    const url = link();
    const title = result.title || document.title;
    if (navigator.share) {
      try {
        const file = sharedFile ? await sharedFile : null;
        if (file && navigator.canShare && navigator.canShare({ files: [file] })) {
          await navigator.share({ files: [file], title, text: title });
          return;
        }
        await navigator.share({ title, url });
        return;
      } catch (err) {
        // The guest closed the share sheet: nothing more to do.
        if (err && err.name === "AbortError") return;
        /* refused (no share target, or not allowed here): copy the link */
      }
    }
    const copied = await SH.copyText(url);
    note(SH.t(copied ? "r.copied" : "r.copyThis", { url }));
  }

  // ---- erasing ---------------------------------------------------------------

  async function onErase() {
    const token = ownerToken(result);
    if (!token || $("erase").disabled) return;
    if (!window.confirm(SH.t("r.eraseConfirm"))) return;
    $("erase").disabled = true;
    $("erase").textContent = SH.t("r.erasing");
    $("erase-error").hidden = true;
    try {
      for (let attempt = 0; ; attempt++) {
        try {
          await SH.api(`/api/sessions/${encodeURIComponent(result.session_id)}`, { method: "DELETE", token });
          break;
        } catch (err) {
          if (!SH.retryable(err) || attempt >= 3) throw err;
          await SH.sleep(SH.backoff(attempt, 4000));
        }
      }
      SH.owner.set(result.session_id, null);
      if (printing) printing.stop();
      if (mailing) mailing.hide();
      $("result-content").replaceChildren();
      $("qr").removeAttribute("src");
      $("download").removeAttribute("href");
      show("view-erased");
    } catch (err) {
      $("erase-error").textContent = SH.errorText(err);
      $("erase-error").hidden = false;
    } finally {
      $("erase").disabled = false;
      $("erase").textContent = SH.t("r.erase");
    }
  }

  // ---- start -----------------------------------------------------------------

  async function init() {
    await SH.loadLocale(browserLocale());
    $("share").addEventListener("click", onShare);
    $("erase").addEventListener("click", onErase);
    $("reload").addEventListener("click", load);
    await load();
  }

  init();
})();
