"""What one server instance claims on this machine before it starts anything, and gives back on every exit.

``Instance.claim``: clean what crashed instances left (shared memory, runtime dirs), create and lock the
runtime directory (one instance per directory; a link, another user's or a world-writable one is refused).
``check_state_dir``, its own step after the claim: the routing state directory can be written.
``check_tls``, before anything is claimed: the OIP doors' TLS files load (each gateway loads them again).
A setting that cannot be used is a ``ConfigError`` naming the variable (exit 2).  ``release``: remove
what is ours in the runtime dir (all of a default one; only our sockets in a configured one), then drop
the lock.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil

import psutil

from aieng import envs
from aieng.config import Config
from aieng.httpcore.tls import TlsError, TlsFiles, load
from aieng.runtime.statedir import state_dir_problem
from aieng.wire import addresses, shm

log = logging.getLogger("aieng.runtime.supervisor")


class ConfigError(ValueError):
    """A setting that cannot be used as given; the message names the variable."""


def check_tls(cfg: Config) -> None:
    """With AIENG_OIP_TLS_* set and an OIP door on, the files make a server context; else one ConfigError
    naming the variable of the first that cannot serve (missing, unreadable, not PEM, a mismatched key)."""
    if not cfg.oip_tls_cert_file or not cfg.gateways:
        return
    files = TlsFiles(cfg.oip_tls_cert_file, cfg.oip_tls_key_file, cfg.oip_tls_client_ca_file)
    try:
        load(files)
    except TlsError as exc:
        name = f"oip_tls_{exc.field}_file"
        raise ConfigError(f"invalid configuration: {envs.BY_FIELD[name].name} {getattr(cfg, name)!r} {exc} "
                          f"(from {cfg.sources.get(name, 'default')})") from None


def _instance_alive(pid: int) -> bool:
    """Whether the instance whose supervisor had ``pid`` still runs.  Asked before this instance has
    made anything, so our own pid means a previous incarnation with the same pid: in a container the
    supervisor is PID 1 every time, and a restarted container keeps the pod's /dev/shm."""
    if pid == os.getpid():
        return False
    try:
        return "aieng" in " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


class Instance:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.lock: addresses.RuntimeDirLock | None = None
        self.own_runtime_dir = not cfg.runtime_dir

    def claim(self) -> Config:
        """The config with this instance's ``instance`` and ``runtime_dir`` filled in (kept as ``cfg``
        too); raises ConfigError or RuntimeDirInUse."""
        instance = str(os.getpid())
        gone = shm.clean_stale(_instance_alive) + addresses.clean_stale_runtime_dirs(_instance_alive)
        if gone:
            log.warning("removed %d stale segments/dirs left by crashed instances: %s", len(gone),
                        ", ".join(gone[:5]))
        runtime_dir = addresses.runtime_dir(instance, self.cfg.runtime_dir)
        cfg = self.cfg = dataclasses.replace(self.cfg, instance=instance, runtime_dir=runtime_dir)
        lock = addresses.RuntimeDirLock(cfg.runtime_dir)
        try:  # before anything binds or spawns: a second instance must not join our hub
            os.makedirs(cfg.runtime_dir, mode=0o700, exist_ok=True)
            unsafe = addresses.unsafe_dir(cfg.runtime_dir)
            if unsafe is not None:
                raise ConfigError(f"invalid configuration: runtime directory {cfg.runtime_dir!r} is not safe "
                                  f"to use: {unsafe}; remove it or set AIENG_RUNTIME_DIR to a private one")
            lock.acquire()
        except OSError as exc:
            src = ("default, under the temp dir" if self.own_runtime_dir
                   else cfg.sources.get("runtime_dir", "default"))
            raise ConfigError(f"invalid configuration: AIENG_RUNTIME_DIR {cfg.runtime_dir!r} cannot be "
                              f"created or used: {exc.strerror or exc} (from {src})") from None
        self.lock = lock
        return cfg

    def check_state_dir(self) -> None:
        """Routing changes (automatic rollbacks too) must survive a restart: a state dir that cannot be
        written refuses the start, instead of every change living in memory only (empty: persistence off)."""
        cfg = self.cfg
        why = state_dir_problem(cfg.state_dir) if cfg.state_dir else None
        if why is not None:
            src = cfg.sources.get("state_dir", "default")
            raise ConfigError(f"invalid configuration: AIENG_STATE_DIR {cfg.state_dir!r} cannot be written: "
                              f"{why} (from {src}); routing changes and automatic rollbacks would be lost at "
                              f"a restart: set AIENG_STATE_DIR to a directory this user can write")

    def release(self) -> None:
        """Remove what is ours in the runtime dir, then drop its lock.  Only the lock's holder
        touches the dir, so a refused second instance never removes the first one's socket."""
        if self.lock is None:
            return
        if self.own_runtime_dir:
            shutil.rmtree(self.cfg.runtime_dir, ignore_errors=True)
        else:  # a configured dir may hold other things: remove only our sockets
            for path in addresses.socket_files(self.cfg.runtime_dir, self.cfg.postprocess_workers):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        self.lock.release()
        self.lock = None
