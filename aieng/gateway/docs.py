"""The OpenAPI documents and Swagger UI on the OIP HTTP door (AIENG_OIP_DOCS, on by default).

``http.py`` hands a request here when ``owns(parts)`` (a few comparisons; with docs off nothing is built and
these paths are unknown: 404), after the door's one API-key check, which lets only the ``shell`` paths
(the page and its static files) through without a key:

- ``/v2/openapi.json``: the whole API (``openapi.server_document``), the ``model_name`` enum the models the
  caller's key may see; ``/v2/models/{name}/openapi.json``: that model (``modeldoc``); ``/v2/native.json``:
  the native protocol (``nativedoc``, built once).  With API keys on each needs a key (the door's check:
  401 as every OIP path, a model outside the key's allow-list an unknown model, ``guard.py``).
- ``/v2/docs`` and ``/v2/models/{name}/docs``: the Swagger UI shell (``pages/swagger.html``), the same
  bytes for every name, so it is open even with keys on (it reveals nothing): its own script asks for the
  key (kept in sessionStorage) and sends it with every fetch, the spec's included, and shows the server's
  401 words without one.  Keys off, a model's page of an unknown model is 404.
- ``/v2/docs/static/<file>``: a fixed allow-list, Swagger UI's built assets from the ``swagger-ui-bundle``
  package and our initializer (``pages/``), read once on first use, each with its content type and a cache
  lifetime; no CDN, no CORS header (another origin's page cannot call the API from a visitor's browser).
"""
from __future__ import annotations

import json
import os

from aieng import __version__
from aieng.config import Config
from aieng.gateway.apikeys import Grant, KeyRing
from aieng.gateway.modeldoc import model_document
from aieng.gateway.nativedoc import native_document
from aieng.gateway.openapi import ApiShape, server_document
from aieng.gateway.service import Service
from aieng.httpcore.message import HttpError
from aieng.wire import protocol as p

PAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pages")
TOP = frozenset({"openapi.json", "native.json", "docs"})
PER_MODEL = frozenset({"openapi.json", "docs"})
# name -> (directory: "pages" ours, "swagger" the package's; content type; Cache-Control)
STATIC = {"swagger-ui-bundle.js": ("swagger", "text/javascript; charset=utf-8", "public, max-age=3600"),
          "swagger-ui.css": ("swagger", "text/css; charset=utf-8", "public, max-age=3600"),
          "favicon-32x32.png": ("swagger", "image/png", "public, max-age=86400"),
          "favicon-16x16.png": ("swagger", "image/png", "public, max-age=86400"),
          "swagger-init.js": ("pages", "text/javascript; charset=utf-8", "no-cache"),
          "swagger-page.css": ("pages", "text/css; charset=utf-8", "no-cache")}
# the page loads only what this server sends (Swagger UI styles some elements inline; data: images)
PAGE_HEADERS = {"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-cache",
                "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
                "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                           "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"}
DOC_HEADERS = {"Content-Type": "application/json", "Cache-Control": "no-cache"}


def owns(parts: list[str]) -> bool:
    """The path is one of these routes (``parts``: the path's non-empty segments)."""
    n = len(parts)
    if n == 2:
        return parts[0] == "v2" and parts[1] in TOP
    return n == 4 and parts[0] == "v2" and (parts[1:3] == ["docs", "static"]
                                            or (parts[1] == "models" and parts[3] in PER_MODEL))


def shell(parts: list[str]) -> bool:
    """Of ``owns``'s paths, those open without a key: the Swagger UI page and its files (no data)."""
    return parts[-1] == "docs" or parts[1:3] == ["docs", "static"]


def swagger_dir() -> str:
    import swagger_ui_bundle  # the pinned package's built Swagger UI; imported only when a page is asked for
    return swagger_ui_bundle.swagger_ui_path


class DocsRoutes:
    def __init__(self, service: Service, keys: KeyRing | None, cfg: Config):
        self.svc, self.keys = service, keys
        self.repository_control = cfg.oip_repository_control
        self.native = json.dumps(native_document(cfg), indent=1).encode()
        self.files: dict[str, bytes] = {}  # read on first use: most servers never show a page

    def _file(self, name: str) -> bytes:
        data = self.files.get(name)
        if data is None:
            where = PAGES if STATIC.get(name, ("pages",))[0] == "pages" else swagger_dir()
            with open(os.path.join(where, name), "rb") as f:
                data = self.files[name] = f.read()
        return data

    async def handle(self, method: str, parts: list[str], grant: Grant | None):
        """``grant``: the caller's key, checked by the door (None with keys off, and for a ``shell`` path)."""
        if method not in ("GET", "HEAD"):
            raise HttpError(405, "the documents and pages take GET")
        if parts[1] == "docs" and len(parts) == 4:
            spec = STATIC.get(parts[3])
            if spec is None:
                raise HttpError(404, "not found")
            return 200, {"Content-Type": spec[1], "Cache-Control": spec[2],
                         "X-Content-Type-Options": "nosniff"}, self._file(parts[3])
        if parts[-1] == "docs":
            if len(parts) == 4 and self.keys is None:
                await self.svc.view(parts[2], None)  # an unknown model's page: 404, as its metadata
            return 200, PAGE_HEADERS, self._file("swagger.html")
        if parts[1] == "native.json":
            return 200, DOC_HEADERS, self.native
        if len(parts) == 2:
            return 200, DOC_HEADERS, _encode(await self.whole(grant))
        return 200, DOC_HEADERS, _encode(await self.model(parts[2]))

    async def whole(self, grant: Grant | None) -> dict:
        up = self.svc.up
        if not await up.wait_models():
            raise p.RequestError(p.UNAVAILABLE, "the model list is not known yet (the frontend is silent)")
        names = tuple(n for n in sorted(up.catalog.views) if grant is None or grant.models is None
                      or n in grant.models)
        return server_document(ApiShape(names, self.repository_control, self.keys is not None, __version__))

    async def model(self, name: str) -> dict:
        view = await self.svc.ready_view(name, None)
        versions = sorted(self.svc.up.catalog.views.get(name, {}),
                          key=lambda v: (not v.isdigit(), v.zfill(20)))
        return model_document(view, versions, self.keys is not None)


def _encode(doc: dict) -> bytes:
    return json.dumps(doc, indent=1).encode()
