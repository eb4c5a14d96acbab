// The landing page: every model the server serves (and the key may see), from /v2/try/models.
"use strict";

async function loadModels() {
  const status = $("status"), table = $("models"), rows = table.querySelector("tbody");
  status.className = "status";
  status.textContent = "Loading the models\u2026";
  const r = await getJson("/v2/try/models");
  if (r.status !== 200) {
    status.className = "error";
    status.textContent = serverWords(r);
    table.hidden = true;
    if (r.status === 401) askForKey();
    return;
  }
  rows.replaceChildren();
  for (const m of r.body.models) {
    const versions = el("td");
    if (m.left_out) versions.append(el("span", { class: "not-ready", text: "not served: " + m.left_out }));
    for (const v of m.versions) {
      const mark = v.ready ? "ready" : "not ready: " + v.error;
      const dflt = v.version === m.default_version ? " (default)" : "";
      versions.append(el("div", { class: v.ready ? "ready" : "not-ready", text: v.version + dflt + ": " + mark }));
    }
    const tryLink = el("a", { href: modelPath(m.name) + "/try", text: "try " + m.name });
    const docs = el("a", { href: modelPath(m.name) + "/docs", text: "docs" });
    rows.append(el("tr", { "data-model": m.name }, el("td", {}, el("strong", { text: m.name })),
                   el("td", {}, el("span", { class: "tag", text: m.kind })), versions,
                   el("td", {}, tryLink), el("td", {}, docs)));
  }
  table.hidden = false;
  const n = r.body.models.length;
  status.textContent = n + " model" + (n === 1 ? "" : "s") + (r.body.server_ready ? "; the server is ready." : "; the server is not ready yet.");
}

setupKey(loadModels);
loadModels();
