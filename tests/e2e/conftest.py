"""tritonclient over a test module's ``server`` (its own fixture, or the shared one of tests/conftest.py):
``http`` and ``grpc_client``, one each per module, closed after it (tritonclient is imported only where a
test asks for one)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def http(server):
    import tritonclient.http as th

    c = th.InferenceServerClient(server.oip_http, concurrency=16)  # a pool for the tests' concurrent calls
    yield c
    c.close()


@pytest.fixture(scope="module")
def grpc_client(server):
    import tritonclient.grpc as tg

    c = tg.InferenceServerClient(server.oip_grpc)
    yield c
    c.close()
