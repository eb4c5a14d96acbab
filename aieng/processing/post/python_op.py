"""The ``python`` postprocess op: a team's own class as a chain step (issue 36).

``postprocess: {type: python, entry: "post.py:Post"}`` is a one-step chain of it; ``{op: python, entry}``
is a step beside the built-in ops.  ``entry`` is resolved by ``processing/usercode`` (a file in the version
directory, its module named per version, only with ``AIENG_ALLOW_MODEL_CODE=1``; or an importable module).

The contract:

- ``Post(spec)`` is built once per worker per version, when the chain is built (``spec`` is a
  ``usercode.HookSpec``; ``spec.params`` holds the step's other keys, as written).
- ``post(outputs, inputs)`` is called once per request: ``outputs`` is the chain's state so far, a map of
  numpy arrays (for the first step, the model's outputs for this one request: batch axis and padding
  removed, read-only views into shared memory that stay valid only during the call: copy what you keep);
  ``inputs`` is the request's ``params`` map as the client sent it (the request's own input tensors are
  not carried past preprocessing).  It returns the values it adds, by name (str, numbers, bools, lists,
  numpy arrays and scalars); they join the state, and are the answer unless the chain names ``answer``.
- A ``ValueError`` fails the request INVALID_INPUT with its message; any other exception INTERNAL
  ``"Type: message"``, its traceback logged with the request and trace id (``usercode.mapped``; ``answer``
  logs it).  A return that is not a map
  of names is INTERNAL.
- The step's time limit is its ``timeout_ms``, else the model's ``timeout_ms``, else ``DEFAULT_LIMIT_MS``
  (user code always runs under a limit; ``guard``).  A call stopped at its limit leaves the instance it
  ran in: the next request gets a new ``Post(spec)`` (``abandoned``), so a half-done call's state, or a
  helper thread still running it, is never shared with the next one.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aieng.processing import usercode
from aieng.processing.post.op import GEOMETRY, Op, register

DEFAULT_LIMIT_MS = 10_000.0  # a python step's limit when neither the step nor the model gives one


@register
class PythonStep(Op):
    """Runs ``post(outputs, inputs)`` of the user's class; writes whatever names it returns."""
    NAME = "python"

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        self.inputs, self.outputs = [], []  # it reads the whole state; what it writes is known per call
        self.entry = cfg["entry"]
        self.cls = usercode.load(spec, self.entry)
        self.hook_spec = usercode.hook_spec(spec, {k: v for k, v in cfg.items() if k != "entry"})
        self.instance = self.cls(self.hook_spec)
        self.fresh = False
        self.spec_limit_ms = float(getattr(spec, "timeout_ms", 0) or 0)
        if not callable(getattr(self.instance, "post", None)):
            raise TypeError(f"{cfg['entry']} has no post(outputs, inputs) method")

    def __call__(self, state: dict[str, Any], params: dict, degraded: int = 0) -> dict[str, Any]:
        if self.fresh:  # the last call was stopped at its limit: never reuse what it left half done
            self.instance, self.fresh = self.cls(self.hook_spec), False
        outputs = state if GEOMETRY not in state else {k: v for k, v in state.items() if k != GEOMETRY}
        try:
            values = self.instance.post(outputs, params)
        except Exception as exc:
            raise usercode.mapped(exc, self.entry) from None
        if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
            raise usercode.mapped(TypeError(
                f"post() must return a dict of names to values, got {type(values).__name__}"), self.entry)
        return {k: (plain(v) if isinstance(v, (list, tuple, dict)) else v) for k, v in values.items()}

    def limit_ms(self, given: float) -> float:
        """The step's ``timeout_ms``, else the model's, else ``DEFAULT_LIMIT_MS``: user code is timed."""
        return given or self.spec_limit_ms or DEFAULT_LIMIT_MS

    def abandoned(self) -> None:
        """The guard stopped or abandoned a call at its limit: the next call builds a new instance."""
        self.fresh = True


def plain(value: Any) -> Any:
    """A user value in the answer's form below the top level: numpy scalars and arrays inside lists and
    maps become plain numbers and lists (the top level is ``answer.to_wire``'s)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
