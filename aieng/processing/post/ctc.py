"""CTC greedy decoding of a text recogniser's output with its character dictionary.

What rapidocr's ``CTCLabelDecode`` (``ch_ppocr_rec/utils.py``) does for one line: the best class per
time step, repeats merged, the blank (index 0) dropped; the score is the mean of the kept steps' best
probabilities (0 when nothing is kept), rounded to 5 places as rapidocr rounds it.  The dictionary is
the model's character list with the blank put first and a space appended, as rapidocr builds it.
"""
from __future__ import annotations

import numpy as np

from aieng.models.onnx_meta import read_metadata
from aieng.processing.post.op import Op, register


def load_characters(cfg: dict, spec) -> list[str]:
    if cfg["characters"]:
        chars = list(cfg["characters"])
    elif cfg["dictionary"]:
        with open(spec.file(cfg["dictionary"]), "rb") as fh:
            chars = [line.decode("utf-8").strip("\n").strip("\r\n") for line in fh.readlines()]
    else:
        chars = read_metadata(spec.onnx_path)[cfg["metadata"]].splitlines()
    return ["blank"] + chars + [" "]


def ctc_greedy(probs: np.ndarray, characters: list[str]) -> tuple[str, float]:
    """One line's ``[T, C]`` probabilities -> (text, mean confidence)."""
    idx, best = probs.argmax(axis=1), probs.max(axis=1)
    keep = np.ones(len(idx), dtype=bool)
    keep[1:] = idx[1:] != idx[:-1]
    keep &= idx != 0
    conf = [round(c, 5) for c in best[keep].tolist()] or [0]
    return "".join(characters[i] for i in idx[keep]), float(np.mean(conf).round(5))


@register
class CTCDecode(Op):
    """Reads ``source`` ``[T, C]`` (one line's per-step class probabilities); writes ``text_output`` (str)
    and ``score_output`` (float).  Characters from ``dictionary`` (a file, one per line), ``characters``
    (inline) or, by default, the ONNX metadata property ``metadata``."""
    NAME = "ctc_decode"

    def __init__(self, cfg: dict, spec):
        super().__init__(cfg, spec)
        self.characters = load_characters(cfg, spec)
        self.inputs, self.outputs = [cfg["source"]], [cfg["text_output"], cfg["score_output"]]

    def __call__(self, state, params, degraded=0):
        probs = np.asarray(state[self.cfg["source"]])
        probs = probs.reshape(probs.shape[-2:])
        if probs.shape[1] > len(self.characters):
            raise ValueError(f"{probs.shape[1]} classes but {len(self.characters)} characters")
        text, score = ctc_greedy(probs, self.characters)
        return {self.cfg["text_output"]: text, self.cfg["score_output"]: score}
