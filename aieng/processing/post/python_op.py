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
  ``inputs`` is the request's inputs as the wire decodes them for preprocessing (str, bytes, numbers,
  lists, numpy arrays), a read-only mapping decoded on first use (``RequestInputs``): the request frame
  travels with the request for such a version only (``InferTask.request``/``PostTask.request``).  A
  ``post`` that takes a third argument also gets the request's ``params`` as sent.  It returns the values
  it adds, by name (str, numbers, bools, lists, numpy arrays and scalars); they join the state, and are
  the answer unless the chain names ``answer``.
- A ``ValueError`` fails the request INVALID_INPUT with its message; any other exception INTERNAL
  ``"Type: message"``, its traceback logged with the request and trace id (``usercode.mapped``; ``answer``
  logs it).  A return that is not a map of names is INTERNAL.
- The step's time limit is its ``timeout_ms``, else the model's ``timeout_ms``, else ``DEFAULT_LIMIT_MS``
  (user code always runs under a limit; ``guard``).  A call stopped at its limit leaves the instance it
  ran in: the next request gets a new ``Post(spec)`` (``abandoned``), so a half-done call's state, or a
  helper thread still running it, is never shared with the next one.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np

from aieng.processing import usercode
from aieng.processing.post.op import GEOMETRY, Op, register
from aieng.processing.pre.request import read_request, with_arrays

DEFAULT_LIMIT_MS = 10_000.0  # a python step's limit when neither the step nor the model gives one


@register
class PythonStep(Op):
    """Runs ``post(outputs, inputs)`` of the user's class; writes whatever names it returns."""
    NAME = "python"
    TAKES_REQUEST = True

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        # it reads the whole state; what it writes is known per call, or declared (``writes``) for the chain
        # to skip a later step that reads a value this step, skipped, did not write
        self.inputs, self.outputs = [], list(cfg.get("writes") or ())
        self.entry = cfg["entry"]
        self.cls = usercode.load(spec, self.entry)
        own = {k: v for k, v in cfg.items() if k not in ("entry", "writes")}  # the user code's settings
        self.hook_spec = usercode.hook_spec(spec, own)
        self.instance = self.cls(self.hook_spec)
        self.spec, self.fresh = spec, False
        self.spec_limit_ms = float(getattr(spec, "timeout_ms", 0) or 0)
        post = getattr(self.instance, "post", None)
        if not callable(post):
            raise TypeError(f"{cfg['entry']} has no post(outputs, inputs) method")
        self.with_params = takes_three(post)

    def __call__(self, state: dict[str, Any], params: dict, degraded: int = 0,
                 request: bytes | None = None) -> dict[str, Any]:
        if self.fresh:  # the last call was stopped at its limit: never reuse what it left half done
            self.instance, self.fresh = self.cls(self.hook_spec), False
        outputs = state if GEOMETRY not in state else {k: v for k, v in state.items() if k != GEOMETRY}
        inputs = RequestInputs(self.spec, request) if request is not None else {}
        try:
            if self.with_params:
                values = self.instance.post(outputs, inputs, params)
            else:
                values = self.instance.post(outputs, inputs)
        except Exception as exc:
            raise usercode.mapped(exc, self.entry) from None
        if not isinstance(values, dict):
            raise self.not_names(values)
        nested = False  # one pass over what it returned: the names checked, nested values looked for
        for k, v in values.items():
            if not isinstance(k, str):
                raise self.not_names(values)
            nested = nested or isinstance(v, (list, tuple, dict))
        if not nested:
            return values
        return {k: plain(v) if isinstance(v, (list, tuple, dict)) else v for k, v in values.items()}

    def not_names(self, values: Any) -> Exception:
        return usercode.mapped(TypeError(
            f"post() must return a dict of names to values, got {type(values).__name__}"), self.entry)

    def limit_ms(self, given: float) -> float:
        """The step's ``timeout_ms``, else the model's, else ``DEFAULT_LIMIT_MS``: user code is timed."""
        return given or self.spec_limit_ms or DEFAULT_LIMIT_MS

    def abandoned(self) -> None:
        """The guard stopped or abandoned a call at its limit: the next call builds a new instance."""
        self.fresh = True


class RequestInputs(Mapping):
    """The request's inputs as ``post`` reads them: read-only, decoded from the frame on first use (the
    frame passed the frontend's and the preprocess worker's checks: read here as it was there, a declared
    tensor input as its numpy array), so a ``post`` that never reads them never pays for them."""
    __slots__ = ("spec", "frame", "_inputs")

    def __init__(self, spec, frame: bytes):
        self.spec, self.frame, self._inputs = spec, frame, None

    @property
    def inputs(self) -> dict[str, Any]:
        if self._inputs is None:
            tensors = tuple(i.name for i in self.spec.inputs if i.kind == "tensor")
            self._inputs = with_arrays(tensors, read_request(self.spec, self.frame, len(self.frame))[0])
        return self._inputs

    def __getitem__(self, name: str) -> Any:
        return self.inputs[name]

    def __iter__(self):
        return iter(self.inputs)

    def __len__(self) -> int:
        return len(self.inputs)

    def __repr__(self) -> str:
        return f"RequestInputs({self.inputs!r})"


def takes_three(fn) -> bool:
    """Whether ``post`` takes the request's params as a third argument: ``post(outputs, inputs, params)``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    kinds = [p.kind for p in sig.parameters.values()]
    plain_kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [k for k in kinds if k in plain_kinds]
    return len(positional) >= 3 or inspect.Parameter.VAR_POSITIONAL in kinds


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
