"""Per-client fairness on the client socket: message rates and replies nobody reads.

``ClientGate`` keeps token buckets per client (``owner_of``; one second of burst): one
for every message when ``client_rate_limit`` > 0, one for its non-infer ops (``max_ops_per_s``),
so a flood of health/models/stats cannot starve inference or anyone else's health checks.
``allow`` says why a message is over a limit (the server answers it OVERLOADED at once); beyond
``MAX_TRACKED`` clients the least recently seen one's buckets are forgotten.  ``dropped`` and
``limited`` hold the counts (``aieng_client_*`` metrics).

``via_of`` reads the OIP peer a gateway names beside the gateways' secret token: the request's principal
(``key:<name>``, ``cert:<subject>``) or its client's address (``gateway/principal.py``).  ``peer_of`` says
which client a request counts as for the drift reference (drift.py): that OIP peer, else its network
address (the TCP peer's IP as ZMQ reports it), else (ipc) its connection.  ``owner_of`` says whose share
of the per-client in-flight limit (admission.py) and of the rate limits (``ClientGate``) it takes: that
OIP peer, else with CURVE on the client's public key (the ZAP User-Id: all the connections of one key are
one client, two keys behind one address two), else its connection, as without CURVE.

``client_socket`` builds the client ROUTER (and its CURVE authenticator, when configured;
``curve_server`` serves the admin socket too) with a send queue of ``client_send_queue`` messages
(SNDHWM) and ROUTER_MANDATORY: a reply to a client that does not read, or is gone, raises instead
of queueing without bound, and the server drops and counts it.  The limits, as a client sees them:
docs/protocol.md, "Limits"; how they fit together: docs/architecture.md, "Lifecycle" (overload and fairness).
"""
from __future__ import annotations

import hmac
import logging
from collections import OrderedDict
from typing import Any

import zmq

from aieng.config import Config
from aieng.httpcore.fair import peer_key

MAX_TRACKED = 10_000  # clients with a bucket; the least recently seen go first


class Bucket:
    __slots__ = ("rate", "tokens", "at")

    def __init__(self, rate: float, now: float):
        self.rate, self.tokens, self.at = rate, rate, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class ClientGate:
    def __init__(self, client_rate: float, ops_rate: float):
        self.client_rate, self.ops_rate = client_rate, ops_rate
        self.buckets: OrderedDict[bytes | str, tuple[Bucket | None, Bucket]] = OrderedDict()
        self.dropped = {"full": 0, "gone": 0}  # replies dropped: client not reading / disconnected
        self.limited = {"client_rate": 0, "ops_rate": 0}  # messages refused OVERLOADED

    def allow(self, client: bytes | str, is_infer: bool, now: float) -> str | None:
        """None when the message may proceed; else why it is refused."""
        pair = self.buckets.get(client)
        if pair is None:
            pair = self.buckets[client] = (Bucket(self.client_rate, now) if self.client_rate > 0 else None,
                                           Bucket(self.ops_rate, now))
            if len(self.buckets) > MAX_TRACKED:
                self.buckets.popitem(last=False)
        else:
            self.buckets.move_to_end(client)
        every, ops = pair
        if every is not None and not every.take(now):
            self.limited["client_rate"] += 1
            return f"over this client's rate limit of {self.client_rate:g} messages/s"
        if not is_infer and not ops.take(now):
            self.limited["ops_rate"] += 1
            return f"over this client's limit of {self.ops_rate:g} health/models/stats messages/s"
        return None

    def view(self) -> dict:
        return {"replies_dropped": dict(self.dropped), "refused": dict(self.limited)}


MAX_PEER_CHARS = 256  # an address, or a principal (an API key's name, a certificate's subject)


def via_of(req: dict, gateway_token: str) -> str | None:
    """The OIP peer a gateway names for its request (only with the gateways' token), as
    ``httpcore.fair.peer_key`` counts an address (a principal is kept as it is); None: not a gateway's."""
    via: Any = req.get("via")
    if gateway_token and isinstance(via, dict):
        token, peer = via.get("token"), via.get("peer")
        if (isinstance(token, str) and isinstance(peer, str) and peer
                and hmac.compare_digest(token.encode(), gateway_token.encode())):
            return peer_key(peer[:MAX_PEER_CHARS])
    return None


def owner_of(identity: zmq.Frame, via: str | None, curve: bool) -> bytes | str:
    """Whose share of the per-client limit a request takes (``RequestTable.client_load``): the OIP peer
    its gateway names, else with CURVE on its client's public key (Z85, from the ZAP User-Id), else its
    connection (the ROUTER identity)."""
    if via is not None:
        return "via:" + via
    if curve:
        try:
            key = identity.get("User-Id")
        except (zmq.ZMQError, AttributeError):
            key = ""
        if key:
            return "curve:" + key
    return identity.bytes


def peer_of(identity: zmq.Frame, via: str | None) -> str:
    """The client a request counts as: the OIP peer a gateway names (``via_of``), else the address the
    connection comes from, else (ipc, no address) ``"ipc"``.  An address counts as
    ``httpcore.fair.peer_key`` says (an IPv6 one by its /64), so one host's many addresses of a /64 are one
    client; every ipc connection is one client (a local process can open as many as it likes); a gateway's
    requests are each their own peer's."""
    if via is not None:
        return via
    try:
        addr = identity.get("Peer-Address")
    except (zmq.ZMQError, AttributeError):  # no address (ipc), or not a received frame
        addr = ""
    return peer_key(str(addr)[:MAX_PEER_CHARS]) if addr else "ipc"


def client_socket(ctx: zmq.Context, cfg: Config, log: logging.Logger):
    """The client ROUTER, bound, and the CURVE authenticator thread (None without CURVE)."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 1000)
    # A reply to a client that is gone, or whose send queue (SNDHWM messages) is full because it
    # does not read, raises instead of queueing without bound: we drop it and count it.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.SNDHWM, cfg.client_send_queue)
    sock.setsockopt(zmq.RCVHWM, cfg.client_send_queue)
    # A second connection using an identity already connected takes it over (and gets the
    # answers) instead of being silently ignored.
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    # ZMQ drops a connection on a message over MAXMSGSIZE; keep that far above our own
    # limit so an oversized request still gets its INVALID_REQUEST answer.
    sock.setsockopt(zmq.MAXMSGSIZE, 4 * cfg.max_message_bytes)
    if sock.getsockopt(zmq.IPV6) == 0 and cfg.frontend_addr.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)
    auth = curve(ctx, sock, cfg, log) if cfg.curve_secret_key_file else None
    sock.bind(cfg.frontend_addr)
    return sock, auth


def curve(ctx: zmq.Context, sock: zmq.Socket, cfg: Config, log: logging.Logger):
    """Encrypt the client socket with CURVE; with a keys dir, only those client keys get in (and the
    OIP gateways' own key)."""
    auth = curve_server(ctx, sock, cfg.curve_secret_key_file, cfg.curve_client_keys_dir,
                        cfg.gateway_curve_key if cfg.curve_client_keys_dir else "")
    keys = cfg.curve_client_keys_dir
    log.info("client socket encrypted with CURVE (%s)", "allowed keys from " + keys if keys else "any key")
    return auth


def curve_server(ctx: zmq.Context, sock: zmq.Socket, secret_key_file: str, keys_dir: str,
                 also_secret: str = ""):
    """Make ``sock`` a CURVE server with the certificate in ``secret_key_file``; only the public keys in
    ``keys_dir`` get in (any key when it is empty), plus the one derived from ``also_secret``.  Used by
    the client socket and the admin socket, each with its own files.  Returns the running authenticator
    (the caller stops it)."""
    import zmq.auth
    from zmq.auth.thread import ThreadAuthenticator

    public, secret = zmq.auth.load_certificate(secret_key_file)
    if secret is None:
        raise ValueError(f"{secret_key_file} holds no secret key")
    auth = ThreadAuthenticator(ctx)
    auth.start()
    if keys_dir and also_secret:
        auth.configure_curve_callback(domain="*", credentials_provider=_AllowedKeys(keys_dir, also_secret))
    else:
        auth.configure_curve(domain="*", location=keys_dir or zmq.auth.CURVE_ALLOW_ANY)
    sock.curve_secretkey, sock.curve_publickey, sock.curve_server = secret, public, True
    return auth


class _AllowedKeys:
    """ZAP credentials: the public keys in a keys directory (read once at start, as ``configure_curve``
    does) plus the gateway's, derived from its secret."""

    def __init__(self, keys_dir: str, gateway_secret: str):
        self.allowed = set(zmq.auth.load_certificates(keys_dir))
        self.allowed.add(zmq.curve_public(gateway_secret.encode()))

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.allowed
