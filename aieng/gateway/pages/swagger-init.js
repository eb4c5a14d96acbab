// Swagger UI for aieng (served by the OIP gateway, aieng/gateway/docs.py; nothing from elsewhere).
// The document is the whole API's (/v2/docs) or one model's (/v2/models/NAME/docs). With API keys on the
// server, the key typed here is kept in this tab's sessionStorage and sent as "Authorization: Bearer" with
// every fetch: the document's own and each "Try it out" (unless the Authorize button set one already).
(function () {
  "use strict";
  var KEY = "aieng.apiKey";
  var parts = window.location.pathname.split("/").filter(Boolean);
  var model = parts.length === 4 && parts[1] === "models" ? decodeURIComponent(parts[2]) : null;
  var specUrl = model === null ? "/v2/openapi.json"
    : "/v2/models/" + encodeURIComponent(model) + "/openapi.json";
  var box = document.getElementById("aieng-key");
  var error = document.getElementById("aieng-error");
  document.getElementById("aieng-which").textContent = model === null ? "" : "model " + model;

  function key() { return window.sessionStorage.getItem(KEY) || ""; }

  function withKey(req) {
    var k = key();
    if (k && !req.headers.Authorization && !req.headers.authorization) {
      req.headers.Authorization = "Bearer " + k;
    }
    return req;
  }

  function show(words) {
    error.textContent = words;
    error.hidden = false;
  }

  function load() {
    error.hidden = true;
    var headers = { Accept: "application/json" };
    if (key()) { headers.Authorization = "Bearer " + key(); }
    fetch(specUrl, { headers: headers, credentials: "same-origin" }).then(function (res) {
      return res.text().then(function (text) {
        if (!res.ok) {
          var words = text;
          try { words = JSON.parse(text).error || text; } catch (e) { /* not JSON: as sent */ }
          throw new Error(res.status + " " + words);
        }
        return JSON.parse(text);
      });
    }).then(function (spec) {
      window.ui = SwaggerUIBundle({
        spec: spec, dom_id: "#swagger-ui", deepLinking: true, requestInterceptor: withKey,
        presets: [SwaggerUIBundle.presets.apis], layout: "BaseLayout", tryItOutEnabled: false
      });
    }).catch(function (err) { show(String(err.message || err)); });
  }

  document.getElementById("aieng-key-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    window.sessionStorage.setItem(KEY, box.value.trim());
    box.value = "";
    load();
  });
  document.getElementById("aieng-forget").addEventListener("click", function () {
    window.sessionStorage.removeItem(KEY);
    load();
  });
  load();
}());
