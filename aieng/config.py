"""One typed configuration object, resolved once in the supervisor.

Precedence: defaults < YAML file < ``AIENG_*`` environment < command-line
flags.  Every child process receives the resolved ``Config`` (as a plain dict)
at spawn and never re-reads the environment or the command line.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import yaml

from aieng import envs

# Fields the supervisor fills in: never read from a file, the environment or a flag, never printed.
INTERNAL = ("instance", "sources", "gateway_curve_key", "cold_versions")


@dataclass
class Config:
    frontend_addr: str = "tcp://127.0.0.1:5555"
    http_addr: str = "127.0.0.1:8000"
    oip_http_addr: str = "127.0.0.1:8080"
    oip_grpc_addr: str = "127.0.0.1:8081"
    gateway_workers: int = 1
    oip_repository_control: bool = False
    model_repository: str = "models"
    models: str = ""
    preprocess_workers: int = 1
    postprocess_workers: int = 1
    max_batch_size: int = 0
    max_wait_ms: float = -1.0
    device: str = "auto"
    executor_lanes: int = 1
    idle_wide_runs: bool = True
    idle_wide_spinning: bool = False
    inline_postprocess_us: int = 200
    inline_preprocess_bytes: int = 4096
    intra_op_threads: int = 0
    ort_spinning: bool = False
    worker_nice: int = 0
    executor_cpus: str = ""
    worker_cpus: str = ""
    max_inflight: int = 256
    max_message_bytes: int = 32 * 1024 * 1024
    default_timeout_ms: int = 30000
    max_timeout_ms: int = 300000
    breaker_failures: int = 5
    breaker_cooldown_s: float = 5.0
    cache_bytes: int = 0
    model_memory_budget: int = 0
    pool_warm_s: float = 30.0
    pool_remeasure_s: float = 60.0
    load_priority: str = "idle"
    curve_secret_key_file: str = ""
    curve_client_keys_dir: str = ""
    admin_addr: str = ""
    admin_curve_secret_key_file: str = ""
    admin_curve_client_keys_dir: str = ""
    state_dir: str = ""
    shm_slot_bytes: int = 1 << 20
    shm_slots: int = 0
    drain_grace_s: float = 10.0
    startup_timeout_s: float = 120.0
    hang_timeout_s: float = 30.0
    runtime_dir: str = ""
    max_inflight_per_client: int = 0
    client_rate_limit: float = 0.0
    client_send_queue: int = 1000
    max_ops_per_s: int = 200
    http_token_file: str = ""
    http_threads: int = 4
    http_timeout_s: float = 5.0
    snapshot_ms: int = 500
    strict_model_load: bool = True
    log_level: str = "INFO"
    log_format: str = "json"
    # Filled in by the supervisor, not by users.
    instance: str = ""
    # z85 CURVE secret key the OIP gateways connect with, made per instance by the supervisor when the
    # client socket uses CURVE; the frontend admits its public key beside AIENG_CURVE_CLIENT_KEYS_DIR's.
    gateway_curve_key: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    # "model:version" of lazy versions not built now (pool.lazy): the frontend serves them by loading
    # them on first use.  The supervisor sets it per spawn (a restarted frontend learns the current set).
    cold_versions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Config":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def validate(self) -> None:
        def need(cond: bool, what: str) -> None:
            if not cond:
                src = self.sources.get(what.split()[0], "default")
                raise ValueError(f"invalid configuration: {what} (from {src})")

        need(self.preprocess_workers >= 1, "preprocess_workers must be >= 1")
        need(self.postprocess_workers >= 1, "postprocess_workers must be >= 1")
        need(self.max_inflight >= 1, "max_inflight must be >= 1")
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
        need(self.max_inflight_per_client >= 0, "max_inflight_per_client must be >= 0")
        need(self.client_rate_limit >= 0, "client_rate_limit must be >= 0")
        need(self.client_send_queue >= 1, "client_send_queue must be >= 1")
        need(self.max_ops_per_s >= 1, "max_ops_per_s must be >= 1")
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
    cfg = Config.from_dict(values)
    cfg.sources = sources
    cfg.validate()
    return cfg
