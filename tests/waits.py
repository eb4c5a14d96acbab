"""A bounded wait for a state, shared by the tests (never a fixed sleep): ``until`` for plain code,
``until_async`` inside a running event loop (where a blocking sleep would stop what is awaited)."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable


def until(cond: Callable[[], Any], timeout_s: float, step_s: float = 0.05) -> Any:
    """``cond()`` again every ``step_s`` until it returns something truthy or ``timeout_s`` passes; returns
    its last value, so the caller asserts on it (and shows it when it failed)."""
    deadline = time.monotonic() + timeout_s
    value = cond()
    while not value and time.monotonic() < deadline:
        time.sleep(step_s)
        value = cond()
    return value


async def until_async(cond: Callable[[], Any], timeout_s: float, step_s: float = 0.01) -> Any:
    """``until`` for a coroutine: the loop runs between the checks; returns ``cond()``'s last value."""
    deadline = time.monotonic() + timeout_s
    value = cond()
    while not value and time.monotonic() < deadline:
        await asyncio.sleep(step_s)
        value = cond()
    return value
