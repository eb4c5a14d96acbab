"""The native door's client under CURVE is its public key (issue 37): real ROUTER and DEALER sockets, a real
ZAP authenticator, two client keys, one of them over two connections; ``owner_of`` (the per-client limit's
key) and ``peer_of`` (the drift reference's) read from the frames the ROUTER received."""
from __future__ import annotations

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from aieng.frontend.requests.clients import owner_of, peer_of, via_of
from aieng.frontend.requests.table import Request, RequestTable

TOKEN = "gateway-secret"


def _received(router: zmq.Socket) -> list[zmq.Frame]:
    assert router.poll(5000), "nothing arrived"
    return router.recv_multipart(copy=False)


def test_one_key_over_two_connections_is_one_client_and_two_keys_are_two():
    ctx = zmq.Context()
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
    server_pub, server_sec = zmq.curve_keypair()
    keys = [zmq.curve_keypair(), zmq.curve_keypair()]
    router = ctx.socket(zmq.ROUTER)
    router.curve_secretkey, router.curve_publickey, router.curve_server = server_sec, server_pub, True
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealers = []
    try:
        for pub, sec in (keys[0], keys[0], keys[1]):  # key A twice (two connections), key B once
            d = ctx.socket(zmq.DEALER)
            d.curve_publickey, d.curve_secretkey, d.curve_serverkey = pub, sec, server_pub
            d.connect(f"tcp://127.0.0.1:{port}")
            dealers.append(d)
        owners, peers, idents = [], [], []
        for d in dealers:
            d.send(b"{}")
            frames = _received(router)
            owners.append(owner_of(frames[0], None, True))
            peers.append(peer_of(frames[0], None))
            idents.append(frames[0].bytes)
            assert owner_of(frames[0], None, False) == frames[0].bytes  # CURVE off: the connection
            assert owner_of(frames[0], "key:alice", True) == "via:key:alice"  # a gateway's: its principal
        assert owners == ["curve:" + keys[0][0].decode()] * 2 + ["curve:" + keys[1][0].decode()]
        assert len(set(idents)) == 3  # three connections
        assert peers == ["127.0.0.1"] * 3  # the drift reference still counts the address

        table = RequestTable()  # the per-client limit's count: key A's two connections together
        for i, owner in enumerate(owners):
            table.add(Request(table.new_rid(), [idents[i]], i, "m", "1", 1e9, 0.0, {}, owner=owner))
        assert (table.client_load(owners[0]), table.client_load(owners[2])) == (2, 1)
    finally:
        for d in dealers:
            d.close(0)
        router.close(0)
        auth.stop()
        ctx.term()


def test_via_needs_the_gateways_token():
    req = {"via": {"token": TOKEN, "peer": "key:alice"}}
    assert via_of(req, TOKEN) == "key:alice"
    assert via_of({"via": {"token": "forged", "peer": "key:alice"}}, TOKEN) is None
    assert via_of(req, "") is None  # no gateways: nobody may name a peer
    assert via_of({"via": {"token": TOKEN, "peer": "::ffff:10.1.2.3"}}, TOKEN) == "10.1.2.3"
