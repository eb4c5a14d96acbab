"""Who is at the other end of a TCP connection from this host: the uid the kernel records for the client's
socket (what identd answers), so that per-client rules rest on the kernel's word, never the client's.

The kernel keeps, for each TCP socket of this network namespace, its local and remote address, its owner's
uid (the fsuid of the process that created it) and its inode.  A client connected from (host, port) to the
gateway's (local_host, local_port) owns the socket whose local address is (host, port) and remote address
(local_host, local_port).  ``owner_uid`` asks for that one socket by its four-tuple over sock_diag netlink
(what ``ss`` uses: one lookup, tens of microseconds), and reads the whole of /proc/net/tcp{,6} instead
(O(sockets): milliseconds on a host with thousands) where netlink cannot answer (no inet_diag) or the
gateway's own address is not known.  It answers the socket's uid and raises ``Unknown`` where it cannot
answer for certain:

    no entry        the client is on another host or in another network namespace
    inode 0         an orphaned socket (its process closed it; FIN_WAIT, TIME_WAIT): the kernel shows uid 0
    uids disagree   several entries match (a wildcard gRPC listener, whose own address a call does not
                    tell: only its port is matched) and they are not all one owner's

Sound because the lookup runs while the connection is open (during one of its requests): the gateway's end
holds the four-tuple, so no other socket can take it until both ends close.  A socket handed to another
process (SCM_RIGHTS) keeps its creator's uid: the creator lent it its identity, as with any descriptor.
A caller resolves once per request (``Caller.uid``).
"""
from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from dataclasses import dataclass

TABLES = {"/proc/net/tcp": 4, "/proc/net/tcp6": 6}
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLMSG_ERROR, NLM_F_REQUEST = 4, 20, 2, 1
TCP_LISTEN = 10
ALL_STATES = 0xFFFFFFFF
NO_COOKIE = 0xFFFFFFFF
HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
REQUEST = struct.Struct("=BBBBI2s2s16s16sIII")  # inet_diag_req_v2 with its inet_diag_sockid
ANSWER = struct.Struct("=BBBB2s2s16s16sIIIIIIII")  # inet_diag_msg: ..., expires, rqueue, wqueue, uid, inode
MISSING = -1  # netlink answered: no such socket (in that family)


class Unknown(LookupError):
    """The connection's owner cannot be told for certain."""


@dataclass
class Caller:
    """One request's client, as its transport sees the connection.  ``uid`` is filled on first need and
    kept for the request (the connection's owner cannot change while it is open)."""
    host: str  # the client's address and port
    port: int
    local_host: str | None  # the gateway's end; None: a wildcard listener, its address not known
    local_port: int
    uid: int | None = None
    principal: str = ""  # whose request (``principal.principal``) when a key or certificate says; "": host


def _v4_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    addr = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _tokens(host: str, port: int) -> dict[int, str]:
    """``host:port`` as each table writes it (addresses in the host's byte order per 32-bit word, the
    port big-endian), by table family; an IPv4 address also as the v4-mapped address of an IPv6 socket."""
    addr, hport = _v4_of(host), f":{port:04X}"
    if isinstance(addr, ipaddress.IPv4Address):
        mapped = socket.inet_pton(socket.AF_INET6, f"::ffff:{addr}")
        return {4: "%08X" % struct.unpack("=I", addr.packed)[0] + hport,
                6: "".join("%08X" % w for w in struct.unpack("=4I", mapped)) + hport}
    return {6: "".join("%08X" % w for w in struct.unpack("=4I", addr.packed)) + hport}


def _addr(family: int, raw: bytes) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if family == socket.AF_INET:
        return ipaddress.IPv4Address(raw[:4])
    addr = ipaddress.IPv6Address(raw[:16])
    return addr.ipv4_mapped or addr


class Diag:
    """Lookups of one socket by its four-tuple over sock_diag netlink (``None``: netlink cannot tell)."""

    def __init__(self):
        self.works = False  # once one lookup was answered, "no such socket" means just that

    def uid(self, caller: Caller) -> int | None:
        try:
            src, dst = _v4_of(caller.host), _v4_of(caller.local_host or "")
        except ValueError:
            return None
        fams = [(socket.AF_INET, src.packed, dst.packed)] if src.version == dst.version == 4 else []
        mapped = [ipaddress.IPv6Address(f"::ffff:{a}") if a.version == 4 else a for a in (src, dst)]
        fams.append((socket.AF_INET6, mapped[0].packed, mapped[1].packed))
        for family, s, d in fams:
            got = self._ask(family, caller.port, caller.local_port, s, d)
            if got is not None:
                return got
        return MISSING if self.works else None

    def _ask(self, family: int, sport: int, dport: int, src: bytes, dst: bytes) -> int | None:
        req = REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, ALL_STATES, struct.pack(">H", sport),
                           struct.pack(">H", dport), src.ljust(16, b"\0"), dst.ljust(16, b"\0"), 0, NO_COOKIE,
                           NO_COOKIE)
        try:
            with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
                nl.settimeout(1.0)
                nl.send(HEADER.pack(HEADER.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + req)
                data = nl.recv(8192)
        except OSError:
            return None
        if len(data) < HEADER.size:
            return None
        kind = HEADER.unpack_from(data)[1]
        if kind == NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, HEADER.size)[0]
            return MISSING if code == errno.ENOENT and self.works else None
        if kind != SOCK_DIAG_BY_FAMILY or len(data) < HEADER.size + ANSWER.size:
            return None
        f = ANSWER.unpack_from(data, HEADER.size)
        self.works = True
        # the lookup can fall back to a listener on (src, sport): only the exact connected socket counts.
        # The answer is in the socket's own family (a v6 socket connected to a v4-mapped address answers a
        # v4 lookup), so addresses are compared as addresses
        if f[1] == TCP_LISTEN or f[4] != struct.pack(">H", sport) or f[5] != struct.pack(">H", dport) \
                or _addr(f[0], f[6]) != _addr(family, src) or _addr(f[0], f[7]) != _addr(family, dst):
            return MISSING
        if f[15] == 0:
            raise Unknown("the client's socket is closed (orphaned): its owner is not recorded")
        return f[14]


DIAG = Diag()


def owner_uid(caller: Caller, tables: dict[str, int] | None = None) -> int:
    """The uid owning the client's socket of ``caller``'s connection, or ``Unknown``."""
    if caller.local_host and tables is None:
        uid = DIAG.uid(caller)
        if uid == MISSING:
            raise Unknown("no socket of this host holds the client's end")
        if uid is not None:
            return uid
    return scan_uid(caller, TABLES if tables is None else tables)


def scan_uid(caller: Caller, tables: dict[str, int]) -> int:
    """``owner_uid`` by reading the whole tables."""
    try:
        mine = _tokens(caller.host, caller.port)
        theirs = _tokens(caller.local_host, caller.local_port) if caller.local_host else {}
    except ValueError:
        raise Unknown(f"{caller.host!r} is not an IP address") from None
    port_only = f":{caller.local_port:04X}"
    uids: set[int] = set()
    for path, family in tables.items():
        want = mine.get(family)
        if want is None:
            continue
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            if want not in line:  # the cheap test first: most lines are other sockets
                continue
            f = line.split()
            if len(f) < 10 or f[1] != want:
                continue
            remote_ok = f[2] == theirs.get(family) if theirs else f[2].endswith(port_only)
            if not remote_ok:
                continue
            if f[9] == "0":
                raise Unknown("the client's socket is closed (orphaned): its owner is not recorded")
            uids.add(int(f[7]))
    if len(uids) != 1:
        raise Unknown("no socket of this host holds the client's end" if not uids
                      else "the client's end matches sockets of several users")
    return uids.pop()
