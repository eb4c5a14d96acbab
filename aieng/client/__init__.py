"""The client side: ``Client`` (blocking) and ``AsyncClient`` (many requests in flight) over the native
protocol (``single.py``; ``AsyncClient`` on ``core.py``, the request/reply core the gateway uses too); given
several endpoints they are ``ReplicaClient`` / ``AsyncReplicaClient`` (``replica_sync.py``,
``replica_async.py``, on ``replica_base.py`` and the pure ``endpoints.py``).  Which one an address gets is
decided in one place, ``factory.py`` (``make_client``, ``make_async_client``)."""
from aieng.client.factory import AsyncClient, Client, make_async_client, make_client
from aieng.client.replica_async import AsyncReplicaClient
from aieng.client.replica_sync import ReplicaClient
from aieng.client.single import ServerError, build_request, decode_reply, server_addr

__all__ = ["AsyncClient", "AsyncReplicaClient", "Client", "ReplicaClient", "ServerError", "build_request",
           "decode_reply", "make_async_client", "make_client", "server_addr"]
