"""The supervisor: starts, watches, restarts and stops every process (docs/architecture.md, "Lifecycle").

Start: claim the instance (``instance.py``), check /dev/shm, scan the models (``versions.py``), spawn
every role and wait on each child's ready pipe and sentinel together: a child that dies or fails during
startup fails the start, naming it.  Then ``READY=1`` to systemd when run under it.  Run: a death becomes
``WorkerDown`` for the frontend, the child's segments are unlinked and it restarts with back-off, never
loading strictly; a silent one is killed as hung.  Reload (SIGHUP): the frontend rescans and re-reads
routing (``Reload``/``Reloaded``).  Stop (SIGTERM/SIGINT, idempotent): the frontend drains, children get
SIGTERM, a deadline, SIGKILL; every segment of this instance is unlinked and the instance released.
"""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import secrets
import signal
import time
from multiprocessing import resource_tracker
from multiprocessing.connection import wait
from typing import Any

import msgpack
import zmq

from aieng.config import Config
from aieng.models import repo as model_repo
from aieng.runtime import procutil
from aieng.runtime.hub import dispatch
from aieng.runtime.instance import ConfigError, Instance, check_tls
from aieng.runtime.procutil import sd_notify
from aieng.runtime.versions import VersionRecord
from aieng.runtime.worker import run_process
from aieng.wire import addresses, shm, shmsize
from aieng.wire import messages as m

log = logging.getLogger("aieng.runtime.supervisor")
BUILDERS = ("preprocess", "executor", "postprocess")  # the roles that build every version they are given

BACKOFF_MAX_S = 30.0
FORK_PRELOAD = ["aieng.runtime.worker"]  # what every role imports; a role's own modules load in the child
PULSE_FRESH_S = 2.0
RELOAD_TIMEOUT_S = 10.0


class StartupError(RuntimeError):
    pass


class Child:
    def __init__(self, role: str, name: str):
        self.role, self.name = role, name
        self.proc: mp.Process | None = None
        self.conn = None
        self.restarts = 0
        self.failures = 0  # consecutive quick deaths, for back-off
        self.started = 0.0
        self.restart_at: float | None = None
        self.ready = False


class Supervisor:
    def __init__(self, cfg: Config):
        # Children fork from a server process that imported the runtime once (``FORK_PRELOAD``), instead
        # of each starting an interpreter and importing it again (measured: docs/architecture.md, Lifecycle).
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(FORK_PRELOAD)
        self.stopping = False
        self.stopped = False
        self.pulse: m.Pulse | None = None
        self.pulse_at = 0.0
        usec = os.environ.get("WATCHDOG_USEC", "")
        self.watchdog_s = int(usec) / 2e6 if usec.isascii() and usec.isdigit() and int(usec) > 0 else None
        self.next_watchdog = 0.0
        check_tls(cfg)  # before anything is claimed: nothing to give back
        self.reload_asked = False  # SIGHUP seen, not yet passed on
        self.reload_deadline: float | None = None  # a reload is under way until the frontend answers
        self.instance = Instance(cfg)
        # the config every child receives: this instance's, and the gateways' secrets when there are any
        cfg = self.cfg = self.with_gateway_secrets(self.instance.claim())
        try:
            shmsize.check(cfg)  # before any ring exists: a too-small /dev/shm would SIGBUS a writer later
            self.instance.check_state_dir()
            self.init_models()
        except BaseException:
            self.instance.release()
            raise
        self.children = [Child(role, name) for role, name in
                         addresses.worker_names(cfg.preprocess_workers, cfg.postprocess_workers)]
        self.children += [Child("gateway", f"gw-{i}") for i in range(cfg.gateways)]  # OIP front door

    @staticmethod
    def with_gateway_secrets(cfg: Config) -> Config:
        secrets_of: dict[str, str] = {}
        if cfg.gateways and cfg.curve_secret_key_file:  # the gateways' own key, admitted by the frontend
            secrets_of["gateway_curve_key"] = zmq.curve_keypair()[1].decode()
        if cfg.gateways:  # a gateway's requests name their OIP peer; this secret says they are a gateway's
            secrets_of["gateway_token"] = secrets.token_hex(16)
        return dataclasses.replace(cfg, **secrets_of) if secrets_of else cfg

    def init_models(self) -> None:
        cfg = self.cfg
        self.versions = VersionRecord.scan(cfg.model_repository, cfg.models, cfg.max_batch_size,
                                           cfg.max_wait_ms, cfg.strict_model_load, cfg.allow_model_code)

    # -- processes ------------------------------------------------------------
    def spawn(self, child: Child) -> None:
        parent_conn, child_conn = self.ctx.Pipe(duplex=True)  # the child reads EOF when we die
        builds = child.role in BUILDERS  # the frontend and gateways know cold versions; builders skip them
        spec_blobs = self.versions.for_child(builds, pipelines=child.role == "frontend")
        cfg = self.cfg.to_dict()
        cfg["cold_versions"] = sorted(self.versions.cold)
        cfg["left_out"] = [dataclasses.asdict(lo) for lo in self.versions.left_out]  # and not loaded since
        if child.restarts:  # a restart while serving is never strict: come back with whatever loads
            cfg["strict_model_load"] = False
        child.proc = self.ctx.Process(target=run_process, name=child.name, daemon=False,
                                      args=(child.role, cfg, spec_blobs, child.name, child_conn))
        # The fork server (started, or started again, by the first ``start``) is in our process group; it
        # must not die of a group-wide SIGTERM or a terminal's SIGHUP meant for us, which would take every
        # child with it: it inherits these signals blocked (``run_process`` unblocks them in the child),
        # and one that comes to us meanwhile waits until the mask is restored.  (The resource tracker first:
        # launching it unblocks SIGTERM in this thread.)
        resource_tracker.ensure_running()
        old = signal.pthread_sigmask(signal.SIG_BLOCK, procutil.FORK_BLOCKED)
        try:
            child.proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        child_conn.close()
        child.conn = parent_conn
        child.started = time.monotonic()
        child.ready = False

    def read_ready(self, child: Child) -> dict:
        try:
            msg = msgpack.unpackb(child.conn.recv_bytes(), raw=False)
        except (EOFError, OSError):
            child.proc.join(5)
            raise StartupError(f"{child.role} {child.name} exited during startup "
                               f"with code {child.proc.exitcode}")
        if not msg.get("ok"):
            child.proc.join(10)
            raise StartupError(f"{child.role} {child.name} failed to start: {msg.get('error')} "
                               f"(exit code {child.proc.exitcode})")
        child.ready = True
        return msg

    def start(self) -> None:
        sd_notify("STATUS=starting")
        for child in self.children:
            self.spawn(child)
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        try:
            pending = {c.conn: c for c in self.children}
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    waiting_for = ", ".join(c.name for c in pending.values())
                    raise StartupError("startup timed out waiting for " + waiting_for)
                sentinels = {c.proc.sentinel: c for c in pending.values()}
                for obj in wait(list(pending) + list(sentinels), timeout=min(left, 0.5)):
                    child = pending.get(obj) or sentinels.get(obj)
                    if child is None or child.conn not in pending:
                        continue
                    if obj is child.conn or child.conn.poll():
                        self.read_ready(child)
                        del pending[child.conn]
                    else:  # its sentinel fired with nothing on the pipe: it died
                        child.proc.join(5)
                        raise StartupError(f"{child.role} {child.name} exited during startup "
                                           f"with code {child.proc.exitcode}")
                if self.stopping:
                    raise StartupError("interrupted during startup")
        except BaseException:
            self.shutdown()
            raise
        self.init_hub()
        self.publish_state()
        sd_notify("READY=1\nSTATUS=serving " + ", ".join(self.versions.specs))
        log.info("ready: %s on %s (%d preprocess, %d postprocess workers)", ", ".join(self.versions.specs),
                 self.cfg.frontend_addr, self.cfg.preprocess_workers, self.cfg.postprocess_workers)

    def init_hub(self) -> None:
        self.hub_handlers = {m.Pulse: self.on_pulse, m.Reloaded: self.on_reloaded,
                             m.LogLevel: self.on_log_level,
                             m.LoadVersion: self.versions.on_load,  # restarted workers come up with it
                             m.UnloadVersion: self.versions.on_unload}
        self.zctx = zmq.Context.instance()
        self.hub = procutil.hub_socket(self.zctx, addresses.hub_addr(self.cfg.runtime_dir), "supervisor")
        self.hub_fd = self.hub.getsockopt(zmq.FD)  # edge-triggered: always drain after a wake-up

    def read_hub(self) -> None:
        while True:
            try:
                data = self.hub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            dispatch(data, self.hub_handlers, log, "the frontend")

    def on_pulse(self, msg: m.Pulse) -> None:
        self.pulse, self.pulse_at = msg, time.monotonic()

    def on_reloaded(self, msg: m.Reloaded) -> None:
        (log.info if msg.ok else log.error)("reload: %s", msg.message)
        self.reload_deadline = None
        sd_notify("READY=1\nSTATUS=" + msg.message)

    def on_log_level(self, msg: m.LogLevel) -> None:
        procutil.set_level(msg.level)
        self.cfg = dataclasses.replace(self.cfg, log_level=msg.level)  # restarted children start at it

    def watchdog(self, now: float) -> None:
        """WATCHDOG=1 only while the frontend reports a healthy pipeline, recently."""
        if self.watchdog_s is None or now < self.next_watchdog:
            return
        if self.pulse is not None and self.pulse.healthy and now - self.pulse_at < PULSE_FRESH_S:
            sd_notify("WATCHDOG=1")
            self.next_watchdog = now + self.watchdog_s

    def check_hung(self, now: float) -> None:
        """A worker alive to the OS but silent to the frontend for too long is hung, and one the frontend
        names stuck (``Pulse.stuck``) has held a request past its budget: kill it; the usual death handling
        answers its requests and restarts it."""
        if self.pulse is None or now - self.pulse_at > PULSE_FRESH_S:
            return
        for c in self.children:
            silent = self.pulse.silent.get(c.name)
            if (silent is not None and silent > self.cfg.hang_timeout_s and c.ready and c.proc is not None
                    and c.proc.is_alive() and now - c.started > self.cfg.hang_timeout_s):
                log.error("%s has sent no heartbeat for %.1fs: hung, killing it", c.name, silent)
                sd_notify(f"STATUS={c.name} hung; restarting")
                c.proc.kill()
            elif (c.name in self.pulse.stuck and c.ready and c.proc is not None and c.proc.is_alive()
                  and now - c.started > self.cfg.preprocess_budget_ms / 1000):  # not its replacement
                log.error("%s has worked on one request for over AIENG_PREPROCESS_BUDGET_MS (%.0f ms): "
                          "stuck, replacing it", c.name, self.cfg.preprocess_budget_ms)
                sd_notify(f"STATUS={c.name} stuck on a request; restarting")
                c.proc.kill()

    def publish_state(self) -> None:
        procs = {c.name: m.ProcessState(c.role, c.proc.pid if c.proc else None,
                                        bool(c.proc and c.proc.is_alive()), c.restarts)
                 for c in self.children}
        restarts = {}
        for c in self.children:
            restarts[c.role] = restarts.get(c.role, 0) + c.restarts
        ready = all(c.ready and c.proc and c.proc.is_alive() for c in self.children)
        self.hub.send(m.encode(m.ServiceState(ready, procs, restarts)))

    # -- watching -------------------------------------------------------------
    def serve_forever(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_hup)
        next_state = 0.0
        while not self.stopping:
            objs = [c.proc.sentinel for c in self.children if c.proc is not None and c.restart_at is None]
            objs += [c.conn for c in self.children
                     if c.proc is not None and not c.ready and c.restart_at is None]
            for obj in wait(objs + [self.hub_fd], timeout=0.25):
                if obj is self.hub_fd:
                    self.read_hub()
                else:
                    self.on_event(obj)
            self.read_hub()
            now = time.monotonic()
            self.watchdog(now)
            self.check_hung(now)
            self.check_reload(now)
            for c in self.children:
                if c.restart_at is not None and now >= c.restart_at and not self.stopping:
                    c.restart_at = None
                    log.info("restarting %s (restart %d)", c.name, c.restarts)
                    self.spawn(c)
            if now >= next_state:  # periodic: the frontend may itself have restarted
                self.publish_state()
                next_state = now + 1.0
        self.shutdown()

    def on_event(self, obj: Any) -> None:
        for c in self.children:
            if c.proc is None:
                continue
            if obj is c.conn and not c.ready:
                try:
                    self.read_ready(c)
                    log.info("%s is ready again (pid %d)", c.name, c.proc.pid)
                    self.publish_state()
                except StartupError as exc:
                    log.error("%s", exc)
                return
            if obj == c.proc.sentinel:
                self.on_death(c)
                return

    def on_death(self, c: Child) -> None:
        c.proc.join(1)
        code, pid = c.proc.exitcode, c.proc.pid
        lived = time.monotonic() - c.started
        c.failures = c.failures + 1 if lived < 10 else 1
        delay = min(BACKOFF_MAX_S, 0.1 * (2 ** (c.failures - 1)))
        log.error("%s (pid %s) died with code %s after %.1fs; restart in %.1fs",
                  c.name, pid, code, lived, delay)
        shm.unlink_prefix(f"{shm.PREFIX}{self.cfg.instance}.{c.name}.")
        if c.role in BUILDERS:
            self.versions.drop_pending(c.name, code)
        if c.conn is not None:
            c.conn.close()
        c.ready = False
        c.restarts += 1  # counted when scheduled, so health shows it before the new one says hello
        c.restart_at = time.monotonic() + delay
        try:
            self.hub.send(m.encode(m.WorkerDown(c.name, code if code is not None else -1, pid or 0)))
        except zmq.ZMQError:
            pass
        self.publish_state()
        sd_notify(f"STATUS={c.name} died (code {code}); restarting")

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def _on_hup(self, signum: int, frame: Any) -> None:
        self.reload_asked = True

    def check_reload(self, now: float) -> None:
        if self.reload_asked and self.reload_deadline is None:
            self.reload_asked = False
            log.info("SIGHUP: reloading routing")
            sd_notify(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"
                      f"\nSTATUS=reloading")
            self.hub.send(m.encode(m.Reload()))
            self.reload_deadline = now + RELOAD_TIMEOUT_S
        elif self.reload_deadline is not None and now > self.reload_deadline:
            log.error("reload: the frontend did not answer within %.0fs", RELOAD_TIMEOUT_S)
            self.reload_deadline = None
            sd_notify("READY=1\nSTATUS=reload not confirmed by the frontend")

    # -- stopping ---------------------------------------------------------------
    def drain(self) -> None:
        fe = next((c for c in self.children if c.role == "frontend"), None)
        if fe is None or fe.proc is None or not fe.proc.is_alive() or not hasattr(self, "hub"):
            return
        self.hub.send(m.encode(m.Drain(self.cfg.drain_grace_s)))
        deadline = time.monotonic() + self.cfg.drain_grace_s + 2
        while time.monotonic() < deadline:  # skip pulses until the frontend says it drained
            if not self.hub.poll(int(max(0.0, deadline - time.monotonic()) * 1000)):
                return
            if isinstance(m.decode(self.hub.recv()), m.Drained):
                return

    def shutdown(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        sd_notify("STOPPING=1")
        try:
            self.drain()
        except zmq.ZMQError as exc:
            log.warning("drain failed: %s", exc)
        procs = [c.proc for c in self.children if c.proc is not None and c.proc.is_alive()]
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + 5.0
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                log.warning("%s did not stop in time: SIGKILL", proc.name)
                proc.kill()
                proc.join(2)
        if hasattr(self, "hub"):
            self.hub.close(0)
        gone = shm.unlink_prefix(f"{shm.PREFIX}{self.cfg.instance}.")
        self.instance.release()
        log.info("stopped; unlinked %d shared-memory segments", len(gone))

def serve(cfg: Config) -> int:
    procutil.set_title("aieng::supervisor")
    try:
        sup = Supervisor(cfg)
    except (ConfigError, shmsize.ShmTooSmall) as exc:
        log.error("%s", exc)
        return 2
    except (addresses.RuntimeDirInUse, model_repo.ModelError) as exc:
        log.error("startup failed: %s", exc)
        return 1
    signal.signal(signal.SIGTERM, sup._on_signal)
    signal.signal(signal.SIGINT, sup._on_signal)
    signal.signal(signal.SIGHUP, sup._on_hup)  # during startup: kept for after it
    try:
        sup.start()
    except StartupError as exc:
        log.error("startup failed: %s", exc)
        return 1
    try:
        sup.serve_forever()
    finally:
        sup.shutdown()
    return 0
