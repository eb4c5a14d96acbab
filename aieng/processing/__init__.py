"""The processing library: the code two roles run, below both.

``pre``: a model's preprocessing, run by the preprocess pool and by the executor's inline route
(``gpu_executor/inline_pre``): the processors by ``preprocess.type`` (``processors.PROCESSORS``, ``spread``)
and reading a client's request frame (``request.read_request``).  ``post``: a model's postprocessing, run by
the postprocess pool and by the executor's inline route (``gpu_executor/inline_post``): the chain, its ops
(registered against their declarations in ``models/postprocess``) and the answer it makes (``answer``).

The contract: it imports the model layer, the wire and ``inputs`` (and what lies below them), never
``runtime/``, ``client/``, the roles, ``tools/`` or ``cli/`` (tests/unit/test_layers.py).  It holds no
process, socket or loop: the role packages keep their process loops and call it.
"""
