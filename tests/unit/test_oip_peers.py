"""Who owns the client's end of a local TCP connection (``gateway/peers.py``), from the kernel's tables:
the connecting socket's uid, over IPv4 and IPv6, by its exact four-tuple or (a wildcard listener) by port;
no entry, or a client socket already closed, is ``Unknown``."""
from __future__ import annotations

import os
import socket

import pytest

from aieng.gateway.peers import Caller, Unknown, owner_uid


def pair(family: int, host: str):
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(4)
    client = socket.create_connection(server.getsockname()[:2])
    conn, _ = server.accept()
    return server, client, conn


@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_the_connecting_socket_is_ours(family, host):
    server, client, conn = pair(family, host)
    try:
        peer, local = conn.getpeername(), conn.getsockname()
        assert owner_uid(Caller(peer[0], peer[1], local[0], local[1])) == os.geteuid()
        assert owner_uid(Caller(peer[0], peer[1], None, local[1])) == os.geteuid()  # port only
        with pytest.raises(Unknown):  # the listener's own port is no client's end
            owner_uid(Caller(local[0], local[1], peer[0], peer[1] + 1))
        client.close()  # orphaned (FIN_WAIT): the kernel no longer records its owner
        with pytest.raises(Unknown):
            owner_uid(Caller(peer[0], peer[1], local[0], local[1]))
    finally:
        for s in (server, client, conn):
            s.close()


def test_not_an_address_is_unknown():
    with pytest.raises(Unknown):
        owner_uid(Caller("unix:/x", 0, None, 1))
