"""The wiring diagram: every internal address, who binds it and who connects.

Control: the frontend binds a ROUTER at ``hub``; every worker (``pre-<i>``, ``executor``,
``post-<j>``), every OIP gateway (``gw-<k>``) and the supervisor connect a DEALER with their name as
ZMQ identity.  Clients reach the
frontend's client ROUTER at ``Config.frontend_addr``.  Data path (descriptors only, stage to stage):
the executor binds a PULL at ``exec_addr`` that every preprocess worker PUSHes to; each postprocess
worker binds a PULL at ``post_addr(name)`` that the executor PUSHes to from its first send there.  The
executor also listens at ``express_path`` (SOCK_SEQPACKET, ``express``) for the frontend's direct
requests.  A PUSH queues while its peer restarts, so a restart holds requests instead of losing them.
Beside them, the frontend, the executor and every pool worker listen at ``lane_path(name)``
(SOCK_SEQPACKET, ``lanes``): the data path's messages take that lane when they can, ZeroMQ when not.

One instance per runtime directory: the supervisor holds ``RuntimeDirLock`` (an ``flock`` on
``<runtime dir>/aieng.lock``, holding its pid) from before anything binds until everything stopped; a
second instance on the same directory is refused at once, naming the directory and the holder's pid.
"""
from __future__ import annotations

import fcntl
import glob
import os
import shutil
import tempfile

RUNTIME_PREFIX = "aieng."
LOCK_NAME = "aieng.lock"


class RuntimeDirInUse(RuntimeError):
    pass


class RuntimeDirLock:
    """An exclusive ``flock`` on ``<rdir>/aieng.lock``; the file holds the holder's pid.

    The kernel drops the lock when the holder dies, however it dies, so a crashed
    instance never blocks the next one; the file is removed on a clean release only.
    The fd is not inherited by children (O_CLOEXEC, and spawn passes no fds), so
    the lock lives exactly as long as the supervisor.
    """

    def __init__(self, rdir: str):
        self.rdir = rdir
        self.path = os.path.join(rdir, LOCK_NAME)
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``RuntimeDirInUse``; ``OSError`` if the file cannot be opened."""
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                raise RuntimeDirInUse(f"runtime directory {self.rdir} is in use by another aieng instance "
                                      f"(pid {holder or 'unknown'} holds {self.path}); "
                                      f"give each instance its own AIENG_RUNTIME_DIR") from None
            try:  # the holder we raced with may have unlinked the file we locked: lock the live one
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self.fd = fd
                return
            os.close(fd)
        raise RuntimeDirInUse(f"runtime directory {self.rdir}: could not take {self.path} "
                              f"(it keeps being replaced)")

    def release(self) -> None:
        """Remove the file (only while we hold it, so never another holder's) and drop the lock."""
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None


def unsafe_dir(path: str) -> str | None:
    """Why ``path`` must not hold this instance's sockets (None: it may): it must be a real directory (not a
    link) owned by this user and not writable by every user.  Otherwise another local user could have made it
    first (the default name is predictable), and could replace the admin socket and answer the operator."""
    import stat

    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory (a link or a file)"
    if st.st_uid != os.getuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & 0o002:  # group-writable is the group's choice (a service group); world-writable never
        return f"it is writable by every user (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def runtime_dir(instance: str, configured: str = "") -> str:
    return configured or os.path.join(tempfile.gettempdir(), f"{RUNTIME_PREFIX}{instance}")


def hub_addr(rdir: str) -> str:
    return f"ipc://{os.path.join(rdir, 'hub.sock')}"


def admin_addr(configured: str, rdir: str) -> str:
    """The admin socket: ``AIENG_ADMIN_ADDR`` when set, else ``ipc://<runtime dir>/admin.sock``."""
    return configured or f"ipc://{os.path.join(rdir, 'admin.sock')}"


def exec_addr(rdir: str) -> str:
    return f"ipc://{os.path.join(rdir, 'executor.sock')}"


def express_path(rdir: str) -> str:
    """The executor's SOCK_SEQPACKET listener for the frontend's direct requests (``express``)."""
    return os.path.join(rdir, "express.sock")


def lane_path(rdir: str, name: str) -> str:
    """``name``'s SOCK_SEQPACKET listener for data-path records from the other processes (``lanes``)."""
    return os.path.join(rdir, f"lane-{name}.sock")


def post_addr(rdir: str, name: str) -> str:
    return f"ipc://{os.path.join(rdir, name + '.sock')}"


def socket_files(rdir: str, n_post: int) -> list[str]:
    """Every socket file an instance makes in its runtime dir (removed on a clean stop)."""
    names = ["hub.sock", "executor.sock", "express.sock"] + [f"post-{j}.sock" for j in range(n_post)]
    return [os.path.join(rdir, n) for n in names] + sorted(glob.glob(lane_path(glob.escape(rdir), "*")))


def clean_stale_runtime_dirs(alive) -> list[str]:
    """Remove ``/tmp/aieng.<pid>`` dirs whose supervisor is gone."""
    base = tempfile.gettempdir()
    gone = []
    for name in os.listdir(base):
        if name.startswith(RUNTIME_PREFIX) and name[len(RUNTIME_PREFIX):].isdigit():
            if not alive(int(name[len(RUNTIME_PREFIX):])):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
                gone.append(name)
    return gone


def worker_names(n_pre: int, n_post: int) -> list[tuple[str, str]]:
    """``[(role, worker name)]`` in start order."""
    return ([("frontend", "frontend")] + [("preprocess", f"pre-{i}") for i in range(n_pre)]
            + [("executor", "executor")] + [("postprocess", f"post-{j}") for j in range(n_post)])
