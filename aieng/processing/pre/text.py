"""Text -> token tensors with the model directory's own ``tokenizer.json``.

Truncates at ``max_length`` (a setting of the model directory) and does not
pad: each request's tensors are exactly its own length, and the executor pads
a batch to its longest member.  Several waiting requests are encoded in one
``encode_batch`` call.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Tokenizer

from aieng.models.repo import ModelSpec
from aieng.processing.pre.features import text_features
from aieng.wire.protocol import INVALID_INPUT, RequestError


class TextPreprocessor:
    batchable = True

    def __init__(self, spec: ModelSpec):
        cfg = spec.preprocess
        self.input = cfg.input
        self.max_length = int(cfg.max_length)
        self.max_chars = int(cfg.max_chars)
        self.ids_name, self.mask_name, self.type_name = cfg.ids, cfg.mask, cfg.type_ids
        n_tensors = 1 + bool(self.mask_name) + bool(self.type_name)
        self.max_request_bytes = n_tensors * (self.max_length * 8 + 64)
        self.tok = Tokenizer.from_file(spec.file(cfg.tokenizer))
        self.tok.no_padding()
        self.tok.enable_truncation(max_length=self.max_length)
        unk = getattr(self.tok.model, "unk_token", None)
        self.unk_id = self.tok.token_to_id(unk) if unk else None  # drift's out-of-vocabulary share

    def check(self, inputs: dict[str, Any]) -> str:
        text = inputs.get(self.input)
        if not isinstance(text, str):
            raise RequestError(INVALID_INPUT, f"input '{self.input}' must be a string")
        if not text.strip():
            raise RequestError(INVALID_INPUT, f"input '{self.input}' is empty")
        if len(text) > self.max_chars:
            raise RequestError(INVALID_INPUT,
                               f"input '{self.input}' is longer than {self.max_chars} characters")
        return text

    def process_many(self, texts: list[str]) -> list[tuple[list[tuple[str, np.ndarray]], int, dict]]:
        out = []
        for enc in self.tok.encode_batch(texts, add_special_tokens=True):
            ids = np.asarray(enc.ids, dtype=np.int64)
            tensors = [(self.ids_name, ids)]
            if self.mask_name:
                tensors.append((self.mask_name, np.asarray(enc.attention_mask, dtype=np.int64)))
            if self.type_name:
                tensors.append((self.type_name, np.asarray(enc.type_ids, dtype=np.int64)))
            out.append((tensors, int(ids.shape[0]), text_features(enc, self.unk_id)))
        return out

    def process(self, inputs: dict[str, Any]):
        return self.process_many([self.check(inputs)])[0]

    def sample(self, nbytes: int) -> dict[str, Any]:
        """An input of about ``nbytes`` of English-like words: the costliest request of that size (the
        tokenizer reads the whole text before truncating), for measuring what preprocessing costs."""
        words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing "
        return {self.input: (words * (nbytes // len(words) + 1))[:max(1, nbytes)]}
