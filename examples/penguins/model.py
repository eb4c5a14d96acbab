"""The penguins example's own pre- and postprocessing (aieng calls these; docs/models.md "Your own Python").

``Pre`` turns one request's measurements into the ONNX graph's ``features`` row: each number filled when
missing, clipped to its training range and standardised, each category one-hot with a last bucket for a
value it never saw; the statistics are the ones saved at training time (preprocess.json).  ``Post`` maps
the graph's class probabilities to a species name (labels.json).  Each is built once per worker and called
with ONE request: the server stacks the rows into batches, runs the model, and splits the outputs again.
A ValueError answers the request INVALID_INPUT with its message.
"""
import json
import math
import os

import numpy as np


class Pre:
    def __init__(self, spec):
        # spec.dir: this version's directory; spec.params: the other keys of `preprocess:` in model.yaml
        with open(os.path.join(spec.dir, spec.params["state"]), encoding="utf-8") as fh:
            state = json.load(fh)
        self.numeric = state["numeric"]
        self.categorical = [(c["name"], {v: i for i, v in enumerate(c["categories"])})
                            for c in state["categorical"]]
        self.width = len(self.numeric) + sum(len(index) + 1 for _, index in self.categorical)

    def pre(self, inputs):
        """One request's inputs -> {"features": float32 vector}, without the batch axis."""
        vec = np.zeros(self.width, dtype=np.float32)
        for i, f in enumerate(self.numeric):
            v = inputs.get(f["name"])
            if v is None or (isinstance(v, float) and math.isnan(v)):  # missing (OIP sends NaN)
                v = f["fill"]
            lo, hi = f["clip"]
            vec[i] = (min(max(float(v), lo), hi) - f["mean"]) / f["std"]
        pos = len(self.numeric)
        for name, index in self.categorical:
            vec[pos + index.get(inputs.get(name), len(index))] = 1.0
            pos += len(index) + 1
        return {"features": vec}


class Post:
    def __init__(self, spec):
        with open(os.path.join(spec.dir, spec.params["labels"]), encoding="utf-8") as fh:
            self.labels = json.load(fh)

    def post(self, outputs, inputs):
        """One request's rows of the model's outputs -> the answer's values by name."""
        scores = np.asarray(outputs["probabilities"], dtype=np.float32).reshape(-1)
        return {"label": self.labels[int(np.argmax(scores))], "probabilities": scores}
