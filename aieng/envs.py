"""The one registry of every ``AIENG_*`` environment variable.

Each entry has a type, a default and a one-line meaning.  ``aieng.config`` is
the only reader; children never read the environment themselves, they get the
resolved config object at spawn.  The README's table is generated from this
registry (``python -m aieng.envs --markdown``) and a test keeps them in step.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable


def cpu_count() -> int:
    """CPUs this process may actually run on (cgroup/affinity aware)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class EnvVar:
    name: str
    type: Callable[[str], Any]
    default: Any  # a value or a zero-argument callable computing it
    help: str
    field: str  # the Config field it sets

    @property
    def type_name(self) -> str:
        return "bool" if self.type is boolean else self.type.__name__

    def default_value(self) -> Any:
        return self.default() if callable(self.default) else self.default


def boolean(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _default_preprocess_workers() -> int:
    return max(1, min(4, cpu_count()))


def _default_lanes() -> int:
    return max(1, min(4, cpu_count()))


def _default_state_dir() -> str:
    """systemd's StateDirectory= ($STATE_DIRECTORY), else $XDG_STATE_HOME/aieng, else ~/.local/state/aieng."""
    if os.environ.get("STATE_DIRECTORY"):
        return os.environ["STATE_DIRECTORY"].split(":")[0]
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "aieng")


def _default_postprocess_workers() -> int:
    return max(1, min(2, cpu_count() // 4))


REGISTRY: tuple[EnvVar, ...] = (
    EnvVar("AIENG_FRONTEND_ADDR", str, "tcp://127.0.0.1:5555",
           "ZMQ ROUTER address clients connect to (loopback by default)", "frontend_addr"),
    EnvVar("AIENG_HTTP_ADDR", str, "127.0.0.1:8000",
           "HTTP address for the status page /, /healthz, /readyz, /metrics, /debug (empty: no HTTP server)",
           "http_addr"),
    EnvVar("AIENG_OIP_HTTP_ADDR", str, "127.0.0.1:8080",
           "Open Inference Protocol (KServe v2 / Triton) HTTP/REST address, host:port (empty: off)",
           "oip_http_addr"),
    EnvVar("AIENG_OIP_GRPC_ADDR", str, "127.0.0.1:8081",
           "Open Inference Protocol gRPC (GRPCInferenceService) address, host:port (empty: off)",
           "oip_grpc_addr"),
    EnvVar("AIENG_GATEWAY_WORKERS", int, 1,
           "OIP gateway processes serving both OIP addresses (0, or both addresses empty: none)",
           "gateway_workers"),
    EnvVar("AIENG_OIP_REPOSITORY_CONTROL", boolean, False,
           "OIP repository load/unload (admin ops, through the admin socket) on the client-facing OIP "
           "ports; off: 403 / PERMISSION_DENIED", "oip_repository_control"),
    EnvVar("AIENG_OIP_LOGGING_CONTROL", boolean, False,
           "OIP logging extension changes (POST /v2/logging, gRPC LogSettings with settings: the log level "
           "of every process) on the client-facing OIP ports; reading is always served; off: 403 / "
           "PERMISSION_DENIED", "oip_logging_control"),
    EnvVar("AIENG_CLIENT_ADMIN_OPS", boolean, False,
           "Server-wide ops on the native client socket (a log_level change, a stats reset); off: "
           "PERMISSION_DENIED there, served only on the admin socket", "client_admin_ops"),
    EnvVar("AIENG_OIP_SHARED_MEMORY", str, "local",
           "OIP system shared-memory extension: local (loopback clients only), any (any address of this "
           "host), off; per client (the uid owning its connection); served only with "
           "AIENG_GATEWAY_WORKERS=1 (regions live in one gateway process)", "oip_shared_memory"),
    EnvVar("AIENG_OIP_SHM_MAX_REGIONS", int, 64,
           "Shared-memory regions the gateway holds at most, all clients together", "oip_shm_max_regions"),
    EnvVar("AIENG_OIP_SHM_MAX_BYTES", int, 1 << 30,
           "Bytes of shared-memory regions the gateway holds at most, all clients together",
           "oip_shm_max_bytes"),
    EnvVar("AIENG_OIP_SHM_CLIENT_REGIONS", int, 16,
           "Shared-memory regions one client (a uid, all its addresses) may register",
           "oip_shm_client_regions"),
    EnvVar("AIENG_OIP_SHM_CLIENT_BYTES", int, 256 << 20,
           "Bytes of shared-memory regions one client (a uid, all its addresses) may register",
           "oip_shm_client_bytes"),
    EnvVar("AIENG_OIP_API_KEYS_FILE", str, "",
           "API keys for the OIP doors: a file of PRINCIPAL:KEY[:model,...] lines, re-read when it changes; "
           "set, every OIP request but server live/ready needs Authorization: Bearer KEY (empty: open)",
           "oip_api_keys_file"),
    EnvVar("AIENG_OIP_DOCS", boolean, True,
           "OpenAPI documents (/v2/openapi.json, /v2/models/NAME/openapi.json, /v2/native.json) and Swagger "
           "UI (/v2/docs, /v2/models/NAME/docs) on the OIP HTTP port; off: those paths are unknown (404)",
           "oip_docs"),
    EnvVar("AIENG_MODEL_REPOSITORY", str, "models",
           "Directory holding <model>/<version>/model.yaml + model.onnx", "model_repository"),
    EnvVar("AIENG_MODELS", str, "",
           "Comma-separated model names to serve (empty: every model in the repository)", "models"),
    EnvVar("AIENG_PREPROCESS_WORKERS", int, _default_preprocess_workers,
           "Preprocessing processes (default: the usable CPUs, 1..4)", "preprocess_workers"),
    EnvVar("AIENG_POSTPROCESS_WORKERS", int, _default_postprocess_workers,
           "Postprocessing processes (default: a quarter of the usable CPUs, 1..2)", "postprocess_workers"),
    EnvVar("AIENG_MAX_BATCH_SIZE", int, 0,
           "Overrides every model's max_batch_size when > 0", "max_batch_size"),
    EnvVar("AIENG_MAX_WAIT_MS", float, -1.0,
           "Overrides every model's max_wait_ms when >= 0", "max_wait_ms"),
    EnvVar("AIENG_DEVICE", str, "auto",
           "auto: CUDA when a session created with it really runs on a GPU; cpu: never try CUDA; "
           "cuda: fail unless CUDA runs",
           "device"),
    EnvVar("AIENG_EXECUTOR_LANES", int, _default_lanes,
           "Batches the executor runs at once, each on its own thread "
           "(default: usable CPUs, 1..4; 1 on CUDA)",
           "executor_lanes"),
    EnvVar("AIENG_EXECUTOR_SPARE_LANE", boolean, True,
           "While every lane is busy, let a model whose batches run at most a quarter as long as the running "
           "ones run on one more thread (CPU only), so a rarely asked fast model does not wait out a flooded "
           "model's batch", "executor_spare_lane"),
    EnvVar("AIENG_IDLE_WIDE_RUNS", boolean, True,
           "While the executor is idle, run a lone small batch on a second session using every usable CPU "
           "(lower latency at low load; twice the session memory; not for a graph whose one-row run is under "
           "1 ms)", "idle_wide_runs"),
    EnvVar("AIENG_WARMUP_MAX_ROWS", int, 0,
           "Start-up warm-up batches of at most this many rows (0: each model's max_batch_size). Fewer start "
           "faster (minilm: 32 rows x 128 tokens is most of its start); a bigger batch later grows ONNX "
           "Runtime's arena once, and the batcher learns its cost from real runs", "warmup_max_rows"),
    EnvVar("AIENG_IDLE_WIDE_SPINNING", boolean, True,
           "Let the idle-time wide session's intra-op threads spin while a run is under way (they stop when "
           "it returns); machine-dependent, measured in docs/architecture.md; aieng tune tries both",
           "idle_wide_spinning"),
    EnvVar("AIENG_POOL_LANES", boolean, True,
           "Send the data path's messages between the frontend, the pools and the executor on Unix "
           "sequential-packet sockets beside ZeroMQ (one wake-up a hand-off instead of three; ZeroMQ still "
           "carries what cannot go at once; 0: ZeroMQ only)", "pool_lanes"),
    EnvVar("AIENG_INLINE_POSTPROCESS_US", int, 200,
           "Run a model's postprocessing in the executor, not the pool, when its chain has no time limits "
           "and measures at most this many microseconds (0: always in the pool)", "inline_postprocess_us"),
    EnvVar("AIENG_INLINE_PREPROCESS_BYTES", int, 4096,
           "While nothing is in preprocessing or in the executor (or at any load, where measured cheap "
           "beside the model's run), send a text, tabular or tensor request whose body is at most this many "
           "bytes straight to the executor, which encodes it itself (two hand-offs fewer; only for models "
           "postprocessed in the executor; 0: always through the pool)",
           "inline_preprocess_bytes"),
    EnvVar("AIENG_INLINE_IMAGE_PIXELS", int, 1_000_000,
           "While nothing else is in flight, send an image request whose JPEG header declares at most "
           "this many pixels straight to the executor, which decodes it itself (a hand-off and a process "
           "wake-up fewer; only for models postprocessed in the executor; 0: always through the pool). A PNG "
           "always goes through the pool: only a full inflate finds one whose data runs past its rows",
           "inline_image_pixels"),
    EnvVar("AIENG_INLINE_IMAGE_BUDGET_MS", float, 200.0,
           "An image the executor decoded itself (AIENG_INLINE_IMAGE_PIXELS) for longer than this turns that "
           "route off: images go through the preprocess pool for the rest of the frontend's life "
           "(a 1000x1000 JPEG decodes in about 10 ms)", "inline_image_budget_ms"),
    EnvVar("AIENG_INTRA_OP_THREADS", int, 0,
           "ONNX Runtime intra-op threads per run (0: usable CPUs / AIENG_EXECUTOR_LANES)",
           "intra_op_threads"),
    EnvVar("AIENG_ORT_SPINNING", boolean, False,
           "Let ONNX Runtime's intra-op threads spin between runs (burns cores the workers need)",
           "ort_spinning"),
    EnvVar("AIENG_WORKER_NICE", int, 0,
           "nice increment for preprocess/postprocess workers "
           "(>0 lets the executor's threads win a contended core)",
           "worker_nice"),
    EnvVar("AIENG_WORKER_SCHED_BATCH", boolean, True,
           "Run the pools and the executor's loop thread under Linux's SCHED_BATCH policy: a worker woken by "
           "a message does not preempt the running frontend, which every request passes twice (the threads "
           "that run models keep the default policy; 0: every thread the default policy)",
           "worker_sched_batch"),
    EnvVar("AIENG_EXECUTOR_CPUS", str, "",
           "CPU list for the executor, e.g. '0-1' (empty: no pinning)", "executor_cpus"),
    EnvVar("AIENG_WORKER_CPUS", str, "",
           "CPU list for the frontend and the worker pools, e.g. '1' (empty: no pinning)", "worker_cpus"),
    EnvVar("AIENG_MAX_INFLIGHT", int, 256,
           "Requests in flight before the frontend answers OVERLOADED", "max_inflight"),
    EnvVar("AIENG_MAX_MESSAGE_BYTES", int, 32 * 1024 * 1024,
           "Largest request message accepted (INVALID_REQUEST above it)", "max_message_bytes"),
    EnvVar("AIENG_DEFAULT_TIMEOUT_MS", int, 30000,
           "Deadline for requests that give no timeout_ms and whose model sets none", "default_timeout_ms"),
    EnvVar("AIENG_MAX_TIMEOUT_MS", int, 300000,
           "Largest timeout_ms a request may ask for", "max_timeout_ms"),
    EnvVar("AIENG_BREAKER_FAILURES", int, 5,
           "Consecutive model failures that open a model's circuit breaker (0: no breaker)",
           "breaker_failures"),
    EnvVar("AIENG_BREAKER_COOLDOWN_S", float, 5.0,
           "Seconds an open breaker fails fast before letting a probe through", "breaker_cooldown_s"),
    EnvVar("AIENG_CACHE_BYTES", int, 0,
           "Response cache budget in bytes (LRU by model, version and input hash; 0: off)", "cache_bytes"),
    EnvVar("AIENG_MODEL_MEMORY_BUDGET", int, 0,
           "Bytes the model pool may hold (host RAM; GPU memory when the executor runs CUDA): a lazy model's "
           "load evicts least recently used lazy versions to fit (0: no budget)", "model_memory_budget"),
    EnvVar("AIENG_POOL_WARM_S", float, 30.0,
           "Seconds after a lazy version's last request during which it is not evicted for another's cold "
           "load (that load is refused UNAVAILABLE instead; 0: plain LRU)", "pool_warm_s"),
    EnvVar("AIENG_POOL_REMEASURE_S", float, 60.0,
           "Seconds a version whose measured footprint is above the whole AIENG_MODEL_MEMORY_BUDGET is "
           "refused before a load of it is tried (and measured) again", "pool_remeasure_s"),
    EnvVar("AIENG_LOAD_PRIORITY", str, "idle",
           "CPU priority of a run-time load beside serving (the frontend's hashing, the executor's session "
           "build and warm-up): idle (SCHED_IDLE: spare CPU only; on a saturated server a load takes 2-3 x "
           "longer) or low (nice 10; a millisecond neighbour may see a slow request). Preprocess workers "
           "build at nice 10 either way; a cold load (a request waits) at the processes' own priority",
           "load_priority"),
    EnvVar("AIENG_CURVE_SECRET_KEY_FILE", str, "",
           "ZMQ CURVE: the server's key file (zmq.auth format); set to encrypt the client socket",
           "curve_secret_key_file"),
    EnvVar("AIENG_CURVE_CLIENT_KEYS_DIR", str, "",
           "ZMQ CURVE: directory of allowed client public key files (empty: any client key)",
           "curve_client_keys_dir"),
    EnvVar("AIENG_ADMIN_ADDR", str, "",
           "ZMQ address of the admin socket (aieng rollout/models); empty: ipc://<runtime dir>/admin.sock. "
           "A tcp address must be loopback unless admin CURVE keys are set", "admin_addr"),
    EnvVar("AIENG_ADMIN_CURVE_SECRET_KEY_FILE", str, "",
           "ZMQ CURVE for the admin socket: the server's key file (zmq.auth format)",
           "admin_curve_secret_key_file"),
    EnvVar("AIENG_ADMIN_CURVE_CLIENT_KEYS_DIR", str, "",
           "ZMQ CURVE for the admin socket: directory of allowed admin public keys (empty: any key)",
           "admin_curve_client_keys_dir"),
    EnvVar("AIENG_OIP_TLS_CERT_FILE", str, "",
           "TLS on both OIP doors: the server's PEM certificate chain (with AIENG_OIP_TLS_KEY_FILE; "
           "re-read when it changes)", "oip_tls_cert_file"),
    EnvVar("AIENG_OIP_TLS_KEY_FILE", str, "",
           "TLS on both OIP doors: the PEM private key of AIENG_OIP_TLS_CERT_FILE (unencrypted)",
           "oip_tls_key_file"),
    EnvVar("AIENG_OIP_TLS_CLIENT_CA_FILE", str, "",
           "mutual TLS on both OIP doors: PEM CA bundle; a client without a certificate it signed is "
           "refused at the handshake (needs AIENG_OIP_TLS_CERT_FILE)", "oip_tls_client_ca_file"),
    EnvVar("AIENG_HTTP_TLS", boolean, False,
           "the probe port (AIENG_HTTP_ADDR) over HTTPS with the OIP doors' certificate "
           "(AIENG_OIP_TLS_CERT_FILE and KEY_FILE, rotated alike; no client certificates: a kubelet's HTTPS "
           "probe presents none)",
           "http_tls"),
    EnvVar("AIENG_STATE_DIR", str, _default_state_dir,
           "Directory for routing state that survives restarts (routing-<repo hash>.json); the start "
           "refuses one it cannot write (empty: routing changes are not saved)", "state_dir"),
    EnvVar("AIENG_DRIFT_REFERENCE_N", int, 200,
           "Answered requests a version's drift reference is built from when it has no reference file "
           "(saved in AIENG_STATE_DIR)", "drift_reference_n"),
    EnvVar("AIENG_DRIFT_REFERENCE_CLIENTS", int, 5,
           "Distinct clients (network addresses) a drift reference built from traffic needs; each gives at "
           "most AIENG_DRIFT_REFERENCE_N / this many of its answers", "drift_reference_clients"),
    EnvVar("AIENG_DRIFT_REFERENCE_SPAN_S", float, 600.0,
           "Seconds a drift reference built from traffic spans at least (its answers are taken at most one "
           "per SPAN_S / (N - 1) seconds)", "drift_reference_span_s"),
    EnvVar("AIENG_DRIFT_WINDOW", int, 1000,
           "Recent answers per model version and feature that drift (PSI) is scored on", "drift_window"),
    EnvVar("AIENG_SHM_SLOT_BYTES", int, 1 << 20,
           "Minimum bytes per shared-memory slot (each ring raises it to fit its models' largest request)",
           "shm_slot_bytes"),
    EnvVar("AIENG_SHM_SLOTS", int, 0,
           "Slots per producer ring (0: AIENG_MAX_INFLIGHT)", "shm_slots"),
    EnvVar("AIENG_DRAIN_GRACE_S", float, 10.0,
           "Seconds SIGTERM waits for in-flight requests before answering them UNAVAILABLE", "drain_grace_s"),
    EnvVar("AIENG_STARTUP_TIMEOUT_S", float, 120.0,
           "Seconds to wait for every process to report ready", "startup_timeout_s"),
    EnvVar("AIENG_HANG_TIMEOUT_S", float, 30.0,
           "A worker silent (no heartbeat) this long is killed and restarted as hung", "hang_timeout_s"),
    EnvVar("AIENG_PREPROCESS_BUDGET_MS", float, 5000.0,
           "A preprocess worker silent (no heartbeat) this long while holding a request is replaced: it is "
           "stuck on one request (an image too slow to decode), and only the requests it held fail, "
           "UNAVAILABLE", "preprocess_budget_ms"),
    EnvVar("AIENG_RUNTIME_DIR", str, "",
           "Directory for ipc:// sockets (default: a per-instance dir under the temp dir)", "runtime_dir"),
    EnvVar("AIENG_MAX_INFLIGHT_PER_CLIENT", int, 0,
           "Requests one client (ZMQ identity) may have in flight before OVERLOADED "
           "(0: half of AIENG_MAX_INFLIGHT)",
           "max_inflight_per_client"),
    EnvVar("AIENG_CLIENT_RATE_LIMIT", float, 0.0,
           "Messages per second one client may send, any op, burst of one second (0: no rate limit)",
           "client_rate_limit"),
    EnvVar("AIENG_CLIENT_SEND_QUEUE", int, 1000,
           "Replies queued for one client that does not read them before further replies to it "
           "are dropped and counted",
           "client_send_queue"),
    EnvVar("AIENG_MAX_OPS_PER_S", int, 200,
           "Non-infer ops (health, models, stats) one client may send per second before OVERLOADED",
           "max_ops_per_s"),
    EnvVar("AIENG_HTTP_TOKEN_FILE", str, "",
           "File holding a bearer token that /debug, /metrics and /status.json require (empty: no auth)",
           "http_token_file"),
    EnvVar("AIENG_HTTP_THREADS", int, 4,
           "Ignored (kept so old settings still load): one thread serves the AIENG_HTTP_ADDR port",
           "http_threads"),
    EnvVar("AIENG_HTTP_TIMEOUT_S", float, 5.0,
           "Seconds an HTTP connection may take to send its request head; on AIENG_HTTP_ADDR also how long "
           "it may sit idle", "http_timeout_s"),
    EnvVar("AIENG_SNAPSHOT_MS", int, 500,
           "How often the frontend loop publishes the health/stats snapshot HTTP serves", "snapshot_ms"),
    EnvVar("AIENG_ALLOW_MODEL_CODE", boolean, False,
           "Serve models whose pre- or postprocessing is Python from their own directory (entry: "
           "\"model.py:Class\"): loading such a model runs its code in the pool workers; without it the "
           "start, or a run-time load, fails naming this variable (an importable module is always allowed)",
           "allow_model_code"),
    EnvVar("AIENG_STRICT_MODEL_LOAD", boolean, True,
           "At start, exit non-zero if any model fails to load (false: serve whatever loads, a failed "
           "model UNAVAILABLE saying why; serve --exit-on-error / --no-exit-on-error, as Triton's)",
           "strict_model_load"),
    EnvVar("AIENG_LOG_LEVEL", str, "INFO", "Log level of every process", "log_level"),
    EnvVar("AIENG_LOG_FORMAT", str, "json",
           "json (JSON lines: ts, level, role, pid, trace, msg) or text", "log_format"),
)

BY_NAME = {v.name: v for v in REGISTRY}


def read_environ(environ: dict[str, str] | None = None) -> dict[str, tuple[Any, str]]:
    """Return ``{field: (value, "env:NAME")}`` for each set ``AIENG_*`` variable.

    Raises ``ValueError`` naming the variable when a value does not parse, and
    for unknown ``AIENG_*`` names (a typo must not be silently ignored).
    """
    env = os.environ if environ is None else environ
    out: dict[str, tuple[Any, str]] = {}
    for key, raw in env.items():
        if not key.startswith("AIENG_"):
            continue
        var = BY_NAME.get(key)
        if var is None:
            raise ValueError(f"unknown environment variable {key} (see aieng/envs.py)")
        try:
            value = var.type(raw)
        except ValueError as exc:
            raise ValueError(f"invalid value for {key}: {raw!r} ({exc})") from None
        out[var.field] = (value, f"env:{key}")
    return out


def markdown_table() -> str:
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for v in REGISTRY:
        default = "computed" if callable(v.default) else repr(v.default)
        rows.append(f"| `{v.name}` | {v.type_name} | {default} | {v.help} |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(markdown_table())

BY_FIELD: dict[str, EnvVar] = {v.field: v for v in REGISTRY}
