"""Who is at the other end of a TCP connection from this host: the uid the kernel records for the client's
socket (what identd answers), so that per-client rules rest on the kernel's word, never the client's.

/proc/net/tcp and /proc/net/tcp6 list the TCP sockets of this network namespace, each with its local and
remote address, its owner's uid (the fsuid of the process that created it) and its inode.  A client
connected from (host, port) to the gateway's (local_host, local_port) owns the entry whose local address
is (host, port) and remote address (local_host, local_port).  ``owner_uid`` answers that entry's uid and
raises ``Unknown`` where it cannot answer for certain:

    no entry        the client is on another host or in another network namespace
    inode 0         an orphaned socket (its process closed it; FIN_WAIT, TIME_WAIT): the kernel shows uid 0
    uids disagree   several entries match (a wildcard gRPC listener, whose own address a call does not
                    tell: only its port is matched) and they are not all one owner's

Sound because the lookup runs while the connection is open (during one of its requests): the gateway's end
holds the four-tuple, so no other socket can take it until both ends close.  A socket handed to another
process (SCM_RIGHTS) keeps its creator's uid: the creator lent it its identity, as with any descriptor.
One scan reads the whole table (O(sockets)); a caller resolves once per request (``Caller.uid``).
"""
from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

TABLES = {"/proc/net/tcp": 4, "/proc/net/tcp6": 6}


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


def owner_uid(caller: Caller, tables: dict[str, int] | None = None) -> int:
    """The uid owning the client's socket of ``caller``'s connection, or ``Unknown``."""
    try:
        mine = _tokens(caller.host, caller.port)
        theirs = _tokens(caller.local_host, caller.local_port) if caller.local_host else {}
    except ValueError:
        raise Unknown(f"{caller.host!r} is not an IP address") from None
    port_only = f":{caller.local_port:04X}"
    uids: set[int] = set()
    for path, family in (TABLES if tables is None else tables).items():
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
