"""Which client a caller gets, chosen in one readable place (as vLLM's ``make_client``).

``make_client(addr, ...)`` and ``make_async_client(addr, ...)`` read their address: several endpoints (a
list, even of one, or one string with commas: ``endpoints.split_addrs``) give the replica clients
(``ReplicaClient``, ``AsyncReplicaClient``: docs/replicas.md); one address gives ``Client`` or
``AsyncClient``, the single-address clients (``single.py``).  ``Client(addrs)`` and ``AsyncClient(addrs)``
are the documented way in (docs/protocol.md, docs/replicas.md) and stay so: with several endpoints their
``__new__`` hands the call to these functions.  Nothing is registered at import.
"""
from __future__ import annotations

from typing import Any

from aieng.client.endpoints import split_addrs
from aieng.client.replica_async import AsyncReplicaClient
from aieng.client.replica_sync import ReplicaClient
from aieng.client.single import AsyncSingleClient, SingleClient, server_addr


def several(addr: Any) -> bool:
    """Does ``addr`` (or, when None, ``$AIENG_FRONTEND_ADDR``) name replicas rather than one address?"""
    return split_addrs(server_addr(addr)) is not None


def make_client(addr: Any = None, *args: Any, **kw: Any) -> SingleClient:
    """The blocking client for ``addr``: a ``ReplicaClient`` over several endpoints, else a ``Client``."""
    return ReplicaClient(addr, *args, **kw) if several(addr) else Client(addr, *args, **kw)


def make_async_client(addr: Any = None, *args: Any, **kw: Any) -> AsyncSingleClient:
    """The asyncio client for ``addr``: an ``AsyncReplicaClient`` over several endpoints, else an
    ``AsyncClient``."""
    return AsyncReplicaClient(addr, *args, **kw) if several(addr) else AsyncClient(addr, *args, **kw)


class Client(SingleClient):
    """The blocking client (``single.SingleClient``); ``Client(addrs)`` with several endpoints is
    ``make_client(addrs)``, a ``ReplicaClient``."""

    def __new__(cls, addr: Any = None, *args: Any, **kw: Any) -> Any:
        if cls is Client and several(addr):
            return make_client(addr, *args, **kw)  # not a Client: Python does not run __init__ again
        return super().__new__(cls)


class AsyncClient(AsyncSingleClient):
    """The asyncio client (``single.AsyncSingleClient``); ``AsyncClient(addrs)`` with several endpoints is
    ``make_async_client(addrs)``, an ``AsyncReplicaClient``."""

    def __new__(cls, addr: Any = None, *args: Any, **kw: Any) -> Any:
        if cls is AsyncClient and several(addr):
            return make_async_client(addr, *args, **kw)
        return super().__new__(cls)
