"""Triton's system shared-memory extension: the regions one gateway process holds, per client.

A client makes a POSIX shared-memory object ("/key", i.e. /dev/shm/key) and registers (name, key, offset,
byte_size); requests then name a region, an offset and a size per tensor.  A client is the uid owning its
connection's socket, as the kernel records it (``peers.owner_uid``; unknown: 403), so two processes of one
user are one client (each could open the other's objects anyway: the kernel's boundary is the uid).

    register    the key "/<name>", a regular file, not aieng's own "aieng." segments, that the client's
                uid could open read/write itself (``shmaccess``); the window inside it; the name unused
                by this client; within the client's and the total bounds -> held (its fd open, no mapping)
    read/write  only the client's own regions; offset + size inside the window; ``pread``/``pwrite`` on
                the fd under the lock: an object its owner truncated gives a short read (400), never a
                SIGBUS, and a write first checks (fstat) that the object still covers the window
    status      the client's own regions
    unregister  one of the client's names (unknown: no error, as Triton) or all the client's: closed at once
    sweep       every SWEEP_S: a region whose key was unlinked or replaced is closed
    close       gateway stop: every region released

Names, status, use and unregister are per client (another client's name is 404 / not listed); bounds are
per client and in total (regions, bytes).
"""
from __future__ import annotations

import ipaddress
import os
import stat
import threading
from dataclasses import dataclass
from typing import Callable

from aieng.config import Config
from aieng.gateway import shmaccess
from aieng.gateway.peers import Caller, Unknown, owner_uid
from aieng.wire import protocol as p
from aieng.wire.shm import PREFIX

SHM_DIR = "/dev/shm"
SWEEP_S = 1.0
NOT_FOUND = "SHM_NOT_FOUND"  # 404 / NOT_FOUND (Triton's TRITONSERVER_ERROR_NOT_FOUND)
ALREADY_EXISTS = "ALREADY_EXISTS"  # 400 / ALREADY_EXISTS
EXHAUSTED = "RESOURCE_EXHAUSTED"  # 429 / RESOURCE_EXHAUSTED: a bound on regions or bytes
DENIED = "PERMISSION_DENIED"  # 403 / PERMISSION_DENIED
MODES = ("local", "any", "off")


def _bad(message: str) -> p.RequestError:
    return p.RequestError(p.INVALID_INPUT, message)


def is_local(peer: str) -> bool:
    try:
        return ipaddress.ip_address(peer).is_loopback
    except ValueError:
        return False


@dataclass
class Limits:
    regions: int  # in total
    bytes: int
    client_regions: int  # per client (uid)
    client_bytes: int


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    uid: int  # the client that registered it: the only one that sees, uses and removes it
    inode: tuple[int, int]  # (st_dev, st_ino) when registered: a replaced key is a different object
    fd: int  # -1 once released

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def check_key(key: object) -> str:
    """The object's path under /dev/shm for a ``shm_open`` key ("/name": one leading slash, no other)."""
    if (not isinstance(key, str) or not key.startswith("/") or len(key) < 2 or "/" in key[1:]
            or key[1:] in (".", "..") or "\0" in key or len(key) > 255):
        raise _bad(f"shared memory key {str(key)[:80]!r} must be '/name' (as for shm_open: one leading "
                   "'/', no other)")
    if key[1:].startswith(PREFIX):
        raise _bad(f"shared memory key {key!r} is reserved (aieng's own segments start with '/{PREFIX}')")
    return os.path.join(SHM_DIR, key[1:])


def check_size(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 2 ** 63:
        raise _bad(f"{what} must be a non-negative integer, got {str(value)[:40]!r}")
    return value


class SystemShm:
    """The registry (one per gateway process); every method may be called from the loop or the decoder
    thread (one lock).  ``identify`` tells a caller's uid (``peers.owner_uid``; tests pass their own)."""

    def __init__(self, limits: Limits, mode: str = "local", off_why: str = "AIENG_OIP_SHARED_MEMORY=off",
                 identify: Callable[[Caller], int] = owner_uid):
        if mode not in MODES:
            raise ValueError(f"shared memory mode must be one of {MODES}, got {mode!r}")
        self.limits, self.mode, self.off_why, self.identify = limits, mode, off_why, identify
        self.regions: dict[tuple[int, str], Region] = {}
        self.lock = threading.Lock()

    def allowed(self, caller: Caller) -> int:
        """The caller's uid, or refused: the extension is not served to it, or its owner is unknown."""
        if self.mode == "off":
            raise p.RequestError("UNSUPPORTED", f"system shared memory is not served ({self.off_why})")
        if self.mode == "local" and not is_local(caller.host):
            raise p.RequestError(DENIED, "system shared memory is served to local (loopback) clients only "
                                         "(AIENG_OIP_SHARED_MEMORY=local)")
        if caller.uid is None:
            try:
                caller.uid = self.identify(caller)
            except Unknown as exc:
                raise p.RequestError(DENIED, "system shared memory: the user owning this connection "
                                             f"cannot be told ({exc}); it is served only to clients on "
                                             "this host, in this network namespace") from None
        return caller.uid

    def register(self, caller: Caller, name: object, key: object, offset: object, byte_size: object) -> None:
        uid = self.allowed(caller)
        if not isinstance(name, str) or not name or len(name) > 255:
            raise _bad("a shared memory region needs a non-empty name")
        path = check_key(key)
        offset, byte_size = check_size(offset, "offset"), check_size(byte_size, "byte_size")
        if byte_size == 0:
            raise _bad(f"failed to register shared memory region '{name}': byte_size must be > 0")
        with self.lock:
            if (uid, name) in self.regions:
                raise p.RequestError(ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
            self._check_bounds(uid, byte_size)
            try:
                # O_NONBLOCK: a FIFO someone made there must not hang the loop before the S_ISREG check
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError as exc:
                raise _bad(f"Unable to open shared memory region: '{key}' ({exc.strerror})") from None
            try:
                st = os.fstat(fd)  # the open file itself is judged: nothing can be swapped in between
                if not stat.S_ISREG(st.st_mode):
                    raise _bad(f"shared memory key '{key}' is not a shared memory object")
                if not shmaccess.may_open(st, uid, fd):
                    raise p.RequestError(DENIED, f"shared memory key '{key}': uid {uid} may not open it "
                                                 "read/write (the gateway opens only what its client could)")
                if offset + byte_size > st.st_size:
                    raise _bad(f"failed to register shared memory region '{name}': offset {offset} + "
                               f"byte_size {byte_size} is beyond the {st.st_size} bytes of '{key}'")
            except BaseException:
                os.close(fd)
                raise
            self.regions[(uid, name)] = Region(name, key, offset, byte_size, uid, (st.st_dev, st.st_ino), fd)

    def _check_bounds(self, uid: int, byte_size: int) -> None:
        lim = self.limits
        mine = [r for r in self.regions.values() if r.uid == uid]
        total = sum(r.byte_size for r in self.regions.values())
        if len(self.regions) >= lim.regions or total + byte_size > lim.bytes:
            raise p.RequestError(EXHAUSTED, f"shared memory: the gateway holds {len(self.regions)} regions "
                                            f"of {total} bytes (at most {lim.regions} regions, {lim.bytes} "
                                            "bytes: AIENG_OIP_SHM_MAX_REGIONS, AIENG_OIP_SHM_MAX_BYTES)")
        mine_bytes = sum(r.byte_size for r in mine)
        if len(mine) >= lim.client_regions or mine_bytes + byte_size > lim.client_bytes:
            raise p.RequestError(EXHAUSTED, f"shared memory: client uid {uid} holds {len(mine)} regions of "
                                            f"{mine_bytes} bytes (at most {lim.client_regions} regions, "
                                            f"{lim.client_bytes} bytes: AIENG_OIP_SHM_CLIENT_REGIONS, "
                                            "AIENG_OIP_SHM_CLIENT_BYTES)")

    def unregister(self, caller: Caller, name: str | None) -> None:
        """One of the caller's regions (``name``; unknown: nothing to do, as in Triton) or all of them."""
        uid = self.allowed(caller)
        with self.lock:
            keys = [k for k in self.regions if k[0] == uid and (name is None or k[1] == name)]
            for k in keys:
                self._release(self.regions.pop(k))

    @staticmethod
    def _release(region: Region) -> None:
        if region.fd >= 0:
            os.close(region.fd)
            region.fd = -1

    def status(self, caller: Caller, name: str | None) -> list[dict]:
        uid = self.allowed(caller)
        with self.lock:
            if name is None:
                return [r.status() for r in self.regions.values() if r.uid == uid]
            region = self.regions.get((uid, name))
            if region is None:
                raise p.RequestError(NOT_FOUND, f"Unable to find system shared memory region: '{name}'")
            return [region.status()]

    def _find(self, uid: int, name: object, offset: int, size: int, what: str) -> Region:
        """The caller's region ``name``, with ``size`` bytes at ``offset`` inside its window."""
        region = self.regions.get((uid, name)) if isinstance(name, str) else None
        if region is None or region.fd < 0:
            raise p.RequestError(NOT_FOUND, f"{what}: Unable to find shared memory region: '{name}'")
        if offset + size > region.byte_size:
            raise _bad(f"{what}: offset {offset} + byte size {size} is beyond shared memory region "
                       f"'{name}' of {region.byte_size} bytes")
        return region

    @staticmethod
    def _truncated(name: object, what: str) -> p.RequestError:
        return _bad(f"{what}: shared memory region '{name}' was truncated below its window by its owner")

    def check(self, caller: Caller, name: object, offset: int, size: int, what: str) -> None:
        uid = self.allowed(caller)
        with self.lock:
            region = self._find(uid, name, offset, size, what)
            if os.fstat(region.fd).st_size < region.offset + offset + size:
                raise self._truncated(name, what)

    def read(self, caller: Caller, name: object, offset: int, size: int, what: str) -> bytes:
        uid = self.allowed(caller)
        with self.lock:  # under the lock: an unregister cannot close (and the number be reused) meanwhile
            region = self._find(uid, name, offset, size, what)
            data = os.pread(region.fd, size, region.offset + offset) if size else b""
        if len(data) != size:  # the owner shrank the object: a short read, where a mapping would SIGBUS
            raise self._truncated(name, what)
        return data

    def write(self, caller: Caller, name: object, offset: int, data: bytes, what: str) -> None:
        uid = self.allowed(caller)
        with self.lock:
            region = self._find(uid, name, offset, len(data), what)
            at = region.offset + offset
            # never grow the client's object: a window it shrank is refused (a shrink racing this write
            # can still be undone by it, within the registered window; the gateway is unharmed either way)
            if os.fstat(region.fd).st_size < at + len(data):
                raise self._truncated(name, what)
            view, done = memoryview(data), 0
            while done < len(data):
                done += os.pwrite(region.fd, view[done:], at + done)

    def sweep(self) -> list[str]:
        """Close each region whose key is gone or names another object now; the names released."""
        gone = []
        with self.lock:
            for k, region in list(self.regions.items()):
                try:
                    st = os.stat(os.path.join(SHM_DIR, region.key[1:]), follow_symlinks=False)
                    same = (st.st_dev, st.st_ino) == region.inode
                except OSError:
                    same = False
                if not same:
                    self._release(self.regions.pop(k))
                    gone.append(region.name)
        return gone

    def close(self) -> None:
        with self.lock:
            for region in self.regions.values():
                self._release(region)
            self.regions.clear()


def from_config(cfg: Config) -> SystemShm:
    """The gateway's registry; off with several gateways (a region lives in the process that holds it,
    and SO_REUSEPORT sends a client's next connection to any of them)."""
    limits = Limits(cfg.oip_shm_max_regions, cfg.oip_shm_max_bytes, cfg.oip_shm_client_regions,
                    cfg.oip_shm_client_bytes)
    if cfg.gateways > 1:
        return SystemShm(limits, "off", f"it needs AIENG_GATEWAY_WORKERS=1, not {cfg.gateways}")
    return SystemShm(limits, cfg.oip_shared_memory)
