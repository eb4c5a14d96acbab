// What both pages share: the API key field (kept in this tab's sessionStorage), the fetch that sends it,
// and making elements without ever writing the server's words as HTML.
"use strict";

const KEY_STORE = "aieng-oip-key";

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const kid of kids) node.append(kid);
  return node;
}

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORE);
  return key ? { "Authorization": "Bearer " + key } : {};
}

// Show the key field when a key is kept or the server asked for one; ``reload`` runs after a new key.
function setupKey(reload) {
  const form = $("key-form"), input = $("key");
  input.value = sessionStorage.getItem(KEY_STORE) || "";
  form.hidden = !input.value;
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const key = input.value.trim();
    if (key) sessionStorage.setItem(KEY_STORE, key); else sessionStorage.removeItem(KEY_STORE);
    reload();
  });
}

function askForKey() { $("key-form").hidden = false; $("key").focus(); }

// GET a JSON document; {status, body} with the body parsed (null when it is not JSON).
async function getJson(path) {
  const resp = await fetch(path, { headers: authHeaders(), cache: "no-store" });
  const text = await resp.text();
  let body = null;
  try { body = JSON.parse(text); } catch (e) { body = null; }
  return { status: resp.status, statusText: resp.statusText, body, text };
}

// The server's words for a failed answer: "401 Unauthorized: a valid API key is needed: ..."
function serverWords(r) {
  const words = r.body && typeof r.body.error === "string" ? r.body.error : (r.text || "(no body)");
  return r.status + " " + (r.statusText || "") + ": " + words;
}

function modelPath(name, version) {
  const base = "/v2/models/" + encodeURIComponent(name);
  return version ? base + "/versions/" + encodeURIComponent(version) : base;
}
