"""The pages a person opens on the OIP HTTP port: the landing page (``/``) and a try-it page per model
(``/v2/models/{name}/try``), with their scripts and style under ``/v2/try/`` and the JSON they are built from.

Routes (``TryIt.owns`` says which paths are these; ``OipHttp.handle`` hands them here after its one key check,
which lets the ``shell`` paths, the pages and their files, through without a key):
  ``GET /``                        the landing page (every served model: versions, readiness, kind, links)
  ``GET /v2/models/{name}/try``    the try-it page of one model; an unknown one is 404 in an unknown model's
                                   words.  With API keys on, the page is the same for any name (its shell
                                   shows nothing), and its data needs the key
  ``GET /v2/try/{file}``           the pages' script and style (``tryit_static/``, packaged; nothing fetched
                                   from elsewhere: the pages work offline)
  ``GET /v2/try/models[/{name}]``  what the pages are built from: each model's versions, readiness, kind and
                                   declared inputs (with their kinds) and outputs.  With API keys on it needs
                                   a key as every model route does (401 in the same words; a key's allow-list
                                   shows only its models, any other is an unknown model).
The pages send their infer requests to the ordinary OIP endpoint with the browser's ``fetch`` (and, with a key
in the page's field, ``Authorization: Bearer``), asking for the stage timings (``aieng_timing``,
docs/oip.md).  No CORS header is added: a page of another origin cannot call the API from a visitor's
browser.  Every page answer carries a Content-Security-Policy that allows only this origin's scripts.
"""
from __future__ import annotations

import json
from pathlib import Path

from aieng.gateway import guard
from aieng.gateway.apikeys import Grant, KeyRing
from aieng.gateway.models import ModelView
from aieng.gateway.service import Service
from aieng.httpcore.message import HttpError

STATIC = Path(__file__).with_name("tryit_static")
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}
# the pages' own origin only; images the visitor picks are shown from blob: URLs
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
KINDS = {"text": "text", "image": "image", "number": "tabular", "category": "tabular", "tensor": "tensor"}


def model_kind(view: ModelView) -> str:
    """What a person gives the model, from its inputs' kinds: text, image, tabular, tensor (or a mix)."""
    kinds = sorted({KINDS.get(i["kind"], i["kind"]) for i in view.inputs})
    return "+".join(kinds) or "none"


def version_entry(view: ModelView) -> dict:
    return {"version": view.version, "ready": view.load_error is None, "error": view.load_error,
            "max_batch_size": view.max_batch_size, "batched": view.batched,
            "inputs": [dict(i) for i in view.inputs], "outputs": [dict(o) for o in view.outputs]}


class TryIt:
    def __init__(self, service: Service, keys: KeyRing | None = None):
        self.svc, self.keys = service, keys
        self.files = {p.name: p.read_bytes() for p in STATIC.iterdir() if p.suffix in TYPES}

    @staticmethod
    def owns(parts: list[str]) -> bool:
        """Whether a path is one of the pages' (cheap: every request asks)."""
        return not parts or (len(parts) > 2 and parts[1] == "try" and parts[0] == "v2") \
            or (len(parts) == 4 and parts[3] == "try" and parts[1] == "models" and parts[0] == "v2")

    @staticmethod
    def shell(parts: list[str]) -> bool:
        """Of ``owns``'s paths, those open without a key: the pages and their files, all but the feed."""
        return parts[1:3] != ["try", "models"]

    async def handle(self, method: str, parts: list[str], grant: Grant | None):
        """``grant``: the caller's key, checked by the door (None with keys off, and for a ``shell`` path)."""
        if method != "GET":  # not HEAD: the HTTP core sends whatever body it is given
            raise HttpError(405, "the pages take GET")
        if not parts:
            return self.page("landing.html")
        if parts[1] == "models":  # /v2/models/{name}/try
            if self.keys is None:
                await self.svc.view(parts[2], None)  # an unknown model: 404, as everywhere
            return self.page("try.html")
        rest = parts[2:]
        if rest[0] == "models" and len(rest) <= 2:
            return await self.feed(rest[1] if len(rest) == 2 else None, grant)
        body = self.files.get(rest[0]) if len(rest) == 1 else None
        if body is None or rest[0].endswith(".html"):
            raise HttpError(404, "not found")
        return 200, {"Content-Type": TYPES[Path(rest[0]).suffix], "Cache-Control": "no-cache",
                     "X-Content-Type-Options": "nosniff"}, body

    def page(self, name: str):
        return 200, {"Content-Type": TYPES[".html"], "Cache-Control": "no-cache",
                     "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                     "Referrer-Policy": "no-referrer"}, self.files[name]

    async def feed(self, name: str | None, grant: Grant | None):
        """The models the pages show, as ``grant``'s key may see them."""
        if name is not None:
            guard.hidden(grant, name, None)
            await self.svc.view(name, None)  # an unknown model: 404 in its words
        else:
            await self.svc.up.wait_models()
        catalog = self.svc.up.catalog
        names = [name] if name is not None else sorted({*catalog.views, *catalog.left_out})
        models = guard.visible(grant, [self.entry(n) for n in names])
        body = {"server_ready": self.svc.up.ready, "models": models}
        return 200, {"Content-Type": "application/json", "Cache-Control": "no-store"}, \
            json.dumps(body).encode()

    def entry(self, name: str) -> dict:
        catalog = self.svc.up.catalog
        why = catalog.left_out.get(name)
        if why is not None:  # the start left it out: no version, only why
            return {"name": name, "kind": "none", "default_version": None, "left_out": why, "versions": []}
        versions = catalog.views.get(name, {})
        default = catalog.default.get(name)
        first = versions.get(default or "") or next(iter(versions.values()), None)
        return {"name": name, "kind": model_kind(first) if first else "none", "default_version": default,
                "left_out": None, "versions": [version_entry(v) for _, v in sorted(versions.items())]}
