"""One typed configuration object, resolved once in the supervisor.

Precedence: defaults < YAML file < ``AIENG_*`` environment < command-line
flags.  Every child process receives the resolved ``Config`` (as a plain dict)
at spawn and never re-reads ``AIENG_*`` or the command line (the frontend's tracing reads
the standard ``OTEL_*`` variables itself).  A ``Config``
is frozen: what is filled in later (the instance, its runtime dir, the gateways'
secrets, a log level changed at run time) makes a new one (``dataclasses.replace``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import yaml

from aieng import envs

# Fields the supervisor fills in: never read from a file, the environment or a flag, never printed.
INTERNAL = ("instance", "sources", "gateway_curve_key", "gateway_token", "cold_versions", "left_out")


@dataclass(frozen=True)
class LeftOut:
    """A model a start that is not strict (``strict_model_load`` off) left out: its description did not
    load (a malformed config.pbtxt, an unreadable graph, a bad model.yaml); ``error`` says where and why."""
    name: str
    error: str


def _default(name: str, neutral: Any = None) -> Any:
    """A field's default, from its ``envs.REGISTRY`` entry (the one place defaults are written).  Where the
    registry computes it from the machine (worker counts from the CPUs, the state dir from $HOME),
    ``load_config`` does so; a ``Config`` built directly (tests, tools) gets ``neutral`` instead."""
    var = envs.BY_FIELD[name]
    if callable(var.default):
        return neutral
    return var.default


@dataclass(frozen=True)
class Config:
    frontend_addr: str = _default("frontend_addr")
    http_addr: str = _default("http_addr")
    oip_http_addr: str = _default("oip_http_addr")
    oip_grpc_addr: str = _default("oip_grpc_addr")
    gateway_workers: int = _default("gateway_workers")
    oip_repository_control: bool = _default("oip_repository_control")
    oip_logging_control: bool = _default("oip_logging_control")
    client_admin_ops: bool = _default("client_admin_ops")
    oip_shared_memory: str = _default("oip_shared_memory")
    oip_shm_max_regions: int = _default("oip_shm_max_regions")
    oip_shm_max_bytes: int = _default("oip_shm_max_bytes")
    oip_shm_client_regions: int = _default("oip_shm_client_regions")
    oip_shm_client_bytes: int = _default("oip_shm_client_bytes")
    oip_api_keys_file: str = _default("oip_api_keys_file")
    oip_docs: bool = _default("oip_docs")
    model_repository: str = _default("model_repository")
    models: str = _default("models")
    preprocess_workers: int = _default("preprocess_workers", neutral=1)
    postprocess_workers: int = _default("postprocess_workers", neutral=1)
    max_batch_size: int = _default("max_batch_size")
    max_wait_ms: float = _default("max_wait_ms")
    device: str = _default("device")
    executor_lanes: int = _default("executor_lanes", neutral=1)
    executor_spare_lane: bool = _default("executor_spare_lane")
    idle_wide_runs: bool = _default("idle_wide_runs")
    idle_wide_spinning: bool = _default("idle_wide_spinning")
    warmup_max_rows: int = _default("warmup_max_rows")
    inline_postprocess_us: int = _default("inline_postprocess_us")
    pool_lanes: bool = _default("pool_lanes")
    inline_preprocess_bytes: int = _default("inline_preprocess_bytes")
    inline_image_pixels: int = _default("inline_image_pixels")
    inline_image_budget_ms: float = _default("inline_image_budget_ms")
    intra_op_threads: int = _default("intra_op_threads")
    ort_spinning: bool = _default("ort_spinning")
    worker_nice: int = _default("worker_nice")
    worker_sched_batch: bool = _default("worker_sched_batch")
    executor_cpus: str = _default("executor_cpus")
    worker_cpus: str = _default("worker_cpus")
    max_inflight: int = _default("max_inflight")
    max_message_bytes: int = _default("max_message_bytes")
    default_timeout_ms: int = _default("default_timeout_ms")
    max_timeout_ms: int = _default("max_timeout_ms")
    breaker_failures: int = _default("breaker_failures")
    breaker_cooldown_s: float = _default("breaker_cooldown_s")
    cache_bytes: int = _default("cache_bytes")
    model_memory_budget: int = _default("model_memory_budget")
    pool_warm_s: float = _default("pool_warm_s")
    pool_remeasure_s: float = _default("pool_remeasure_s")
    load_priority: str = _default("load_priority")
    curve_secret_key_file: str = _default("curve_secret_key_file")
    curve_client_keys_dir: str = _default("curve_client_keys_dir")
    admin_addr: str = _default("admin_addr")
    admin_curve_secret_key_file: str = _default("admin_curve_secret_key_file")
    admin_curve_client_keys_dir: str = _default("admin_curve_client_keys_dir")
    oip_tls_cert_file: str = _default("oip_tls_cert_file")
    oip_tls_key_file: str = _default("oip_tls_key_file")
    oip_tls_client_ca_file: str = _default("oip_tls_client_ca_file")
    http_tls: bool = _default("http_tls")
    state_dir: str = _default("state_dir", neutral="")
    drift_reference_n: int = _default("drift_reference_n")
    drift_reference_clients: int = _default("drift_reference_clients")
    drift_reference_span_s: float = _default("drift_reference_span_s")
    drift_window: int = _default("drift_window")
    shm_slot_bytes: int = _default("shm_slot_bytes")
    shm_slots: int = _default("shm_slots")
    drain_grace_s: float = _default("drain_grace_s")
    startup_timeout_s: float = _default("startup_timeout_s")
    hang_timeout_s: float = _default("hang_timeout_s")
    preprocess_budget_ms: float = _default("preprocess_budget_ms")
    runtime_dir: str = _default("runtime_dir")
    max_inflight_per_client: int = _default("max_inflight_per_client")
    client_rate_limit: float = _default("client_rate_limit")
    client_send_queue: int = _default("client_send_queue")
    max_ops_per_s: int = _default("max_ops_per_s")
    http_token_file: str = _default("http_token_file")
    http_threads: int = _default("http_threads")
    http_timeout_s: float = _default("http_timeout_s")
    snapshot_ms: int = _default("snapshot_ms")
    strict_model_load: bool = _default("strict_model_load")
    allow_model_code: bool = _default("allow_model_code")
    log_level: str = _default("log_level")
    log_format: str = _default("log_format")
    # Filled in by the supervisor, not by users.
    instance: str = ""
    # z85 CURVE secret key the OIP gateways connect with, made per instance by the supervisor when the
    # client socket uses CURVE; the frontend admits its public key beside AIENG_CURVE_CLIENT_KEYS_DIR's.
    gateway_curve_key: str = ""
    gateway_token: str = ""  # the gateways' proof on the client socket that an OIP peer's address is theirs
    sources: dict[str, str] = field(default_factory=dict)
    # "model:version" of lazy versions not built now (pool.lazy): the frontend serves them by loading
    # them on first use.  The supervisor sets it per spawn (a restarted frontend learns the current set).
    cold_versions: list[str] = field(default_factory=list)
    # The models the start's scan left out (not strict): shown as failed by readiness, the models op and
    # OIP, refused UNAVAILABLE by name.  The supervisor sets it per spawn: those not loaded at run time since.
    left_out: tuple[LeftOut, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Config":
        names = {f.name for f in dataclasses.fields(cls)}
        out = {k: v for k, v in data.items() if k in names}
        if "left_out" in out:  # the records' wire form (``to_dict``: maps) rebuilt once, at the spawn
            out["left_out"] = tuple(x if isinstance(x, LeftOut) else LeftOut(x["name"], x["error"])
                                    for x in out["left_out"])
        return cls(**out)

    def validate(self) -> None:
        def need(cond: bool, what: str) -> None:
            if not cond:
                src = self.sources.get(what.split()[0], "default")
                raise ValueError(f"invalid configuration: {what} (from {src})")

        need(self.preprocess_workers >= 1, "preprocess_workers must be >= 1")
        need(self.postprocess_workers >= 1, "postprocess_workers must be >= 1")
        need(self.max_inflight >= 1, "max_inflight must be >= 1")
        need(self.warmup_max_rows >= 0, "warmup_max_rows must be >= 0")
        need(self.inline_image_pixels >= 0, "inline_image_pixels must be >= 0")
        need(self.inline_image_budget_ms > 0, "inline_image_budget_ms must be > 0")
        need(self.max_message_bytes >= 1024, "max_message_bytes must be >= 1024")
        need(self.default_timeout_ms > 0, "default_timeout_ms must be > 0")
        need(self.max_timeout_ms >= self.default_timeout_ms, "max_timeout_ms must be >= default_timeout_ms")
        need(self.shm_slot_bytes >= 4096, "shm_slot_bytes must be >= 4096")
        need(self.shm_slots >= 0, "shm_slots must be >= 0")
        need(self.model_memory_budget >= 0, "model_memory_budget must be >= 0 (0: no budget)")
        need(0 <= self.pool_warm_s <= 86400, "pool_warm_s must be in 0..86400")
        need(0 <= self.pool_remeasure_s <= 86400, "pool_remeasure_s must be in 0..86400")
        need(self.load_priority in ("idle", "low"), "load_priority must be idle or low")
        need(self.device in ("auto", "cpu", "cuda"), "device must be auto, cpu or cuda")
        need(self.log_format in ("text", "json"), "log_format must be text or json")
        need(self.intra_op_threads >= 0, "intra_op_threads must be >= 0")
        need(1 <= self.executor_lanes <= 64, "executor_lanes must be in 1..64")
        need(self.hang_timeout_s >= 2.0, "hang_timeout_s must be >= 2")
        # a worker heartbeats at most once a second between requests: a shorter budget would cut off a
        # worker that is merely between two heartbeats
        need(self.preprocess_budget_ms >= 1500, "preprocess_budget_ms must be >= 1500")
        need(self.max_inflight_per_client >= 0, "max_inflight_per_client must be >= 0")
        need(self.client_rate_limit >= 0, "client_rate_limit must be >= 0")
        need(self.client_send_queue >= 1, "client_send_queue must be >= 1")
        need(self.max_ops_per_s >= 1, "max_ops_per_s must be >= 1")
        need(self.drift_reference_clients >= 1, "drift_reference_clients must be >= 1")
        need(self.drift_reference_span_s >= 0, "drift_reference_span_s must be >= 0")
        need(self.http_threads >= 1, "http_threads must be >= 1")
        need(self.http_timeout_s > 0, "http_timeout_s must be > 0")
        need(self.snapshot_ms >= 10, "snapshot_ms must be >= 10")
        need(not self.admin_addr.startswith("tcp://") or self.admin_curve_client_keys_dir
             or self.admin_addr.split("://", 1)[1].rsplit(":", 1)[0] in ("127.0.0.1", "localhost", "[::1]"),
             "admin_addr must be ipc:// or loopback tcp unless admin_curve_client_keys_dir is set")
        need(not self.admin_curve_client_keys_dir or bool(self.admin_curve_secret_key_file),
             "admin_curve_client_keys_dir needs admin_curve_secret_key_file")
        # the gateways reach the admin socket with a key of their own, which a keys dir would not admit
        need(not self.oip_repository_control or not self.admin_curve_client_keys_dir,
             "oip_repository_control cannot be used with admin_curve_client_keys_dir (the gateway's "
             "admin key is not in it): use aieng models load|unload")
        need(0 <= self.gateway_workers <= 64, "gateway_workers must be in 0..64")
        need(self.oip_shared_memory in ("local", "any", "off"), "oip_shared_memory must be local, any or off")
        need(min(self.oip_shm_max_regions, self.oip_shm_max_bytes, self.oip_shm_client_regions,
                 self.oip_shm_client_bytes) >= 0, "the oip_shm_* bounds must be >= 0")
        need(not self.oip_tls_cert_file or bool(self.oip_tls_key_file),
             "oip_tls_cert_file needs oip_tls_key_file (AIENG_OIP_TLS_KEY_FILE): set both or neither")
        need(not self.oip_tls_key_file or bool(self.oip_tls_cert_file),
             "oip_tls_key_file needs oip_tls_cert_file (AIENG_OIP_TLS_CERT_FILE): set both or neither")
        need(not self.oip_tls_client_ca_file or bool(self.oip_tls_cert_file),
             "oip_tls_client_ca_file needs oip_tls_cert_file and oip_tls_key_file (mutual TLS is TLS first)")
        need(not self.http_tls or bool(self.oip_tls_cert_file),
             "http_tls needs oip_tls_cert_file and oip_tls_key_file (AIENG_OIP_TLS_CERT_FILE/KEY_FILE): the "
             "probe port serves their certificate")
        for name in ("oip_http_addr", "oip_grpc_addr"):
            host, sep, port = getattr(self, name).rpartition(":")
            ok_port = port.isascii() and port.isdigit() and int(port) < 65536
            need(not getattr(self, name) or (bool(sep and host) and ok_port),
                 f"{name} must be host:port or empty")

    @property
    def gateways(self) -> int:
        """OIP gateway processes to run: none when both OIP addresses are off."""
        return self.gateway_workers if (self.oip_http_addr or self.oip_grpc_addr) else 0

    @property
    def ring_slots(self) -> int:
        return self.shm_slots or self.max_inflight

    @property
    def per_client_inflight(self) -> int:
        return self.max_inflight_per_client or max(1, self.max_inflight // 2)


def _coerce(key: str, value: Any, where: str) -> Any:
    """Check a YAML/flag value against the field's registry type (an int may stand for a float)."""
    var = next((v for v in envs.REGISTRY if v.field == key), None)
    if var is None:
        return value
    want = var.type
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if want is envs.boolean:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: '{key}' must be true or false, got {value!r}")
        return value
    if want in (int, float, str) and (not isinstance(value, want) or isinstance(value, bool)):
        raise ValueError(f"{where}: '{key}' must be a {want.__name__}, got {type(value).__name__} {value!r}")
    return value


def load_config(yaml_path: str | None = None, flags: dict[str, Any] | None = None,
                environ: dict[str, str] | None = None) -> Config:
    """Resolve the effective configuration and remember where each value came from."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for var in envs.REGISTRY:
        values[var.field] = var.default_value()
        sources[var.field] = "default"
    if yaml_path:
        with open(yaml_path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{yaml_path}: top level must be a mapping")
        known = {f.name for f in dataclasses.fields(Config)}
        for key, value in data.items():
            if key not in known or key in INTERNAL:
                raise ValueError(f"{yaml_path}: unknown setting {key!r}")
            values[key] = _coerce(key, value, yaml_path)
            sources[key] = f"file:{yaml_path}"
    for key, (value, src) in envs.read_environ(environ).items():
        values[key] = value
        sources[key] = src
    for key, value in (flags or {}).items():
        if value is not None:
            values[key] = _coerce(key, value, "command line")
            sources[key] = "flag"
    cfg = Config.from_dict({**values, "sources": sources})
    cfg.validate()
    return cfg
