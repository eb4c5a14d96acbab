"""Unit tests for aieng/wire/addresses.py's RuntimeDirLock: one instance per runtime directory."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

import pytest

from aieng.wire.addresses import LOCK_NAME, RuntimeDirInUse, RuntimeDirLock

HOLD = ("import sys; from aieng.wire.addresses import RuntimeDirLock; "
        "RuntimeDirLock(sys.argv[1]).acquire(); print('held', flush=True); sys.stdin.read()")


def test_lock_holds_pid_and_refuses_a_second_holder(tmp_path):
    first = RuntimeDirLock(str(tmp_path))
    first.acquire()
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
    second = RuntimeDirLock(str(tmp_path))  # its own open file: flock conflicts even in one process
    with pytest.raises(RuntimeDirInUse) as err:
        second.acquire()
    assert str(tmp_path) in str(err.value) and f"pid {os.getpid()}" in str(err.value)
    second.release()  # never held: must not remove the holder's file
    assert (tmp_path / LOCK_NAME).is_file()
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    second.acquire()
    second.release()


def test_lock_of_a_killed_holder_is_free(tmp_path):
    """The kernel drops an flock when its holder dies, so a crashed instance never blocks the next."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=root,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([holder.stdout], [], [], 30)[0], "the holder said nothing within 30 s"  # bounded
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RuntimeDirInUse, match=f"pid {holder.pid}"):
            RuntimeDirLock(str(tmp_path)).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        holder.stdin.close()
        holder.stdout.close()
    lock = RuntimeDirLock(str(tmp_path))
    lock.acquire()  # the dead holder's pid is still in the file; the lock is free
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
    lock.release()


def test_unwritable_dir_is_an_os_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError):
        RuntimeDirLock(str(blocker)).acquire()
