// The participant page, /p/{slug}[?terminal=ID]: nickname, a photo (when
// the experience's input takes one), prompt (and a score for games), one
// button; then progress, then the result or the reason it was refused, with
// a way to try again.
//
// The guests' data: the organiser's notice shows above the form (read before
// the camera opens); with consent_required the button stays disabled until
// its box is ticked and the submission says "consent": true; with a gallery,
// a box keeps one's result out of it ("in_gallery": false). A completed
// result shows its link (/r/...) with a QR code for another phone, and a
// button that erases the guest's photo and result (DELETE, with the token).
// Under it, where the experience lets guests print or mail, Print
// (SH.printBox) and the mail box (SH.mailBox: an address, the consent
// box, the mails sent and their status).
//
// Safe against double taps, flaky networks and reloads: every POST carries an
// Idempotency-Key made here and kept (in localStorage, per slug) with its
// body until the server answers, so a retry, automatic or after a reload,
// sends the SAME key and the same body and can never create a second session
// or charge twice.
//
// A photo is made ready in the browser as soon as it is chosen: turned
// upright (EXIF), downscaled to the experience's photo_max_px on its long
// side and re-encoded as JPEG, so a 12 MP picture never crosses the venue's
// Wi-Fi whole. It is uploaded on submit (after the session exists, with a
// progress bar), under an Idempotency-Key made with the photo; its key, its
// photo_id once answered, and its bytes are kept in sessionStorage, so a
// reload neither loses it nor uploads it twice.
"use strict";

(() => {
  const slug = decodeURIComponent(location.pathname.split("/")[2] || "");
  const terminalParam = new URLSearchParams(location.search).get("terminal") || null;
  const STORE_KEY = `stagehand:p:${slug}`;
  const AUTO_RETRIES = 5;
  // An ABORTED session is still looked at now and then: an operator may
  // retry it, and then it runs again.
  const ABORTED_POLL_MS = 5000;
  const VIEWS = ["view-loading", "view-missing", "view-form", "view-waiting", "view-result", "view-aborted"];
  // The photo of this tab (sessionStorage): PHOTO_META the small record,
  // PHOTO_BYTES its bytes as a data: URL (apart, so that a refused big one
  // never takes the record with it).
  const PHOTO_META = `${STORE_KEY}:photo`;
  const PHOTO_BYTES = `${STORE_KEY}:photo-bytes`;
  const DEFAULT_PHOTO_MAX_PX = 1536;
  const JPEG_QUALITY = 0.85;
  // Bytes sent as they are (a file the browser cannot draw) are kept for a
  // reload only up to this size.
  const KEEP_RAW_MAX = 2 * 1024 * 1024;
  const UPLOAD_TIMEOUT_MS = 120000;

  // What survives a reload:
  //   nickname, prompt, score   what was typed last
  //   session {id, token}       the session, once created
  //   terminal_id               the terminal the session was made for
  //   create {key, body}        a session creation not answered yet
  //   submit {key, body}        a submission not answered yet
  //   locale                    to show the right language before loading
  //   queue {position, until}   the 202's queue position and the time its
  //                             estimated wait ends (epoch ms), if given
  const st = SH.local.get(STORE_KEY) || {};
  // The chosen photo (module comment), or null:
  //   ref                  this photo (a new one for each choice)
  //   key                  the Idempotency-Key of its upload
  //   session              the session it is (to be) uploaded to
  //   id, width, height    the server's answer, once it stored it
  //   raw, name            sent as chosen (the browser could not draw it)
  let photo = SH.session.get(PHOTO_META);
  // Its bytes, in memory: {ref, blob, url} (url: a data: URL for the
  // preview, null for a raw file).
  let photoData = null;
  // The stored photo a new choice replaces ({session, id}; see retire()).
  let retired = photo && photo.replaces ? photo.replaces : null;
  // The chosen file while it is being made ready (a Promise).
  let preparing = null;
  let prepareGen = 0;
  let experience = null;
  let busy = false;
  let pollTimer = null;
  let pollFailures = 0;
  let waitingSince = Date.now();

  const $ = (id) => document.getElementById(id);
  const persist = () => SH.local.set(STORE_KEY, st);
  const show = (id) => SH.showOnly(VIEWS, id);
  const pending = () => Boolean(st.create || st.submit);
  const inputKind = () => (experience && experience.input) || "prompt";
  const takesPhoto = () => inputKind() === "photo" || inputKind() === "photo+prompt";
  const needsPrompt = () => inputKind() !== "photo";
  // The organiser's settings for the guests' data: a notice to read before
  // the camera opens, a box to tick before sending (consent_required), and
  // a box to keep one's result out of the gallery (gallery not "off").
  const consentRequired = () => Boolean(experience && experience.consent_required === true);
  const galleryOn = () => Boolean(experience && experience.gallery && experience.gallery !== "off");

  // ---- the form ------------------------------------------------------------

  function setError(text) {
    $("form-error").textContent = text || "";
    $("form-error").hidden = !text;
  }

  function setNote(text) {
    $("form-note").textContent = text || "";
    $("form-note").hidden = !text;
  }

  function buttonLabel() {
    return SH.t(experience && experience.kind === "score" ? "p.submitScore" : "p.submit");
  }

  // Busy: the button is disabled while a request is out. A request that got
  // no answer stays pending: the fields hold what it sends, and the button
  // says Retry (it sends the same key again).
  function refreshButton() {
    const go = $("go");
    // Without the box ticked there is nothing to send (a pending request
    // carries its consent already).
    const unconsented = consentRequired() && !$("consent").checked && !pending();
    go.disabled = busy || unconsented;
    go.textContent = busy ? SH.t("p.sending") : pending() ? SH.t("p.retry") : buttonLabel();
    for (const id of ["nickname", "prompt", "score", "photo-take", "photo-retake", "photo-input", "consent", "optout"]) {
      $(id).disabled = busy || pending();
    }
    $("start-over").disabled = busy;
  }

  function showForm() {
    stopPolling();
    const hasSession = Boolean(st.session);
    $("who").hidden = !hasSession;
    $("who-text").textContent = SH.t("p.playingAs", { nickname: st.nickname || "" });
    $("nickname-field").hidden = hasSession;
    $("nickname").value = st.nickname || "";
    $("prompt").value = st.prompt || "";
    $("score-field").hidden = !(experience && experience.kind === "score");
    $("score").value = st.score == null ? "" : st.score;
    $("photo-field").hidden = !takesPhoto();
    $("prompt-field").hidden = !needsPrompt();
    showNotice();
    showPhoto();
    refreshButton();
    show("view-form");
  }

  // The form's values, or null (with the reason shown) when they are not
  // acceptable.
  function readForm() {
    const nickname = $("nickname").value.trim();
    const prompt = $("prompt").value;
    const scoreText = $("score").value.trim();
    if (consentRequired() && !$("consent").checked) {
      setError(SH.t("p.error.consent"));
      $("consent").focus();
      return null;
    }
    if (!st.session && (!nickname || [...nickname].length > 40 || /[\u0000-\u001f\u007f]/.test(nickname))) {
      setError(SH.t("p.error.nickname"));
      $("nickname").focus();
      return null;
    }
    if (takesPhoto() && !photo && !preparing) {
      setError(SH.t("p.error.photo"));
      $("photo-take").focus();
      return null;
    }
    if ((needsPrompt() && !prompt.trim()) || [...prompt].length > 2000) {
      setError(SH.t("p.error.prompt"));
      $("prompt").focus();
      return null;
    }
    let score;
    if (experience.kind === "score") {
      score = Number(scoreText);
      if (!scoreText || !Number.isFinite(score)) {
        setError(SH.t("p.error.score"));
        $("score").focus();
        return null;
      }
    }
    return { nickname: st.session ? st.nickname : nickname, prompt, score, scoreText };
  }

  async function onSubmit(ev) {
    ev.preventDefault();
    if (busy) return; // a double tap
    setError("");
    if (!pending()) {
      const input = readForm();
      if (!input) return;
      st.nickname = input.nickname;
      st.prompt = input.prompt;
      st.score = input.scoreText || null;
      if (!st.session) {
        const body = { nickname: input.nickname };
        if (terminalParam) body.terminal_id = terminalParam;
        st.create = { key: SH.uuid(), body };
      }
      // A photo-only experience takes no prompt; its photo_id is added
      // once the photo is uploaded (run).
      const body = needsPrompt() || input.prompt.trim() ? { prompt: input.prompt } : {};
      if (input.score !== undefined) body.score = input.score;
      if (consentRequired()) body.consent = true;
      if (galleryOn() && $("optout").checked) body.in_gallery = false;
      st.submit = { key: SH.uuid(), body };
      persist();
    }
    await run();
  }

  // ---- the notice, the consent and the gallery ------------------------------

  // The organiser's notice in the page's language, else English, else any.
  function noticeText() {
    const n = experience && experience.notice;
    if (!n) return "";
    if (typeof n === "string") return n;
    if (typeof n !== "object") return "";
    const pick = n[SH.locale()] || n.en || Object.values(n).find((v) => typeof v === "string" && v.trim());
    return typeof pick === "string" ? pick.trim() : "";
  }

  function showNotice() {
    const text = noticeText();
    $("notice").hidden = !text;
    $("notice-text").textContent = text;
    $("consent-field").hidden = !consentRequired();
    $("consent").checked = consentRequired() && st.consent === true;
    $("optout-field").hidden = !galleryOn();
    $("optout").checked = galleryOn() && st.optout === true;
  }

  function onConsentChange() {
    st.consent = $("consent").checked;
    persist();
    if ($("consent").checked && $("form-error").textContent === SH.t("p.error.consent")) setError("");
    refreshButton();
  }

  function onOptOutChange() {
    st.optout = $("optout").checked;
    persist();
  }

  // ---- the photo -----------------------------------------------------------

  // A submission waits for a photo this tab no longer has.
  class PhotoMissing extends Error {}

  // Refusals of the photo itself: another photo is needed.
  const PHOTO_REFUSALS = ["payload_too_large", "unsupported_media_type", "photo_unreadable"];

  function savePhoto() {
    SH.session.set(PHOTO_META, photo);
  }

  // The photo the server stored for this tab's session and that a new one
  // replaces (a retake): the upload names it (?replaces=), so the server
  // gives it up and it does not count against the session's photos.
  function retire(old) {
    if (old && old.id && old.session) retired = { session: old.session, id: old.id };
  }

  function forgetPhoto() {
    retire(photo);
    prepareGen += 1;
    preparing = null;
    photo = null;
    photoData = null;
    SH.session.set(PHOTO_META, null);
    SH.session.set(PHOTO_BYTES, null);
    showPhoto();
  }

  // The bytes of the stored photo after a reload (null: not kept).
  function restorePhotoData() {
    if (!photo) return;
    const kept = SH.session.get(PHOTO_BYTES);
    if (!kept || kept.ref !== photo.ref || typeof kept.url !== "string") return;
    const blob = dataUrlToBlob(kept.url);
    if (blob) photoData = { ref: photo.ref, blob, url: photo.raw ? null : kept.url };
  }

  // After a reload: the photo as this tab kept it. One the server has
  // (photo_id) counts even without its bytes; one it has not and whose
  // bytes are gone is forgotten (the guest takes it again).
  function restorePhoto() {
    restorePhotoData();
    if (photo && !photoData && !photo.id) forgetPhoto();
  }

  function showPhoto() {
    const has = Boolean(photo);
    $("photo-take").hidden = has || Boolean(preparing);
    $("photo-preparing").hidden = !preparing;
    $("photo-preview").hidden = !has;
    if (!has) {
      $("photo-img").removeAttribute("src");
      return;
    }
    const url = photoData && photoData.ref === photo.ref ? photoData.url : null;
    if (url) {
      if ($("photo-img").getAttribute("src") !== url) $("photo-img").src = url;
    } else {
      $("photo-img").removeAttribute("src");
    }
    $("photo-img").hidden = !url;
    // A photo uploaded before a reload whose bytes this tab did not keep
    // still counts: the server has it.
    $("photo-noview").hidden = Boolean(url);
    $("photo-noview-text").textContent = SH.t(photo.raw ? "p.photoNoPreview" : "p.photoReady");
    $("photo-name").textContent = photo.name || "";
    $("photo-size").textContent = photo.width && photo.height && !photo.raw
      ? SH.t("p.photoSize", { w: photo.width, h: photo.height })
      : "";
  }

  function onPhotoChosen() {
    const input = $("photo-input");
    const file = input.files && input.files[0];
    input.value = ""; // the same file chosen again is a change too
    if (!file || busy || pending()) return;
    setError("");
    const gen = ++prepareGen;
    retire(photo);
    photo = null;
    photoData = null;
    SH.session.set(PHOTO_META, null);
    SH.session.set(PHOTO_BYTES, null);
    preparing = preparePhoto(file).then((ready) => {
      if (gen !== prepareGen) return;
      photo = {
        ref: SH.uuid(),
        key: SH.uuid(),
        session: null,
        id: null,
        replaces: retired,
        width: ready.width,
        height: ready.height,
        raw: ready.raw,
        name: ready.raw ? file.name : "",
      };
      photoData = { ref: photo.ref, blob: ready.blob, url: ready.url };
      savePhoto();
      keepPhotoBytes(ready);
      preparing = null;
      showPhoto();
      refreshButton();
    });
    showPhoto();
  }

  async function keepPhotoBytes(ready) {
    if (ready.raw && ready.blob.size > KEEP_RAW_MAX) return;
    try {
      const url = ready.url || (await readAsDataUrl(ready.blob));
      if (photo && photoData && photoData.blob === ready.blob) SH.session.set(PHOTO_BYTES, { ref: photo.ref, url });
    } catch (_) {
      /* not kept: a reload asks for the photo again */
    }
  }

  function takePhoto() {
    if (busy || pending()) return;
    // A phone short of memory may reload the page behind its camera: what
    // was typed is kept first.
    if (!st.session) st.nickname = $("nickname").value.trim();
    st.prompt = $("prompt").value;
    st.score = $("score").value.trim() || null;
    persist();
    $("photo-input").click();
  }

  function retake() {
    if (busy || pending()) return;
    forgetPhoto();
    setError("");
    takePhoto();
  }

  // The chosen file ready to send: {blob, url, width, height, raw}. Drawn
  // upright, at most photo_max_px on its long side, as JPEG; a file the
  // browser cannot draw goes as it is (raw) and the server judges it.
  async function preparePhoto(file) {
    const max = Number(experience && experience.photo_max_px) || DEFAULT_PHOTO_MAX_PX;
    let image = null;
    try {
      image = await decodeImage(file);
      const scale = Math.min(1, max / Math.max(image.width, image.height));
      const width = Math.max(1, Math.round(image.width * scale));
      const height = Math.max(1, Math.round(image.height * scale));
      const canvas = document.createElement("canvas");
      canvas.width = width;
      canvas.height = height;
      const ctx = canvas.getContext("2d");
      ctx.fillStyle = "#fff"; // a transparent PNG on white, not black
      ctx.fillRect(0, 0, width, height);
      ctx.imageSmoothingEnabled = true;
      ctx.imageSmoothingQuality = "high";
      ctx.drawImage(image.source, 0, 0, width, height);
      const blob = await new Promise((resolve) => canvas.toBlob(resolve, "image/jpeg", JPEG_QUALITY));
      if (!blob) throw new Error("the canvas made no JPEG");
      const url = await readAsDataUrl(blob);
      return { blob, url, width, height, raw: false };
    } catch (_) {
      return { blob: file, url: null, width: 0, height: 0, raw: true };
    } finally {
      if (image && image.close) image.close();
    }
  }

  // {source, width, height, close} of a picture, turned upright by its EXIF
  // orientation: createImageBitmap where there is one, else an <img> (which
  // browsers turn upright by default). The <img> reads a data: URL: the
  // pages' policy allows no blob: images.
  async function decodeImage(file) {
    if (typeof createImageBitmap === "function") {
      let bitmap;
      try {
        bitmap = await createImageBitmap(file, { imageOrientation: "from-image" });
      } catch (err) {
        // An older engine that knows only "none"/"flipY" refuses the
        // option's value (a TypeError); its default turns it upright.
        if (!(err instanceof TypeError)) throw err;
        bitmap = await createImageBitmap(file);
      }
      return { source: bitmap, width: bitmap.width, height: bitmap.height, close: () => bitmap.close() };
    }
    const url = await readAsDataUrl(file);
    const img = new Image();
    img.decoding = "async";
    await new Promise((resolve, reject) => {
      img.onload = resolve;
      img.onerror = () => reject(new Error("not a picture"));
      img.src = url;
    });
    return { source: img, width: img.naturalWidth, height: img.naturalHeight, close: null };
  }

  function readAsDataUrl(blob) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(blob);
    });
  }

  function dataUrlToBlob(url) {
    const m = /^data:([^;,]*)(;base64)?,(.*)$/s.exec(url);
    if (!m || !m[2]) return null;
    try {
      const bin = atob(m[3]);
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      return new Blob([bytes], { type: m[1] || "application/octet-stream" });
    } catch (_) {
      return null;
    }
  }

  function setProgress(loaded, total) {
    const pct = total > 0 ? Math.min(100, Math.floor((loaded / total) * 100)) : 0;
    $("upload-progress").value = pct;
    $("upload-text").textContent = SH.t("p.uploading", { pct });
    $("upload").hidden = false;
  }

  // The photo_id of the chosen photo in the current session: uploaded
  // now, or the one the server already gave (no second upload).
  async function uploadPhoto() {
    if (preparing) await preparing;
    if (!photo) throw new PhotoMissing("no photo");
    if (photo.session !== st.session.id) {
      // A new session (Start over, or the old one lost): a new upload.
      photo.session = st.session.id;
      photo.id = null;
      photo.key = SH.uuid();
      savePhoto();
    }
    if (photo.id) return photo.id;
    if (!photoData || photoData.ref !== photo.ref) throw new PhotoMissing("its bytes are gone");
    const replaced = photo.replaces && photo.replaces.session === st.session.id ? photo.replaces.id : null;
    const path = `/api/sessions/${encodeURIComponent(st.session.id)}/photo` +
      (replaced ? `?replaces=${encodeURIComponent(replaced)}` : "");
    const ref = photo.ref;
    setProgress(0, photoData.blob.size);
    try {
      for (let attempt = 0; ; attempt++) {
        try {
          const { data } = await uploadOnce(path, photo.key, photoData.blob);
          if (!photo || photo.ref !== ref) throw new PhotoMissing("retaken meanwhile");
          photo.id = data.photo_id;
          photo.width = data.width || photo.width;
          photo.height = data.height || photo.height;
          savePhoto();
          setProgress(1, 1);
          return photo.id;
        } catch (err) {
          if (err instanceof SH.ApiError || err instanceof SH.NetworkError) err.photo = true;
          if (!SH.retryable(err) || attempt >= AUTO_RETRIES) throw err;
          setNote(SH.t(err instanceof SH.NetworkError ? "p.retrying" : "p.photoBusyRetrying", { n: attempt + 1 }));
          const wait = SH.backoff(attempt, 8000);
          await SH.sleep(Math.max(wait, (err.retryAfter || 0) * 1000));
          setNote("");
        }
      }
    } finally {
      $("upload").hidden = true;
    }
  }

  // One POST of the photo's bytes with upload progress (fetch has none):
  // {status, data}; rejects like SH.api (ApiError with retryAfter, or
  // NetworkError).
  function uploadOnce(path, key, blob) {
    return new Promise((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      xhr.open("POST", path);
      xhr.setRequestHeader("Accept", "application/json");
      xhr.setRequestHeader("Authorization", `Bearer ${st.session.token}`);
      xhr.setRequestHeader("Idempotency-Key", key);
      xhr.timeout = UPLOAD_TIMEOUT_MS;
      xhr.upload.onprogress = (e) => setProgress(e.loaded, e.lengthComputable ? e.total : blob.size);
      xhr.onload = () => {
        let data = null;
        try {
          data = xhr.responseText ? JSON.parse(xhr.responseText) : null;
        } catch (_) {
          data = { message: xhr.responseText.slice(0, 200) };
        }
        if (xhr.status >= 200 && xhr.status < 300) {
          resolve({ status: xhr.status, data: data || {} });
          return;
        }
        const err = new SH.ApiError(xhr.status, data && data.error, data && data.message, data);
        const after = Number(xhr.getResponseHeader("Retry-After"));
        if (Number.isFinite(after) && after > 0) err.retryAfter = Math.min(after, 30);
        reject(err);
      };
      const lost = (what) => () => reject(new SH.NetworkError(what));
      xhr.onerror = lost("the upload failed");
      xhr.ontimeout = lost("the upload timed out");
      xhr.onabort = lost("the upload was aborted");
      xhr.send(blob);
    });
  }

  // ---- sending -------------------------------------------------------------

  // POSTs `req` ({key, body, token}), sending it again with the same key
  // when there was no answer (or the first is still in progress).
  async function send(path, req) {
    for (let attempt = 0; ; attempt++) {
      try {
        return await SH.api(path, { body: req.body, key: req.key, token: req.token });
      } catch (err) {
        if (!SH.retryable(err) || attempt >= AUTO_RETRIES) throw err;
        setNote(SH.t("p.retrying", { n: attempt + 1 }));
        await SH.sleep(SH.backoff(attempt, 8000));
      }
    }
  }

  // Sends whatever is pending: first the session, then the submission.
  async function run() {
    if (busy || !pending()) return;
    busy = true;
    refreshButton();
    setError("");
    setNote("");
    try {
      if (st.create) {
        const { data } = await send(`/api/experiences/${encodeURIComponent(slug)}/sessions`, st.create);
        st.session = { id: data.session_id, token: data.participant_token };
        st.terminal_id = st.create.body.terminal_id || null;
        st.create = null;
        persist();
      }
      if (st.submit) {
        if (!st.session) {
          st.submit = null;
          persist();
          return;
        }
        if (takesPhoto() && !st.submit.body.photo_id) {
          // The body is final once it names its photo: a retry (or a
          // reload) sends the same body with the same key.
          st.submit.body.photo_id = await uploadPhoto();
          persist();
        }
        try {
          const { data } = await send(`/api/sessions/${encodeURIComponent(st.session.id)}/submission`, {
            ...st.submit,
            token: st.session.token,
          });
          st.queue = queueOf(data);
        } catch (err) {
          // Already running (an earlier tap got through): follow it.
          if (!(err instanceof SH.ApiError && err.code === "already_submitted")) throw err;
        }
        st.submit = null;
        persist();
        busy = false;
        setNote("");
        startWaiting();
      }
    } catch (err) {
      onSendError(err);
    } finally {
      busy = false;
      if (!$("view-form").hidden) refreshButton();
    }
  }

  function onSendError(err) {
    if (err.photo && photo && err instanceof SH.ApiError && err.code === "idempotency_key_reused") {
      // Its key was spent on other bytes: the next try sends under a new one.
      photo.key = SH.uuid();
      savePhoto();
    }
    if (err instanceof PhotoMissing) {
      // The photo of a submission not sent yet is gone (the tab was
      // closed, or storage refused it): take it again; the text stays.
      st.submit = null;
      persist();
      showForm();
      setError(SH.t("p.error.photo_lost"));
      return;
    }
    if (err.photo && SH.retryable(err)) {
      // No answer, or the server busy: the photo, its key and the rest are
      // kept; Retry sends the same bytes with the same key.
      setNote("");
      const why = err instanceof SH.NetworkError ? "p.error.photo_network"
        : err.code === "upload_too_slow" ? "p.error.upload_too_slow" : "p.error.photo_busy";
      setError(SH.t(why));
      refreshButton();
      return;
    }
    if (SH.retryable(err)) {
      // No answer: keep the key and the body; the button now retries them.
      setNote("");
      setError(SH.t("p.networkFailed"));
      refreshButton();
      return;
    }
    const creating = Boolean(st.create);
    if (err instanceof SH.ApiError && !creating && (err.status === 401 || err.status === 404)) {
      // The stored session is gone (or its token no longer works).
      forgetSession();
      st.submit = null;
      persist();
      showForm();
      setError(SH.t("p.sessionLost"));
      return;
    }
    if (err instanceof SH.ApiError && creating && err.status === 404) {
      st.create = null;
      st.submit = null;
      persist();
      show("view-missing");
      return;
    }
    // Answered with a refusal: the key is spent; fix the input and send anew.
    st.create = null;
    st.submit = null;
    persist();
    if (err.photo && err instanceof SH.ApiError && PHOTO_REFUSALS.includes(err.code)) {
      // The server cannot use this photo: choose another (what was typed
      // stays).
      forgetPhoto();
    }
    showForm();
    const specific = err instanceof SH.ApiError ? `p.error.${err.code}` : "";
    setError(specific && SH.t(specific) !== specific ? SH.t(specific) : SH.errorText(err));
  }

  function forgetSession() {
    st.session = null;
    st.terminal_id = null;
  }

  // ---- waiting for the result ----------------------------------------------

  // Each stop starts a new generation: an answer that arrives after the
  // view moved on (Try again, Start over) is dropped.
  let pollGen = 0;

  function stopPolling() {
    clearTimeout(pollTimer);
    pollTimer = null;
    pollGen += 1;
  }

  function startWaiting() {
    waitingSince = Date.now();
    pollFailures = 0;
    $("wait-message").textContent = SH.t("session.SUBMITTING");
    $("wait-stage").textContent = SH.t("p.stage.AI_PENDING");
    markStage("AI_PENDING");
    showPaused(false);
    showQueuePlace(st.queue && st.queue.position);
    $("wait-extra").textContent = queueText("AI_PENDING").join(" · ");
    show("view-waiting");
    poll();
  }

  // GET the session about once a second until it is COMPLETED or ABORTED.
  async function poll() {
    stopPolling();
    if (!st.session) return;
    const gen = pollGen;
    let again = true;
    try {
      const { data } = await SH.api(`/api/sessions/${encodeURIComponent(st.session.id)}`, {
        token: st.session.token,
        timeoutMs: 10000,
      });
      if (gen !== pollGen) return;
      pollFailures = 0;
      again = renderSession(data);
      if (!again && data.status === "ABORTED") {
        pollTimer = setTimeout(poll, ABORTED_POLL_MS);
        return;
      }
    } catch (err) {
      if (gen !== pollGen) return;
      if (err instanceof SH.ApiError && (err.status === 401 || err.status === 404)) {
        forgetSession();
        persist();
        showForm();
        setError(SH.t("p.sessionLost"));
        return;
      }
      pollFailures += 1;
      $("wait-extra").textContent = SH.errorText(err);
    }
    if (again && !pollTimer) {
      pollTimer = setTimeout(poll, pollFailures ? SH.backoff(pollFailures, 10000) : 1000);
    }
  }

  // What the 202 said of the queue: its position and estimated wait
  // (`queue_position`, `eta_seconds`), when the server gives them.
  function queueOf(data) {
    if (!data) return null;
    const position = Number(data.queue_position);
    const wait = Number(data.eta_seconds);
    const q = {
      position: Number.isFinite(position) && position > 0 ? position : null,
      until: Number.isFinite(wait) && wait > 0 ? Date.now() + wait * 1000 : null,
    };
    return q.position || q.until ? q : null;
  }

  // The estimated wait while the AI has not started on it (the place in
  // the queue shows apart, in #wait-queue).
  function queueText(step) {
    const q = st.queue;
    if (!q || (step && step !== "AI_PENDING")) return [];
    const out = [];
    const left = q.until ? Math.ceil((q.until - Date.now()) / 1000) : 0;
    if (left > 0) out.push(SH.t("p.estimate", { s: left }));
    return out;
  }

  function showPaused(paused, message) {
    $("view-waiting").classList.toggle("paused", paused);
    $("wait-message").hidden = paused;
    $("wait-paused").hidden = !paused;
    $("wait-paused").textContent = paused ? message || SH.t("session.ai_paused") : "";
  }

  function showQueuePlace(n) {
    const ok = typeof n === "number" && Number.isFinite(n) && n > 0;
    $("wait-queue").hidden = !ok;
    $("wait-queue").textContent = ok ? SH.t("session.queue_position", { n }) : "";
  }

  function markStage(step) {
    const order = ["AI_PENDING", "AI_DONE", "RANKING_DONE"];
    // A result in review has passed the AI stage and waits at the next.
    const at = order.indexOf(step === "IN_REVIEW" ? "AI_DONE" : step);
    document.querySelectorAll(".stages li").forEach((li, i) => {
      li.className = i < at ? "done" : i === at ? "active" : "";
    });
  }

  // Shows the session; true while it is still running.
  function renderSession(s) {
    if (s.nickname) st.nickname = s.nickname;
    if (s.status === "SUBMITTING") {
      if ($("view-waiting").hidden) {
        waitingSince = Date.now();
        show("view-waiting");
      }
      // The provider paused (its breaker open): a calm word, not an
      // error; the session waits in its place and goes on by itself.
      const paused = s.ai_paused === true;
      showPaused(paused, s.message);
      if (!paused) $("wait-message").textContent = s.message || SH.t("session.SUBMITTING");
      $("wait-stage").textContent = s.step ? SH.t(`p.stage.${s.step}`) : "";
      markStage(s.step || "AI_PENDING");
      // The place in the queue: the server's, while the saga waits for an
      // AI slot (null once it has one); before it says, the 202's.
      const serverSays = "queue_position" in s;
      const place = serverSays ? Number(s.queue_position) : st.queue && st.queue.position;
      showQueuePlace(s.step === "AI_PENDING" || !s.step ? place : null);
      const secs = Math.floor((Date.now() - waitingSince) / 1000);
      const parts = [SH.t("p.elapsed", { s: secs })];
      parts.unshift(...queueText(s.step));
      $("wait-extra").textContent = parts.join(" · ");
      return true;
    }
    if (s.status === "COMPLETED") {
      renderResult(s);
      return false;
    }
    if (s.status === "ABORTED") {
      const reason = s.abort_reason || "";
      $("aborted-title").textContent = SH.t(reason === "INPUT_REJECTED" ? "p.rejectedTitle" : "p.abortedTitle");
      $("aborted-message").textContent = s.message || SH.t(`abort.${reason}`);
      $("aborted-hint").textContent = reason === "INPUT_REJECTED" ? SH.t("p.rejectedHint") : "";
      document.body.dataset.reason = reason;
      show("view-aborted");
      return false;
    }
    // OPEN: nothing submitted (yet).
    showForm();
    return false;
  }

  function renderResult(s) {
    const result = s.result || {};
    $("result-message").textContent = s.message || SH.t("session.COMPLETED");
    $("result-content").replaceChildren(...SH.renderContent(result.content));
    const stats = [];
    if (result.score != null) {
      stats.push(SH.el("div", { class: "stat" },
        SH.el("dt", { text: SH.t("p.score.label") }),
        SH.el("dd", { class: "score", text: SH.fmtNumber(result.score) })));
    }
    if (result.rank != null) {
      stats.push(SH.el("div", { class: "stat" },
        SH.el("dt", { text: SH.t("p.rank.label") }),
        SH.el("dd", { class: "rank", text: SH.t("p.rankValue", { rank: result.rank }) })));
    }
    $("result-stats").replaceChildren(...stats);
    $("result-stats").hidden = !stats.length;
    showShare(s);
    showPrints(s);
    showMail(s);
    if (s.erased === true) showErased();
    show("view-result");
  }

  // ---- printing -------------------------------------------------------------

  // Print: shown while the experience lets guests print and the result is
  // kept; the newest print's status (and why it waits: out of paper, …)
  // shows under the button (SH.printBox, as on the share page).
  let printing = null;

  function showPrints(s) {
    printing = printing || SH.printBox(
      { box: $("print-box"), button: $("print"), status: $("print-status") },
      () => (st.session ? { sessionId: st.session.id, token: st.session.token } : null),
    );
    printing.show(s, experience ? experience.prints_per_guest : 0);
  }

  // ---- mail --------------------------------------------------------------------

  // Mail: the address, the consent box (the experience's `mail` offer) and
  // the session's mails, under Print (SH.mailBox, as on the share page);
  // nothing without an offer or a completed, kept result.
  let mailing = null;

  function showMail(s) {
    mailing = mailing || SH.mailBox(
      $("mail-box"),
      () => (st.session ? { sessionId: st.session.id, token: st.session.token } : null),
    );
    mailing.show(s, experience ? experience.mail : null);
  }

  // ---- the result link and erasing -------------------------------------------

  // The result link (a completed session whose data is kept): the link,
  // its QR code for another phone, and the button that erases it. The
  // token is kept by its session id too, for the result page on this
  // device (a new session here forgets st.session).
  function showShare(s) {
    const path = typeof s.share_url === "string" && /^\/r\/[0-9A-Za-z_-]+$/.test(s.share_url) ? s.share_url : null;
    $("erased").hidden = true;
    $("erase-error").hidden = true;
    $("share-box").hidden = !path || s.erased === true;
    if (!path || s.erased === true) return;
    const link = location.origin + path;
    $("share-link").href = link;
    $("share-link").textContent = link;
    const qr = `${path}/qr.svg`;
    if ($("share-qr").getAttribute("src") !== qr) $("share-qr").src = qr;
    if (st.session) SH.owner.set(st.session.id, st.session.token);
  }

  // The session's data is gone: no picture, no link; a plain word says so.
  function showErased() {
    $("result-content").replaceChildren();
    $("result-stats").replaceChildren();
    $("result-stats").hidden = true;
    $("result-message").textContent = "";
    $("share-box").hidden = true;
    $("share-link").removeAttribute("href");
    $("share-link").textContent = "";
    $("share-qr").removeAttribute("src");
    if (mailing) mailing.hide();
    $("erased").hidden = false;
  }

  async function erase() {
    if (!st.session || $("erase").disabled) return;
    if (!window.confirm(SH.t("p.eraseConfirm"))) return;
    const { id, token } = st.session;
    $("erase").disabled = true;
    $("erase").textContent = SH.t("p.erasing");
    $("erase-error").hidden = true;
    try {
      // The same request again after no answer: erasing twice is fine.
      for (let attempt = 0; ; attempt++) {
        try {
          await SH.api(`/api/sessions/${encodeURIComponent(id)}`, { method: "DELETE", token });
          break;
        } catch (err) {
          if (!SH.retryable(err) || attempt >= 3) throw err;
          await SH.sleep(SH.backoff(attempt, 4000));
        }
      }
      SH.owner.set(id, null);
      showErased();
    } catch (err) {
      $("erase-error").textContent = SH.errorText(err);
      $("erase-error").hidden = false;
    } finally {
      $("erase").disabled = false;
      $("erase").textContent = SH.t("p.erase");
    }
  }

  // ---- buttons -------------------------------------------------------------

  function playAgain() {
    // A new session (the finished one stays as it is); keep the nickname.
    forgetSession();
    st.prompt = "";
    st.score = null;
    persist();
    if (mailing) mailing.hide();
    forgetPhoto();
    setError("");
    showForm();
    $("prompt").focus();
  }

  function tryAgain() {
    // The same session accepts a new submission after ABORTED, with the
    // same photo unless the server lost it.
    if (document.body.dataset.reason === "INPUT_MISSING") forgetPhoto();
    setError("");
    showForm();
    $("prompt").focus();
  }

  function startOver() {
    if (busy) return;
    forgetSession();
    st.create = null;
    st.submit = null;
    persist();
    setError("");
    setNote("");
    showForm();
  }

  // ---- start ---------------------------------------------------------------

  async function loadExperience() {
    for (let attempt = 0; ; attempt++) {
      try {
        const { data } = await SH.api(`/api/experiences/${encodeURIComponent(slug)}`);
        return data;
      } catch (err) {
        if (err instanceof SH.ApiError && err.status === 404) return null;
        if (!SH.retryable(err) && attempt >= 2) return null;
        await SH.sleep(SH.backoff(attempt, 10000));
      }
    }
  }

  async function init() {
    await SH.loadLocale(st.locale || "en");
    experience = slug ? await loadExperience() : null;
    if (!experience) {
      show("view-missing");
      return;
    }
    st.locale = experience.locale || "en";
    persist();
    await SH.loadLocale(st.locale);
    document.title = experience.title;
    $("title").textContent = experience.title;
    $("kind").textContent = SH.t(`kind.${experience.kind}`);
    $("kind").className = `badge kind-${experience.kind}`;
    $("kind").hidden = false;
    document.body.dataset.kind = experience.kind;
    if (experience.kind === "score") {
      // A game: the score is what counts; the text is a word about it.
      $("prompt-label").textContent = SH.t("p.promptScore");
      $("prompt").placeholder = SH.t("p.promptScorePlaceholder");
    } else if (takesPhoto()) {
      $("prompt-label").textContent = SH.t("p.promptPhoto");
      $("prompt").placeholder = SH.t("p.promptPhotoPlaceholder");
    }
    document.body.dataset.input = inputKind();

    $("view-form").addEventListener("submit", onSubmit);
    $("play-again").addEventListener("click", playAgain);
    $("try-again").addEventListener("click", tryAgain);
    $("start-over").addEventListener("click", startOver);
    $("photo-take").addEventListener("click", takePhoto);
    $("photo-retake").addEventListener("click", retake);
    $("photo-input").addEventListener("change", onPhotoChosen);
    $("consent").addEventListener("change", onConsentChange);
    $("optout").addEventListener("change", onOptOutChange);
    $("erase").addEventListener("click", erase);
    restorePhoto();
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && pollTimer) poll();
    });
    window.addEventListener("online", () => {
      if (pending() && !busy) run();
    });

    if (pending()) {
      // A request of an earlier visit never got its answer: send it again,
      // with its key.
      showForm();
      await run();
      return;
    }
    if (!st.session) {
      showForm();
      return;
    }
    // A session of an earlier visit: show where it stands. One opened for
    // another booth's terminal is left behind unless it is still running.
    try {
      const { data } = await SH.api(`/api/sessions/${encodeURIComponent(st.session.id)}`, {
        token: st.session.token,
      });
      if (terminalParam && terminalParam !== st.terminal_id && data.status !== "SUBMITTING") {
        forgetSession();
        persist();
        showForm();
        return;
      }
      if (data.status === "SUBMITTING") {
        startWaiting();
        return;
      }
      renderSession(data);
      if (data.status === "ABORTED") pollTimer = setTimeout(poll, ABORTED_POLL_MS);
    } catch (err) {
      if (err instanceof SH.ApiError && (err.status === 401 || err.status === 404)) {
        forgetSession();
        persist();
        showForm();
        return;
      }
      // No answer: assume it is still running and keep asking.
      startWaiting();
    }
  }

  init();
})();
