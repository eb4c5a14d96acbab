"""The tabular demo's rows as tritonclient inputs (``mod``: tritonclient.http or .grpc): ``tabular_inputs``
for the hook tests that compare a hook model with the built-in over OIP (the four numbers as FP32, a missing
one as NaN, which the gateway turns back into missing; island and sex as BYTES, a missing one as empty), and
``http_input``, one row's bill length alone, for the key and sharing tests."""
from __future__ import annotations

import numpy as np

NUMBERS = ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g")


def tabular_inputs(mod, sample: list[dict]) -> list:
    inputs = []
    for name in NUMBERS:
        t = mod.InferInput(name, [len(sample)], "FP32")
        values = [np.nan if r.get(name) is None else r[name] for r in sample]
        t.set_data_from_numpy(np.array(values, np.float32))
        inputs.append(t)
    for name in ("island", "sex"):
        t = mod.InferInput(name, [len(sample)], "BYTES")
        t.set_data_from_numpy(np.array([(r.get(name) or "").encode() for r in sample], dtype=object))
        inputs.append(t)
    return inputs


def http_input(mod, value: float = 45.0):
    t = mod.InferInput("bill_length_mm", [1], "FP32")
    t.set_data_from_numpy(np.array([value], dtype=np.float32))
    return t
