"""Reading the control hub, one way for every role: a message is decoded and handed to the handler of its
type; an undecodable message, one nobody handles, or a handler that raises costs one log line, never the
process (the frontend, every worker, the supervisor and the gateways read the hub through ``dispatch``).
A ``Bundle``'s items are handled one by one, in order, with the same arguments."""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from aieng.wire import messages as m

HEARTBEAT_S = 1.0  # every role's Hello to the hub, this often


def dispatch(data: Any, handlers: Mapping[type, Callable[..., None]], log: logging.Logger, origin: str,
             *args: Any) -> None:
    """Decode ``data`` (bytes or a buffer) and call ``handlers[type(msg)](msg, *args)``."""
    try:
        msg = m.decode(data)
    except Exception as exc:
        log.error("undecodable hub message from %s skipped: %s: %s", origin, type(exc).__name__, exc)
        return
    if type(msg) is m.Bundle:  # several messages sent as one: each handled as if it came alone
        for item in msg.items:
            dispatch(item, handlers, log, origin, *args)
        return
    handler = handlers.get(type(msg))
    if handler is None:
        log.warning("no handler for %s from %s", type(msg).__name__, origin)
        return
    try:
        handler(msg, *args)
    except Exception:  # one bad message must not take the process down
        log.exception("%s handler failed (from %s)", type(msg).__name__, origin)
