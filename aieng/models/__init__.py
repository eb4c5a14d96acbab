"""The model layer: what a model is, read from the model repository, at the ground floor of aieng.

Holds the repository scan and a version's parsed spec (``repo``: ``scan``, ``load_spec``; ``spec``:
``ModelSpec``, frozen and read by attribute, content hashes, per-model isolation in ``build_each``; its
sections as frozen records in ``sections``; values kept as written and the wire form in ``frozen``), the
model-wide ``model.yaml``
settings (``settings``: the versions policy, routing, pool, metadata), pipelines (``pipelines``), golden
sets (``golden``), one model directory served under a name (``view``), ONNX metadata without onnx
(``onnx_meta``), the one reader of every model.yaml (``yaml_file``: bounded, regular files, no aliases),
Triton's ``config.pbtxt`` (``triton_config``: read into Triton's own ``ModelConfig`` message, ``proto``,
and checked field by field; ``triton_spec``: against the graph, as a tensor model's spec),
the registry of the versions served (``served``: every frontend component reads it, one writer changes it),
and the pure schema parsers the scan and the roles share: the ``routing`` section (``routing``: weights,
rules and groups, shadow, auto-rollback; the frontend builds its routing state on them), the ``pool``
section (``settings.parse_setting``), an image model's ``preprocess`` section (``image_config``) and the
``postprocess`` section (``postprocess``: the ops a chain may name, declared with their parameters, and
the chain's check; ``postprocess_schema``: the parameter contract), whose op code is in ``processing/post``.

The contract: this package imports only the standard library, its third-party parsers and the floor below
it (``config``, ``envs``, ``httpcore``), never the roles (``frontend/``, ``preprocess_workers/``,
``gpu_executor/``, ``postprocess_workers/``, ``gateway/``), ``processing/``, ``runtime/``, ``wire/``,
``client/``, ``tools/`` or ``cli/``.  Every layer above reads models through it; tests/unit/test_layers.py
holds the rule.  Importing it loads no OpenCV, no ONNX Runtime and no postprocess ops.
"""
