"""One model version's whole pipeline in this process, for the tools that measure against the server: the
model's preprocessor, ONNX Runtime sessions (one per thread count and spinning setting, warmed once) and
its postprocess chain (a ``python`` preprocess or chain step loads the user's code here, through the
same ``usercode`` loader the pool workers use).  The in-process limit (``bench/limit.py``), the plain
baseline server (``baseline.py``) and ``aieng models try`` run requests through it, so they compute
exactly what the server computes."""
from __future__ import annotations

from typing import Any

from aieng.models.repo import ModelSpec, latest, scan


def allow_code() -> bool:
    """The operator's AIENG_ALLOW_MODEL_CODE, read as the server reads it (``load_config``), so a tool
    loads a model with a file entry (``entry: "model.py:Pre"``) exactly when the server would."""
    from aieng.config import load_config

    return load_config().allow_model_code


def load_spec(model: str, repo: str) -> ModelSpec:
    """The latest version of ``model`` in ``repo`` (a hook model's file entry as ``allow_code`` says)."""
    versions = scan(repo, [model], allow_code=allow_code())[model]
    return versions[latest(versions)]


class InProcessModel:
    def __init__(self, spec: ModelSpec):
        from aieng.processing.post.chain import Chain
        from aieng.processing.pre.processors import PROCESSORS

        self.spec = spec
        self.pre = PROCESSORS[spec.preprocess.type](spec)
        self.post = Chain(spec)
        self.takes_request = any(op.TAKES_REQUEST for _, op in self.post.steps)
        self.sessions: dict[tuple[int, bool], Any] = {}

    def session(self, threads: int, spinning: bool) -> Any:
        """A warmed session with ``threads`` intra-op threads, ONNX Runtime's spinning as given."""
        from aieng.gpu_executor.sessions import ModelSession

        key = (threads, spinning)
        if key not in self.sessions:
            sess = ModelSession(self.spec, "auto", threads, spinning, stop_spinning=False)
            sess.warmup()
            self.sessions[key] = sess
        return self.sessions[key]

    def encode(self, items: list[dict]) -> list:
        """Preprocess requests' inputs: ``(tensors, seq_len, info)`` each, batched where the processor can.
        A tensor model's arrays go as a client sends them (tensor maps, which its processor decodes)."""
        if self.spec.preprocess.type == "tensor":
            from aieng.wire.protocol import encode_tensor

            items = [{k: encode_tensor(v) if hasattr(v, "dtype") else v for k, v in i.items()} for i in items]
        if getattr(self.pre, "batchable", False):
            return self.pre.process_many([self.pre.check(i) for i in items])
        return [self.pre.process(i) for i in items]

    def answer(self, sess: Any, encoded: list, params: dict | None = None,
               inputs: list[dict] | None = None) -> list[dict]:
        """Run ``encoded`` requests as one batch on ``sess`` and postprocess each row (one run each on a
        session that does not batch).  ``inputs``: the requests' inputs as sent, for a chain with a
        ``python`` step (its ``post(outputs, inputs)``): each goes as the request frame the pool's step
        reads, so the step decodes it as it does in the server."""
        if not getattr(sess, "batched", True) and len(encoded) > 1:
            return [answer for i, e in enumerate(encoded)
                    for answer in self.answer(sess, [e], params, None if inputs is None else [inputs[i]])]
        feeds, sizes = sess.feeds_from([dict(e[0]) for e in encoded])
        outs = sess.run(feeds)
        frames = [None] * len(encoded)
        if self.takes_request and inputs is not None:
            from aieng.wire.protocol import pack

            frames = [pack({"inputs": i}) for i in inputs]
        return [self.post.run(dict(sess.request_outputs(outs, row, sizes[row])), params or {},
                              request=frames[row]).values
                for row in range(len(encoded))]
