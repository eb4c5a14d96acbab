"""API keys on the OIP doors (``AIENG_OIP_API_KEYS_FILE``): the key file, its reload, the constant-time check.

The file holds one key a line, ``#`` comments and blank lines aside::

    PRINCIPAL:KEY                  # this key may use every model
    PRINCIPAL:KEY:model_a,model_b  # this key may use only these models (its allow-list)

``PRINCIPAL`` names who holds the key (letters, digits, ``._@-``, up to ``MAX_NAME`` characters); several
keys may name one principal (rotation: the old key and the new one side by side, one share between them).
``KEY`` is at least ``MIN_KEY`` printable ASCII characters, none of them a space or ``:``; a key may appear
once.  A comment may follow a key after a space (``#`` inside a key is part of it).
``parse`` names the first bad line by its number (``KeyFileError``); the server refuses to start on one.

``KeyRing`` holds the last good keys.  ``check`` answers a bearer token with its ``Grant`` (who, which
models) or None, in time that does not depend on how much of a key was right: the token's SHA-256 digest
is looked up (a dict of digests, so an attacker learns nothing from where a comparison stops) and the
stored digest compared with ``hmac.compare_digest``; never ``==`` on a secret.  ``refresh`` (the
gateway's housekeeping loop calls it about once a second, never a request) stats the file and, when its
mtime, size or inode changed, reads it again; a broken rewrite (or a removed file) keeps the last good
keys and logs an error naming the line.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from dataclasses import dataclass

MIN_KEY = 16
MAX_NAME = 48
NAME = re.compile(r"[A-Za-z0-9._@-]{1,%d}" % MAX_NAME)
MODEL = re.compile(r"[^\s,:/]+")  # a model name is a directory name (no separator, no path)
KEY = re.compile(r"[!-9;-~]{%d,}" % MIN_KEY)  # printable ASCII but ":" and space: as a header carries it
COMMENT = re.compile(r"\s+#")
ENV = "AIENG_OIP_API_KEYS_FILE"


class KeyFileError(ValueError):
    """The key file cannot be used: ``str()`` is one line naming the variable, the file and the line."""


@dataclass(frozen=True)
class Grant:
    """What a key lets its holder do: who it is (``principal``) and which models (None: all)."""
    principal: str
    models: frozenset[str] | None = None

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def parse(text: str, path: str) -> dict[bytes, tuple[bytes, Grant]]:
    """The keys of a key file's ``text``: each key's SHA-256 digest -> (that digest, its grant).
    ``KeyFileError`` names the first bad line."""
    keys: dict[bytes, tuple[bytes, Grant]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = COMMENT.split(line, 1)[0]  # a comment after a key: keys hold no space, so a "#" in one stays

        def bad(why: str) -> KeyFileError:
            return KeyFileError(f"{ENV}: {path} line {number}: {why} (expected PRINCIPAL:KEY or "
                                f"PRINCIPAL:KEY:model_a,model_b)")

        fields = line.split(":")
        if len(fields) not in (2, 3):
            raise bad(f"{len(fields)} ':'-separated fields")
        name, key = fields[0].strip(), fields[1].strip()
        if not NAME.fullmatch(name):
            raise bad(f"the principal must be 1-{MAX_NAME} of A-Z a-z 0-9 . _ @ -")
        if not KEY.fullmatch(key):
            raise bad(f"the key must be at least {MIN_KEY} printable ASCII characters, without spaces")
        models = None
        if len(fields) == 3:
            names = [m.strip() for m in fields[2].split(",")]
            if not names or not all(MODEL.fullmatch(m) for m in names):
                raise bad("the allow-list must be model names separated by commas")
            models = frozenset(names)
        d = digest(key)
        if d in keys:
            raise bad("this key is already given on an earlier line")
        keys[d] = (d, Grant(name, models))
    return keys


def _signature(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev


def load(path: str) -> tuple[dict[bytes, tuple[bytes, Grant]], tuple[int, int, int, int]]:
    """Read and parse the file; ``KeyFileError`` (one line) when it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8-sig") as f:  # an editor's BOM is not part of the first principal
            sig = _signature(os.fstat(f.fileno()))
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{ENV}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse(text, path), sig


class KeyRing:
    def __init__(self, path: str, log: logging.Logger):
        """Reads ``path`` now (``KeyFileError`` when it cannot be used: the start fails)."""
        self.path, self.log = path, log
        self.keys, self.sig = load(path)
        if not self.keys:
            log.warning("%s: %s holds no keys: every OIP request but health is refused", ENV, path)

    def check(self, token: str | None) -> Grant | None:
        """The grant of a bearer ``token``; None when it is missing or no key."""
        if not token:
            return None
        d = digest(token)
        found = self.keys.get(d)  # found by the digest's hash: nothing about the key itself is compared
        if found is None or not hmac.compare_digest(found[0], d):
            return None
        return found[1]

    def refresh(self) -> bool:
        """Take the file again when it changed; whether the keys changed.  Never raises."""
        try:
            sig = _signature(os.stat(self.path))
        except OSError as exc:
            if self.sig != (0, 0, 0, 0):
                self.log.error("%s: cannot read %s (%s): keeping the last good keys", ENV, self.path,
                               exc.strerror or exc)
                self.sig = (0, 0, 0, 0)
            return False
        if sig == self.sig:
            return False
        try:
            keys, sig = load(self.path)
        except KeyFileError as exc:
            self.log.error("%s; keeping the last good keys (%d)", exc, len(self.keys))
            self.sig = sig  # one error per rewrite, not one a second
            return False
        self.keys, self.sig = keys, sig
        self.log.info("%s: %d keys from %s", ENV, len(keys), self.path)
        return True


def bearer(value: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` value (the scheme in any case), else None."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None
