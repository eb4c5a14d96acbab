// The status page: polls /status.json about once a second and redraws its tables.  Everything is built
// with textContent (never HTML from data).  With AIENG_HTTP_TOKEN_FILE set the feed answers 401 without
// the token: the page shows the server's words and asks for it, keeps it in sessionStorage (this tab only)
// and sends it as "Authorization: Bearer".  The page reads; it has no operations.
"use strict";
(function () {
  const FEED = "/status.json", KEY = "aieng-status-token", PERIOD_MS = 1000;
  const COLORS = ["#4a7bd0", "#7fb3e8", "#59a14f", "#9bd18e", "#edc948", "#f28e2b", "#e15759",
                  "#b07aa1", "#76b7b2", "#9c755f", "#bab0ac", "#ff9da7"];
  const $ = (sel) => document.querySelector(sel);

  function el(tag, props, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "text") node.textContent = v;
      else if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const child of children || []) node.appendChild(child);
    return node;
  }
  const td = (text, cls) => el("td", {text: text === null || text === undefined ? "–" : String(text),
                                      class: cls || ""});
  const num = (v, digits) => (v === null || v === undefined) ? "–" : Number(v).toFixed(digits);

  function bar(fraction, cls) {
    const inner = el("span");
    inner.style.width = Math.max(0, Math.min(1, fraction || 0)) * 100 + "%";
    return el("span", {class: "bar " + (cls || "")}, [inner]);
  }

  function fill(tbody, rows, empty) {
    if (!rows.length && empty) {
      const cell = el("td", {text: empty, class: "muted"});
      cell.colSpan = tbody.parentNode.querySelectorAll("thead th").length;
      rows = [el("tr", {class: "empty"}, [cell])];
    }
    tbody.replaceChildren(...rows);
  }

  function drawSummary(s, gpus) {
    const state = $("#server-state");
    state.textContent = s.draining ? "draining" : s.ready ? (s.degraded ? "ready, degraded" : "ready")
                        : s.started ? "not ready" : "starting";
    state.className = "badge " + (s.ready && !s.degraded ? "ok" : s.ready ? "warn" : "bad");
    const q = s.queue_depth || {}, c = s.counts || {};
    const errors = Object.values(c.errors || {}).reduce((a, b) => a + b, 0);
    const items = [["version", s.version], ["uptime", num(s.uptime_s, 0) + " s"], ["in flight", s.in_flight],
                   ["queue pre/exec/post", [q.preprocess || 0, q.executor || 0, q.postprocess || 0].join(" / ")],
                   ["requests", c.requests], ["ok", c.ok], ["errors", errors]];
    for (const [i, g] of Object.entries(gpus || {}))  // only where NVML sees a GPU
      items.push(["GPU " + i, num(g.utilization * 100, 0) + "% · " + num(g.memory_used_bytes / 1048576, 0) + " MiB"]);
    $("#summary").replaceChildren(...items.flatMap(([k, v]) => [el("dt", {text: k}),
                                                                el("dd", {text: String(v ?? "–")})]));
  }

  function canaryText(m, v) {
    if (v.stable) return m.canary.versions.length ? "stable" : "";
    if (m.canary.versions.includes(v.version))
      return "canary" + (m.canary.auto_rollback ? ", watched" : "");
    return m.canary.reason && m.canary.reason.includes(v.version) ? m.canary.reason : "";
  }

  function trafficCells(t, maxP99) {
    t = t || {requests: 0, rps: 0, errors: 0, p50_ms: null, p99_ms: null};
    return [td(t.requests, "num requests"), td(num(t.rps, 2), "num rps"), td(t.errors, "num errors"),
            td(num(t.p50_ms, 2), "num p50"), td(num(t.p99_ms, 2), "num p99"),
            el("td", {}, [bar(maxP99 ? (t.p99_ms || 0) / maxP99 : 0)])];
  }

  function drawModels(models) {
    const maxP99 = Math.max(0, ...models.flatMap((m) => m.versions.map((v) => (v.traffic || {}).p99_ms || 0)));
    const rows = [];
    for (const m of models) {
      const head = el("tr", {class: "model", "data-model": m.name, "data-version": ""},
                      [td(m.name), td(m.stable ? "stable " + m.stable : ""), td(m.error ? "failed" : ""),
                       td(""), td(m.canary.versions.length ? "canary " + m.canary.versions.join(", ") : "")]);
      for (const cell of trafficCells(m.traffic, maxP99)) head.appendChild(cell);
      rows.push(head);
      for (const v of m.versions) {
        const state = td(v.state, v.state === "ready" ? "ok" : v.state === "failed" ? "bad" : "warn");
        if (v.error) state.title = v.error;
        const weight = el("td", {}, [bar(v.share), document.createTextNode(" " + num(v.share * 100, 0) + "%")]);
        const row = el("tr", {"data-model": m.name, "data-version": v.version},
                       [td(""), td(v.version + (v.hash ? " · " + v.hash : "")), state, weight, td(canaryText(m, v))]);
        for (const cell of trafficCells(v.traffic, maxP99)) row.appendChild(cell);
        rows.push(row);
      }
    }
    fill($("#models tbody"), rows, "no models");
  }

  function drawStages(models) {
    const names = [];
    const rows = models.filter((m) => m.timings && m.timings.stages).map((m) => {
      const stack = el("span", {class: "stack"});
      for (const s of m.timings.stages) {
        if (!names.includes(s.stage)) names.push(s.stage);
        const part = el("span", {title: s.stage + ": p50 " + num(s.p50_us / 1000, 3) + " ms"});
        part.style.width = (s.share * 100) + "%";
        part.style.background = COLORS[names.indexOf(s.stage) % COLORS.length];
        stack.appendChild(part);
      }
      return el("tr", {"data-model": m.name}, [td(m.name), td(num(m.timings.total_p50_us / 1000, 2), "num"),
                                               td(num(m.timings.total_p99_us / 1000, 2), "num"),
                                               el("td", {}, [stack])]);
    });
    fill($("#stages tbody"), rows, "no answers yet");
    $("#legend").replaceChildren(...names.map((n, i) => {
      const swatch = el("i");
      swatch.style.background = COLORS[i % COLORS.length];
      return el("span", {}, [swatch, document.createTextNode(n)]);
    }));
  }

  function drawDrift(drift) {
    fill($("#drift tbody"), drift.map((d) => el("tr", {}, [
      td(d.key), td(num(d.psi, 4), "num"),
      el("td", {}, [bar(Math.min(1, d.psi / 0.5), d.psi > 0.25 ? "alarm" : d.psi > 0.1 ? "hot" : "")])])),
         "no scores yet: a model needs a drift reference (docs/metrics.md, Drift)");
  }

  function drawProcesses(procs) {
    fill($("#processes tbody"), procs.map((p) => el("tr", {"data-process": p.name}, [
      td(p.name), td(p.role), td(p.pid, "num"), td(p.alive ? "yes" : "no", p.alive ? "ok" : "bad"),
      td(p.restarts, "num"), td(num(p.cpu_percent, 1), "num cpu"),
      el("td", {}, [bar((p.cpu_percent || 0) / 100, p.cpu_percent > 90 ? "hot" : "")]),
      td(p.rss_bytes === null || p.rss_bytes === undefined ? null : num(p.rss_bytes / 1048576, 1), "num rss")])));
  }

  function say(text) {
    const msg = $("#message");
    msg.textContent = text;
    msg.hidden = !text;
  }

  async function poll() {
    const token = sessionStorage.getItem(KEY);
    const headers = token ? {"Authorization": "Bearer " + token} : {};
    try {
      const resp = await fetch(FEED, {headers: headers, cache: "no-store"});
      const body = await resp.text();
      if (!resp.ok) {
        let words = body;
        try { words = JSON.parse(body).error || body; } catch (e) { /* not JSON: shown as it came */ }
        say(resp.status + " " + words + (resp.status === 401 ? ": enter the token" : ""));
        $("#token-form").hidden = resp.status !== 401;
        $("#server-state").textContent = String(resp.status);
        $("#server-state").className = "badge bad";
        return;
      }
      const feed = JSON.parse(body);
      say("");
      $("#token-form").hidden = true;
      drawSummary(feed.server, feed.gpus);
      drawModels(feed.models);
      drawStages(feed.models);
      drawDrift(feed.drift);
      drawProcesses(feed.processes);
      $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (err) {
      say("cannot reach the server: " + err);
      $("#server-state").textContent = "unreachable";
      $("#server-state").className = "badge bad";
    } finally {
      setTimeout(poll, PERIOD_MS);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("#token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(KEY, $("#token").value.trim());
      $("#token").value = "";
    });
    poll();
  });
})();
