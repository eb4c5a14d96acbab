"""Triton's system shared-memory extension: the regions one gateway process has mapped.

A client makes a POSIX shared-memory object ("/key", i.e. /dev/shm/key) and registers (name, key, offset,
byte_size); the gateway maps that window read/write and requests name a region, offset and size per tensor.

    register    name unused; key "/<name>", a regular file, not aieng's own "aieng." segments; the window
                inside it; within the peer's and the total bounds -> mapped (its fd kept)
    read/write  offset + size inside the window and the object still covering it (a truncated object
                would SIGBUS); a copy under the lock, so no view outlives the call
    unregister  one name (unknown: no error, as Triton) or all: unmapped at once
    sweep       every SWEEP_S: a region whose key was unlinked or replaced is unmapped
    close       gateway stop: every mapping released

Names are server-wide as in Triton; bounds are per peer (client address) and in total (regions, bytes).
"""
from __future__ import annotations

import ipaddress
import mmap
import os
import stat
import threading
from dataclasses import dataclass

from aieng.config import Config
from aieng.wire import protocol as p
from aieng.wire.shm import PREFIX

SHM_DIR = "/dev/shm"
SWEEP_S = 1.0
NOT_FOUND = "SHM_NOT_FOUND"  # 404 / NOT_FOUND (Triton's TRITONSERVER_ERROR_NOT_FOUND)
ALREADY_EXISTS = "ALREADY_EXISTS"  # 400 / ALREADY_EXISTS
EXHAUSTED = "RESOURCE_EXHAUSTED"  # 429 / RESOURCE_EXHAUSTED: a bound on regions or bytes
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
    client_regions: int  # per peer
    client_bytes: int


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    peer: str
    inode: tuple[int, int]  # (st_dev, st_ino) when registered: a replaced key is a different object
    mm: mmap.mmap | None
    at: int  # where the window starts in ``mm`` (mmap maps from a page boundary)
    fd: int  # kept open: each access first checks the object still covers the window (below)

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
    thread (one lock)."""

    def __init__(self, limits: Limits, mode: str = "local", off_why: str = "AIENG_OIP_SHARED_MEMORY=off"):
        if mode not in MODES:
            raise ValueError(f"shared memory mode must be one of {MODES}, got {mode!r}")
        self.limits, self.mode, self.off_why = limits, mode, off_why
        self.regions: dict[str, Region] = {}
        self.lock = threading.Lock()

    def allowed(self, peer: str) -> None:
        """Refuse a peer the extension is not served to (every register, status and use asks)."""
        if self.mode == "off":
            raise p.RequestError("UNSUPPORTED", f"system shared memory is not served ({self.off_why})")
        if self.mode == "local" and not is_local(peer):
            raise p.RequestError("PERMISSION_DENIED", "system shared memory is served to local (loopback) "
                                                      "clients only (AIENG_OIP_SHARED_MEMORY=local)")

    def register(self, peer: str, name: object, key: object, offset: object, byte_size: object) -> None:
        self.allowed(peer)
        if not isinstance(name, str) or not name or len(name) > 255:
            raise _bad("a shared memory region needs a non-empty name")
        path = check_key(key)
        offset, byte_size = check_size(offset, "offset"), check_size(byte_size, "byte_size")
        if byte_size == 0:
            raise _bad(f"failed to register shared memory region '{name}': byte_size must be > 0")
        with self.lock:
            if name in self.regions:
                raise p.RequestError(ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
            self._check_bounds(peer, byte_size)
            try:
                # O_NONBLOCK: a FIFO someone made there must not hang the loop before the S_ISREG check
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError as exc:
                raise _bad(f"Unable to open shared memory region: '{key}' ({exc.strerror})") from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise _bad(f"shared memory key '{key}' is not a shared memory object")
                if offset + byte_size > st.st_size:
                    raise _bad(f"failed to register shared memory region '{name}': offset {offset} + "
                               f"byte_size {byte_size} is beyond the {st.st_size} bytes of '{key}'")
                try:  # mmap wants a page-aligned offset: map from the page below and keep the rest
                    base = offset - offset % mmap.ALLOCATIONGRANULARITY
                    mm = mmap.mmap(fd, offset + byte_size - base, offset=base)
                except OSError as exc:
                    raise _bad(f"failed to register shared memory region '{name}': {exc}") from None
            except BaseException:
                os.close(fd)
                raise
            self.regions[name] = Region(name, key, offset, byte_size, peer, (st.st_dev, st.st_ino), mm,
                                        offset - base, fd)

    def _check_bounds(self, peer: str, byte_size: int) -> None:
        lim = self.limits
        mine = [r for r in self.regions.values() if r.peer == peer]
        total = sum(r.byte_size for r in self.regions.values())
        if len(self.regions) >= lim.regions or total + byte_size > lim.bytes:
            raise p.RequestError(EXHAUSTED, f"shared memory: the gateway holds {len(self.regions)} regions "
                                            f"of {total} bytes (at most {lim.regions} regions, {lim.bytes} "
                                            "bytes: AIENG_OIP_SHM_MAX_REGIONS, AIENG_OIP_SHM_MAX_BYTES)")
        mine_bytes = sum(r.byte_size for r in mine)
        if len(mine) >= lim.client_regions or mine_bytes + byte_size > lim.client_bytes:
            raise p.RequestError(EXHAUSTED, f"shared memory: client {peer} holds {len(mine)} regions of "
                                            f"{mine_bytes} bytes (at most {lim.client_regions} regions, "
                                            f"{lim.client_bytes} bytes: AIENG_OIP_SHM_CLIENT_REGIONS, "
                                            "AIENG_OIP_SHM_CLIENT_BYTES)")

    def unregister(self, peer: str, name: str | None) -> None:
        """One region (``name``; unknown: nothing to do, as in Triton) or every region (``None``)."""
        self.allowed(peer)
        self._drop(name)

    def _drop(self, name: str | None) -> None:
        with self.lock:
            names = list(self.regions) if name is None else [name] if name in self.regions else []
            for n in names:
                self._release(self.regions.pop(n))

    @staticmethod
    def _release(region: Region) -> None:
        if region.mm is not None:
            region.mm.close()
            region.mm = None
            os.close(region.fd)

    def status(self, peer: str, name: str | None) -> list[dict]:
        self.allowed(peer)
        with self.lock:
            if name is None:
                return [r.status() for r in self.regions.values()]
            region = self.regions.get(name)
            if region is None:
                raise p.RequestError(NOT_FOUND, f"Unable to find system shared memory region: '{name}'")
            return [region.status()]

    def _find(self, name: object, offset: int, size: int, what: str) -> tuple[Region, int]:
        """The region and the position in its mapping of ``size`` bytes at ``offset``; bounds checked."""
        region = self.regions.get(name) if isinstance(name, str) else None
        if region is None or region.mm is None:
            raise p.RequestError(NOT_FOUND, f"{what}: Unable to find shared memory region: '{name}'")
        if offset + size > region.byte_size:
            raise _bad(f"{what}: offset {offset} + byte size {size} is beyond shared memory region "
                       f"'{name}' of {region.byte_size} bytes")
        # a page of the mapping past the object's end (its owner truncated it) would SIGBUS the gateway
        if os.fstat(region.fd).st_size < region.offset + region.byte_size:
            raise _bad(f"{what}: shared memory region '{name}' was truncated below its window by its owner")
        return region, region.at + offset

    def check(self, peer: str, name: object, offset: int, size: int, what: str) -> None:
        self.allowed(peer)
        with self.lock:
            self._find(name, offset, size, what)

    def read(self, peer: str, name: object, offset: int, size: int, what: str) -> bytes:
        self.allowed(peer)
        with self.lock:
            region, at = self._find(name, offset, size, what)
            return region.mm[at:at + size]  # a copy: nothing keeps the mapping exported

    def write(self, peer: str, name: object, offset: int, data: bytes, what: str) -> None:
        self.allowed(peer)
        with self.lock:
            region, at = self._find(name, offset, len(data), what)
            region.mm[at:at + len(data)] = data

    def sweep(self) -> list[str]:
        """Unmap each region whose key is gone or names another object now; the names released."""
        gone = []
        with self.lock:
            for name, region in list(self.regions.items()):
                try:
                    st = os.stat(os.path.join(SHM_DIR, region.key[1:]), follow_symlinks=False)
                    same = (st.st_dev, st.st_ino) == region.inode
                except OSError:
                    same = False
                if not same:
                    self._release(self.regions.pop(name))
                    gone.append(name)
        return gone

    def close(self) -> None:
        self._drop(None)


def from_config(cfg: Config) -> SystemShm:
    """The gateway's registry; off with several gateways (a region lives in the process that mapped it,
    and SO_REUSEPORT sends a client's next connection to any of them)."""
    limits = Limits(cfg.oip_shm_max_regions, cfg.oip_shm_max_bytes, cfg.oip_shm_client_regions,
                    cfg.oip_shm_client_bytes)
    if cfg.gateways > 1:
        return SystemShm(limits, "off", f"it needs AIENG_GATEWAY_WORKERS=1, not {cfg.gateways}")
    return SystemShm(limits, cfg.oip_shared_memory)
