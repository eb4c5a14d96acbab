"""Triton's CUDA shared-memory extension on a server without a CUDA device: nothing is ever registered.

Triton's clients start every shared-memory example by unregistering all CUDA regions as cleanup, so the
calls answer as a Triton server with no region would:

    status      all: an empty list; one name: not found (SHM_NOT_FOUND: 404 / NOT_FOUND), as for a
                system region that was never registered
    unregister  all or one name: nothing to do, success (Triton: an unknown name is no error)
    register    refused (INVALID_INPUT: 400 / INVALID_ARGUMENT), naming why: this server has no CUDA
                device; system shared memory (``sysshm.py``) is the way to pass tensors by region here

Nothing is held, so no client identity is needed (unlike ``sysshm``).
"""
from __future__ import annotations

from aieng.gateway.sysshm import NOT_FOUND
from aieng.wire import protocol as p

NO_DEVICE = ("this server has no CUDA device (aieng runs ONNX Runtime on the CPU here): CUDA shared memory "
             "cannot be registered; use system shared memory (/v2/systemsharedmemory) instead")


def status(name: str | None) -> list[dict]:
    if name is not None:
        raise p.RequestError(NOT_FOUND, f"Unable to find cuda shared memory region: '{name}'")
    return []


def unregister(name: str | None) -> None:
    """Nothing is registered: there is nothing to release."""


def refused(name: object) -> p.RequestError:
    """Why a register of ``name`` is refused (to raise)."""
    return p.RequestError(p.INVALID_INPUT,
                          f"failed to register CUDA shared memory region '{name}': {NO_DEVICE}")
