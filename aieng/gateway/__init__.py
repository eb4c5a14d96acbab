"""The Open Inference Protocol (KServe v2 / Triton) front door: the ``gateway`` role (docs/oip.md).

``process`` (the role), ``upstream`` (its ZMQ client of the frontend), ``service`` (one infer, status
mapping), ``codec`` (tensors <-> native inputs), ``models`` (metadata, config, stats), ``http`` (REST
routes, served by ``aieng.httpcore``), ``grpc`` (GRPCInferenceService; stubs in ``proto/``, made by
scripts/gen_oip_stubs.sh).
"""
