"""Who owns the client's end of a local TCP connection (``gateway/peers.py``), from the kernel (sock_diag
netlink, and the /proc tables it falls back to): the connecting socket's uid, over IPv4, IPv6 and a v4
client of a dual-stack listener, by its exact four-tuple or (a wildcard listener) by port; no such socket,
a listener, or a client socket already closed is ``Unknown``."""
from __future__ import annotations

import os
import socket

import pytest

from aieng.gateway.peers import TABLES, Caller, Unknown, owner_uid, scan_uid


def scan(caller: Caller) -> int:
    return scan_uid(caller, TABLES)


@pytest.mark.parametrize("family,host,to", [(socket.AF_INET, "127.0.0.1", "127.0.0.1"),
                                            (socket.AF_INET6, "::1", "::1"),
                                            (socket.AF_INET6, "::", "127.0.0.1"),  # v4 client, dual stack
                                            (socket.AF_INET, "127.0.0.1", "::ffff:127.0.0.1")])  # as grpc
@pytest.mark.parametrize("lookup", [owner_uid, scan])
def test_the_connecting_socket_is_ours(family, host, to, lookup):
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(4)
    client = socket.socket(socket.AF_INET6 if ":" in to else socket.AF_INET, socket.SOCK_STREAM)
    client.connect((to, server.getsockname()[1]))
    conn, _ = server.accept()
    try:
        peer, local = conn.getpeername(), conn.getsockname()
        assert lookup(Caller(peer[0], peer[1], local[0], local[1])) == os.geteuid()
        assert lookup(Caller(peer[0], peer[1], None, local[1])) == os.geteuid()  # port only
        with pytest.raises(Unknown):  # another gateway port: no such connection
            lookup(Caller(peer[0], peer[1], local[0], local[1] + 1))
        with pytest.raises(Unknown):  # the listener's own address is no client's end
            lookup(Caller(local[0], local[1], peer[0], peer[1] + 1))
        client.close()  # orphaned (FIN_WAIT): the kernel no longer records its owner
        with pytest.raises(Unknown):
            lookup(Caller(peer[0], peer[1], local[0], local[1]))
    finally:
        for s in (server, client, conn):
            s.close()


def test_not_an_address_is_unknown():
    with pytest.raises(Unknown):
        owner_uid(Caller("unix:/x", 0, None, 1))
