// The try-it page of one model (/v2/models/{name}/try): a field per declared input, by its kind; the request
// goes to the OIP infer endpoint (JSON, or the binary extension when it carries an image), asking for the
// stage timings (parameter aieng_timing); the answer is shown as people read it, raw JSON below.
"use strict";

const NAME = decodeURIComponent(location.pathname.split("/")[3] || "");
const COLORS = ["#1f6feb", "#8250df", "#bf3989", "#cf222e", "#bc4c00", "#9a6700", "#1a7f37", "#0969da",
                "#6e7781", "#116329", "#953800"];
let model = null;   // the feed's entry for this model
const images = {};  // input index -> {img, canvas}

function version() {
  return model.versions.find((v) => v.version === $("version").value) || model.versions[0];
}

async function loadModel() {
  document.title = "aieng: try " + NAME;
  $("title").textContent = "try " + NAME;
  $("model-docs").href = modelPath(NAME) + "/docs";
  const status = $("status");
  const r = await getJson("/v2/try/models/" + encodeURIComponent(NAME));
  if (r.status !== 200) {
    status.className = "error";
    status.textContent = serverWords(r);
    $("form").hidden = true;
    if (r.status === 401) askForKey();
    return;
  }
  model = r.body.models[0];
  if (model.left_out) {
    status.className = "error";
    status.textContent = "not served: " + model.left_out;
    return;
  }
  status.className = "status";
  status.textContent = "";
  const select = $("version");
  select.replaceChildren();
  for (const v of model.versions) {
    const opt = el("option", { value: v.version, text: v.version + (v.ready ? "" : " (not ready)") });
    if (v.version === model.default_version) opt.selected = true;
    select.append(opt);
  }
  $("kind").textContent = model.kind;
  buildFields();
  select.onchange = buildFields;
  $("form").hidden = false;
}

function buildFields() {
  const box = $("fields");
  box.replaceChildren();
  const v = version();
  if (!v.ready) box.append(el("p", { class: "error", text: "version " + v.version + " is not ready: " + v.error }));
  const grid = el("div", { class: "grid" });
  v.inputs.forEach((inp, i) => {
    const id = "in-" + i;
    const hint = inp.kind + ", " + inp.datatype + " " + JSON.stringify(inp.shape) + (inp.optional ? ", optional" : "");
    const label = el("label", { for: id, text: inp.name + " " }, el("small", { text: hint }));
    const field = el("div", { class: "field" }, label);
    if (inp.kind === "text") {
      field.append(el("textarea", { id, "data-input": inp.name, placeholder: "a sentence" }));
    } else if (inp.kind === "image") {
      const file = el("input", { id, type: "file", accept: "image/*", "data-input": inp.name });
      const img = el("img", { id: "preview-" + i, alt: "" });
      const canvas = el("canvas", { id: "overlay-" + i });
      const stage = el("div", { class: "stage" }, img, canvas);
      stage.hidden = true;
      file.onchange = () => {
        if (!file.files.length) { stage.hidden = true; return; }
        img.onload = () => { canvas.width = img.naturalWidth; canvas.height = img.naturalHeight; stage.hidden = false; };
        img.src = URL.createObjectURL(file.files[0]);
      };
      images[i] = { img, canvas };
      field.append(file, stage);
    } else if (inp.kind === "number") {
      field.append(el("input", { id, type: "number", step: "any", "data-input": inp.name }));
      grid.append(field);
      return;
    } else if (inp.kind === "category") {
      field.append(el("input", { id, type: "text", "data-input": inp.name }));
      grid.append(field);
      return;
    } else {  // tensor: nested JSON arrays (the batch dimension may be left out), or a .json file
      const area = el("textarea", { id, class: "json", "data-input": inp.name, placeholder: "[[0.1, 0.2], [0.3, 0.4]]" });
      const file = el("input", { type: "file", accept: ".json,application/json", id: id + "-file" });
      file.onchange = async () => { if (file.files.length) area.value = await file.files[0].text(); };
      field.append(area, el("small", { text: "or a JSON file: " }), file);
    }
    box.append(field);
  });
  if (grid.childElementCount) box.append(grid);
}

function depthShape(value) {
  const shape = [];
  for (let x = value; Array.isArray(x); x = x[0]) shape.push(x.length);
  return shape;
}

function utf8(s) { return new TextEncoder().encode(s); }

// One input's OIP entry, and its binary bytes when it is an image (a BYTES element: 4-byte length, bytes).
async function inputOf(inp, i, v) {
  const field = $("in-" + i);
  if (inp.kind === "image") {
    if (!field.files.length) return inp.optional ? null : Promise.reject(new Error("choose an image for '" + inp.name + "'"));
    const bytes = new Uint8Array(await field.files[0].arrayBuffer());
    const element = new Uint8Array(4 + bytes.length);
    new DataView(element.buffer).setUint32(0, bytes.length, true);
    element.set(bytes, 4);
    return { entry: { name: inp.name, datatype: "BYTES", shape: [1], parameters: { binary_data_size: element.length } }, blob: element };
  }
  const raw = field.value;
  if (raw.trim() === "" && inp.optional) return null;
  if (inp.kind === "number") return { entry: { name: inp.name, datatype: inp.datatype, shape: [1], data: [Number(raw)] } };
  if (inp.kind !== "tensor") return { entry: { name: inp.name, datatype: "BYTES", shape: [1], data: [raw] } };
  let data;
  try { data = JSON.parse(raw); } catch (e) { throw new Error("'" + inp.name + "' is not JSON: " + e.message); }
  let shape = depthShape(data);
  if (v.batched && shape.length === inp.shape.length - 1) { data = [data]; shape = [1, ...shape]; }
  return { entry: { name: inp.name, datatype: inp.datatype, shape, data } };
}

// A classifier (a label output beside a scores tensor of k values): ask for its top k, for the bars.
function topK(v) {
  const hasLabel = v.outputs.some((o) => o.datatype === "BYTES" && o.shape.length <= 1);
  const scores = v.outputs.find((o) => o.datatype.startsWith("FP") && o.shape.length === (v.batched ? 2 : 1)
                                       && o.shape[o.shape.length - 1] > 1);
  return hasLabel && scores ? scores.shape[scores.shape.length - 1] : 0;
}

async function send(ev) {
  ev.preventDefault();
  const v = version();
  $("result").hidden = false;
  $("error").hidden = true;
  $("answer").replaceChildren();
  $("timing").replaceChildren();
  $("raw-json").textContent = "";
  const entries = [], blobs = [];
  try {
    for (const [i, inp] of v.inputs.entries()) {
      const got = await inputOf(inp, i, v);
      if (got) { entries.push(got.entry); if (got.blob) blobs.push(got.blob); }
    }
  } catch (e) { showError(e.message); return; }
  const parameters = { aieng_timing: true };
  const k = topK(v);
  if (k) parameters.top_k = k;
  const head = utf8(JSON.stringify({ id: "try-it", inputs: entries, parameters }));
  const headers = authHeaders();
  let body = head;
  if (blobs.length) {  // the binary tensor extension: the JSON header, then each binary input's bytes
    headers["Inference-Header-Content-Length"] = String(head.length);
    headers["Content-Type"] = "application/octet-stream";
    body = new Blob([head, ...blobs]);
  } else {
    headers["Content-Type"] = "application/json";
  }
  $("busy").hidden = false;
  $("send").disabled = true;
  const t0 = performance.now();
  let r;
  try {
    const resp = await fetch(modelPath(NAME, v.version) + "/infer", { method: "POST", headers, body });
    const text = await resp.text();
    let parsed = null;
    try { parsed = JSON.parse(text); } catch (e) { parsed = null; }
    r = { status: resp.status, statusText: resp.statusText, body: parsed, text };
  } catch (e) {
    showError("the request failed: " + e.message);
    return;
  } finally {
    $("busy").hidden = true;
    $("send").disabled = false;
  }
  const roundTrip = performance.now() - t0;
  $("raw-json").textContent = r.body ? JSON.stringify(r.body, null, 2) : r.text;
  if (r.status !== 200) {
    showError(serverWords(r));
    if (r.status === 401) askForKey();
    return;
  }
  show(r.body, v);
  showTiming((r.body.parameters || {}).aieng_timing_us, roundTrip);
}

function showError(text) {
  const err = $("error");
  err.textContent = text;
  err.hidden = false;
  $("result").hidden = false;
}

function rows(out) {  // an output's first row, as a flat list (the page sends one row)
  return out.data || [];
}

function jsonRow(out) {
  try { return JSON.parse(rows(out)[0]); } catch (e) { return null; }
}

function show(answer, v) {
  const box = $("answer");
  const outs = Object.fromEntries(answer.outputs.map((o) => [o.name, o]));
  const used = new Set();
  if (outs.top_k) {  // a label and its probability bars
    const best = jsonRow(outs.top_k) || [];
    const labelOut = answer.outputs.find((o) => o.datatype === "BYTES" && o.name !== "top_k");
    box.append(el("p", { class: "label", id: "label", text: labelOut ? rows(labelOut)[0] : (best[0] || [""])[0] }));
    const bars = el("div", { class: "bars", id: "bars" });
    for (const [name, score] of best) {
      const fill = el("span");
      fill.style.width = (Math.max(0, Math.min(1, score)) * 100).toFixed(1) + "%";
      bars.append(el("span", { text: name }), el("div", { class: "bar" }, fill),
                  el("span", { class: "num", text: Number(score).toFixed(3) }));
    }
    box.append(bars);
    used.add("top_k");
    if (labelOut) used.add(labelOut.name);
    answer.outputs.filter((o) => o.datatype.startsWith("FP") && o.shape[o.shape.length - 1] === best.length).forEach((o) => used.add(o.name));
  }
  if (outs.lines && outs.lines.datatype === "BYTES") {  // OCR: the lines in reading order, boxes on the page
    const lines = jsonRow(outs.lines) || [];
    const list = el("ol", { class: "lines", id: "lines" });
    for (const line of lines) list.append(el("li", { text: line.text + "  (" + Number(line.score).toFixed(2) + ")" }));
    box.append(el("h3", { text: lines.length + " line" + (lines.length === 1 ? "" : "s") }), list);
    draw(lines.map((l) => ({ points: l.box, label: l.text })));
    used.add("lines");
  }
  if (outs.boxes && !outs.boxes.datatype.startsWith("BYTES")) {  // detection boxes drawn on the image
    drawBoxes(outs.boxes, outs.labels, outs.scores);
    const n = detections(outs.boxes);
    box.append(el("p", { id: "boxes", text: n + " box" + (n === 1 ? "" : "es") + " found" }));
    ["boxes", "labels", "scores"].forEach((n2) => used.add(n2));
  }
  for (const o of answer.outputs) {
    if (used.has(o.name)) continue;
    const n = o.shape.reduce((a, b) => a * b, 1);
    if (o.datatype.startsWith("FP") && n > 8) {  // a vector, e.g. an embedding: its size and norm
      const vals = rows(o);
      const norm = Math.sqrt(vals.reduce((a, x) => a + x * x, 0));
      const dim = o.shape[o.shape.length - 1];
      box.append(el("div", { class: "embedding", id: "embedding-" + o.name },
        el("p", {}, el("strong", { text: o.name + ": " }), el("span", { id: "dim", text: "dimension " + dim }),
           " \u00b7 ", el("span", { id: "norm", text: "norm " + norm.toFixed(4) })),
        el("p", { class: "vector", text: "[" + vals.slice(0, 8).map((x) => x.toFixed(4)).join(", ") + ", \u2026]" })));
    } else {
      box.append(el("p", {}, el("strong", { text: o.name + ": " }), el("span", { text: rows(o).map(String).join(", ") })));
    }
  }
}

function detections(out) {
  const per = out.shape.slice(-1)[0] === 2 ? 8 : 4;  // quads [.., 4, 2] or x1, y1, x2, y2
  return Math.floor(rows(out).length / per);
}

function drawBoxes(boxes, labels, scores) {
  const flat = rows(boxes), quad = boxes.shape.slice(-1)[0] === 2;
  const names = labels ? (labels.datatype === "BYTES" ? (jsonRow(labels) || rows(labels)) : rows(labels)) : [];
  const shapes = [];
  for (let j = 0; j < detections(boxes); j++) {
    const b = flat.slice(j * (quad ? 8 : 4), (j + 1) * (quad ? 8 : 4));
    const points = quad ? [[b[0], b[1]], [b[2], b[3]], [b[4], b[5]], [b[6], b[7]]]
                        : [[b[0], b[1]], [b[2], b[1]], [b[2], b[3]], [b[0], b[3]]];
    const score = scores ? rows(scores)[j] : undefined;
    const label = [names[j], score === undefined ? "" : Number(score).toFixed(2)].filter((x) => x !== undefined && x !== "").join(" ");
    shapes.push({ points, label });
  }
  draw(shapes);
}

function draw(shapes) {  // on the first image input's canvas, in the image's own pixels
  const first = Object.values(images)[0];
  if (!first || !first.img.naturalWidth) return;
  const { canvas } = first;
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const w = Math.max(2, canvas.width / 400);
  ctx.lineWidth = w;
  ctx.font = Math.round(w * 7) + "px system-ui, sans-serif";
  shapes.forEach((s, j) => {
    ctx.strokeStyle = ctx.fillStyle = COLORS[j % COLORS.length];
    ctx.beginPath();
    s.points.forEach(([x, y], k) => (k ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
    ctx.closePath();
    ctx.stroke();
    if (s.label) ctx.fillText(String(s.label).slice(0, 40), s.points[0][0] + w, s.points[0][1] - w);
  });
}

function showTiming(timing, roundTrip) {
  const box = $("timing");
  box.append(el("h3", { text: "Where the time went" }));
  if (!timing) {
    box.append(el("p", { class: "muted", text: "round trip " + roundTrip.toFixed(1) + " ms (the server sent no stage timings)" }));
    return;
  }
  const total = timing.total || Object.values(timing).reduce((a, b) => a + b, 0) || 1;
  const bar = el("div", { class: "timing", id: "timing-bar" }), legend = el("div", { class: "legend" });
  // the stages add up to total; a dotted name (hop.*, postprocess.*) is a breakdown of one of them
  Object.entries(timing).filter(([k]) => k !== "total" && !k.includes(".")).forEach(([stage, us], j) => {
    const part = el("span", { title: stage + " " + (us / 1000).toFixed(2) + " ms" });
    part.style.width = (100 * us / total).toFixed(2) + "%";
    part.style.background = COLORS[j % COLORS.length];
    bar.append(part);
    const swatch = el("i");
    swatch.style.background = COLORS[j % COLORS.length];
    legend.append(el("span", {}, swatch, stage + " " + (us / 1000).toFixed(2) + " ms"));
  });
  box.append(el("p", { id: "timing-total", text: "server " + (total / 1000).toFixed(2) + " ms, round trip in this browser "
                                                 + roundTrip.toFixed(1) + " ms" }), bar, legend);
}

$("form").addEventListener("submit", send);
setupKey(loadModel);
loadModel();
