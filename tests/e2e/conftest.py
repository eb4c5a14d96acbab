"""tritonclient over a test module's ``server`` (its own fixture, or the shared one of tests/conftest.py):
``http`` and ``grpc_client``, one each per module, closed after it (tritonclient is imported only where a
test asks for one).  After each module its garbage is collected on the main thread: a tritonclient HTTP
client left in a reference cycle, collected later on another test's thread, fails its ``__del__``
(gevent's hub belongs to the thread that made it) and pytest reports that as a warning.
"""
from __future__ import annotations

import gc

import pytest


@pytest.fixture(scope="module", autouse=True)
def collect_after_module():
    yield
    gc.collect()


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
