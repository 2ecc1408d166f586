// The start page, /: the experiences, each with a link to its participant
// page. A file of its own (not inline in index.html) so the pages' policy
// allows scripts from the server only.
"use strict";
// The experiences, each with its participant page.
(async () => {
  await SH.loadLocale("en");
  const status = SH.$("#status");
  const list = SH.$("#experiences");
  try {
    const { data } = await SH.api("/api/experiences");
    const items = (data && data.experiences) || [];
    if (!items.length) {
      status.textContent = SH.t("index.empty");
      return;
    }
    status.hidden = true;
    list.hidden = false;
    for (const e of items) {
      const href = `/p/${encodeURIComponent(e.slug)}`;
      list.append(
        SH.el("li", { class: "card experience", dataset: { slug: e.slug } },
          SH.el("div", { class: "card-head" },
            SH.el("h2", { text: e.title }),
            SH.el("span", { class: `badge kind-${e.kind}`, text: SH.t(`kind.${e.kind}`) })),
          SH.el("p", { class: "muted small" },
            SH.el("code", { text: e.slug }), " · ",
            SH.t("index.locale", { locale: SH.t(`lang.${e.locale || "en"}`) })),
          SH.el("a", { class: "btn btn-primary", href, text: SH.t("index.open") })));
    }
  } catch (err) {
    status.textContent = SH.t("index.loadFailed", { message: SH.errorText(err) });
    status.classList.add("error");
  }
})();
