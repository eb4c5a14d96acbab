"""One model version's whole pipeline in this process, for the tools that measure against the server: the
model's preprocessor, ONNX Runtime sessions (one per thread count and spinning setting, warmed once) and
its postprocess chain.  The in-process limit (``bench/limit.py``) and the plain baseline server
(``baseline.py``) both run requests through it, so they compute exactly what the server computes."""
from __future__ import annotations

from typing import Any

from aieng.models.repo import ModelSpec, latest, scan


def load_spec(model: str, repo: str) -> ModelSpec:
    """The latest version of ``model`` in ``repo``."""
    versions = scan(repo, [model])[model]
    return versions[latest(versions)]


class InProcessModel:
    def __init__(self, spec: ModelSpec):
        from aieng.processing.post.chain import Chain
        from aieng.processing.pre.processors import PROCESSORS

        self.spec = spec
        self.pre = PROCESSORS[spec.preprocess.type](spec)
        self.post = Chain(spec)
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

    def answer(self, sess: Any, encoded: list, params: dict | None = None) -> list[dict]:
        """Run ``encoded`` requests as one batch on ``sess`` and postprocess each row (one run each on a
        session that does not batch)."""
        if not getattr(sess, "batched", True) and len(encoded) > 1:
            return [answer for e in encoded for answer in self.answer(sess, [e], params)]
        feeds, sizes = sess.feeds_from([dict(e[0]) for e in encoded])
        outs = sess.run(feeds)
        return [self.post(dict(sess.request_outputs(outs, row, sizes[row])), params or {})
                for row in range(len(encoded))]
