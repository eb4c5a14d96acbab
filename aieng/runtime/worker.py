"""One runtime for every role: the process launcher and the hub worker base.

``run_process(role, cfg_dict, spec_blobs, worker, ready_conn)`` is the only process entry point the
supervisor spawns: it does the plumbing once for every role (title ``aieng::<role>[<i>]``, log prefix,
parent-death hooks, internal unpack limits), builds the role's work object, reports ready or the
startup failure to the supervisor, runs it until SIGTERM and closes it.  The specs come packed
(``specbook``): a pool worker or a gateway is given the ``SpecBook`` itself (it reads a spec when it
needs one), the frontend and the executor a dict of them.

``HubWorker`` is the base of the three worker roles.  Its loop waits on the hub socket, the role's
``inbox`` (a PULL the previous stage pushes descriptors to), its lane (``wire/lanes``: the same
messages, one wake-up a hand-off) and the role's ``wake_fds``, drains every message waiting, routes each by
type through a dispatch table (``LogLevel`` and ``Soon`` here for every role), then calls ``after_drain`` and
sends a heartbeat ``Hello`` at most once a second.  A ``Soon`` (``soon``, ``on_soon``) has the loop poll
without sleeping until the message it announced comes (the role calls ``came``), at most ``SPIN_MAX_S``.
``send`` takes the lane to the frontend for the data path's messages (``LANE_TYPES``), the hub for the rest
and whenever the lane cannot take one at once.  A message that cannot be decoded is logged and skipped, never
fatal.  ``publish`` is the one ring-publishing path: a slot of the payload's size class (waiting while that
class is full, bounded by the request's deadline), the tensors written, their ``Ref`` returned.
"""
from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import time
from typing import Any, Callable

import zmq

from aieng import envs
from aieng.config import Config
from aieng.runtime import procutil
from aieng.runtime.hub import HEARTBEAT_S, dispatch
from aieng.runtime.specbook import SpecBook
from aieng.wire import lanes, shm, shmsize
from aieng.wire import messages as m
from aieng.wire.addresses import hub_addr, lane_path
from aieng.wire.protocol import TIMEOUT, RequestError

# role -> "module:Class"; imported in the child only, so a worker never imports another role's code.
ROLES = {
    "frontend": "aieng.frontend.server:Frontend",
    "preprocess": "aieng.preprocess_workers.worker:PreprocessWorker",
    "executor": "aieng.gpu_executor.executor:Executor",
    "postprocess": "aieng.postprocess_workers.worker:PostprocessWorker",
    "gateway": "aieng.gateway.process:Gateway",
}


# What a worker sends the frontend on its lane: requests' notices and answers, whose handlers take them in
# any order.  The rest (hellos, version loads) keeps the hub's order.
LANE_TYPES = (m.Preprocessed, m.Inferred, m.Result, m.Failed)

# A ``Soon``: the most it keeps a worker polling, and the sender's rule for sending one (the work before the
# announced message is measured to take at most ``SOON_WORK_S``): on an idle VM a process whose CPU has
# halted takes 80-160 us to wake for a hand-off (docs/architecture.md, 'Wake-ahead')
SPIN_MAX_S = 0.002
SOON_WORK_S = 0.001

SOON = m.encode(m.Soon(SPIN_MAX_S))

# Roles given their specs as a ``SpecBook``: a pool worker reads a tensor model's spec only for a request
# the executor left to it, so most of them stay packed; a gateway keeps only each one's batching.
PACKED_ROLES = ("preprocess", "postprocess", "gateway")


def role_class(role: str) -> type:
    module, _, name = ROLES[role].partition(":")
    return getattr(importlib.import_module(module), name)


def run_process(role: str, cfg_dict: dict, spec_blobs: dict[str, bytes], worker: str, ready_conn) -> None:
    """The entry point of every child process (see the module docstring)."""
    # What the fork server imported is shared with it page by page until written: a collection here would
    # write every inherited object's header and copy its page (a full pass, once the models' objects
    # trigger one: ~3 MB more per process).  Frozen, the collector never visits them; they live as long.
    gc.freeze()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, procutil.FORK_BLOCKED)  # as the fork server had them
    cfg = Config.from_dict(cfg_dict)
    if role in ("preprocess", "executor"):  # the executor tokenises a lone request itself (inline_pre)
        # The tokenizers library hands even one text to its own thread pool: a cross-thread wake-up
        # per batch, and threads competing with the executor's for the same few cores (profile).
        # The pool is the parallelism here.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    log = procutil.child_setup(role, worker, cfg_dict, ready_conn)
    m.configure(cfg.max_message_bytes)
    stop = procutil.StopFlag()
    try:
        # the process object keeps its arguments for the child's life: the book takes the packed specs over
        book = SpecBook(dict(spec_blobs))
        spec_blobs.clear()
        specs = book if role in PACKED_ROLES else dict(book.items())  # built one at a time
        obj = role_class(role)(cfg, specs, worker, log)
    except Exception as exc:
        procutil.report_failure(ready_conn, log, exc)
        raise SystemExit(1)
    procutil.report_ready(ready_conn)
    try:
        obj.run(stop)
    finally:
        obj.close()


def own_ring(cfg: Config, worker: str, need_bytes: int, small_requests: bool = False) -> shm.Ring:
    """This producer's ring: a slot per request the service may hold, each big enough for its models
    (fewer, bigger slots in the same bytes when a model needs them, and a class of small slots beside
    them when some model's requests are small: ``shmsize.ring_shape``)."""
    name = shm.segment_name(cfg.instance, worker, os.getpid())
    nslots, slot_bytes, nsmall = shmsize.ring_shape(cfg, need_bytes, small_requests)
    return shm.Ring.create(name, nslots, slot_bytes, lease_s=shm.lease_for(cfg.max_timeout_ms),
                           nsmall=nsmall, small_bytes=cfg.shm_slot_bytes)


class HubWorker:
    """Base of the hub workers: socket, heartbeat, drain, dispatch, fail (see the module docstring)."""

    role = ""

    def __init__(self, cfg: Config, worker: str, log: logging.Logger):
        self.cfg, self.worker, self.log = cfg, worker, log
        self.sock = procutil.hub_socket(zmq.Context.instance(), hub_addr(cfg.runtime_dir), worker)
        self.handlers: dict[type, Callable[[Any, list], None]] = {m.LogLevel: self.on_log_level,
                                                                   m.Soon: self.on_soon}
        self.spin_until = 0.0  # a ``Soon`` came: poll without sleeping until then (or its task comes)
        # announce only with a core to spare: on one CPU a process polling for a message would take the CPU
        # from the process that is to send it
        self.wake_ahead = envs.cpu_count() >= 2
        self.next_hello = 0.0
        self.hello: m.Hello | None = None  # the last built (``refresh_hello``)
        self.hello_bytes = b""
        self.hello_stale = False  # rebuild ``hello_bytes`` at the next heartbeat (a count it shows changed)
        self.wake_fds: list[int] = []  # more file descriptors the loop waits on (the executor's lanes)
        self.poller: zmq.Poller | None = None  # the loop's; a role may watch more fds while it runs
        self.ready: dict = {}  # the sockets and fds the last poll found readable
        self.inbox: zmq.Socket | None = None  # the data-path PULL socket, for roles that have one
        rdir = cfg.runtime_dir
        self.pool_lanes = lanes.LaneEnds(worker, lambda name: lane_path(rdir, name), cfg.pool_lanes)
        self.outbound = self.pool_lanes.out  # what the roles send on (the executor's PostTasks, InferTasks)

    # -- what a role provides -------------------------------------------------
    def hello_fields(self) -> dict:
        """This role's fields of its ``Hello`` (failed loads, ring, sessions): what health and models show."""
        return {}

    def hello_msg(self) -> m.Hello:
        """This worker's heartbeat (sent again as is until ``hello_bytes`` is rebuilt)."""
        return m.Hello(self.worker, self.role, os.getpid(), lanes=self.pool_lanes.counts(),
                       **self.hello_fields())

    def refresh_hello(self) -> None:
        """Rebuild the heartbeat now: what it shows changed (a version loaded or unloaded)."""
        self.hello = self.hello_msg()
        self.hello_bytes = m.encode(self.hello)

    def after_drain(self, now: float) -> int | None:
        """Work to do once the waiting messages are read; returns the next poll timeout in ms."""
        return None

    # -- the loop ---------------------------------------------------------------
    def run(self, stop: procutil.StopFlag) -> None:
        self.refresh_hello()
        self.heartbeat()
        poller = self.poller = zmq.Poller()
        socks = [self.sock] + ([self.inbox] if self.inbox is not None else [])
        for sock in socks:
            poller.register(sock, zmq.POLLIN)
        for fd in self.wake_fds:
            poller.register(fd, zmq.POLLIN)
        self.pool_lanes.register(poller)
        timeout_ms = 200
        while not stop.stop:
            self.ready = dict(poller.poll(timeout_ms))  # what woke the loop (a role's own fds too)
            if self.ready:
                for sock in socks:
                    if sock in self.ready:  # zmq.Poller reads a ZeroMQ socket's own events: level-triggered
                        self.drain(sock)
                self.drain_lane()
            now = time.monotonic()
            timeout_ms = self.wait_ms(now, self.after_drain(now))
            self.heartbeat()

    def bind_inbox(self, addr: str) -> None:
        self.inbox = zmq.Context.instance().socket(zmq.PULL)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.inbox.setsockopt(zmq.RCVHWM, 0)  # bounded by the requests in flight, not by a queue size
        self.inbox.bind(addr)

    def drain(self, sock: zmq.Socket, limit: int = 1000) -> None:
        for _ in range(limit):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            dispatch(frames[0].buffer, self.handlers, self.log, "the hub", frames)

    def drain_lane(self) -> None:
        for _, head, body in self.pool_lanes.poll(self.poller, self.ready):
            dispatch(head, self.handlers, self.log, "a lane", [lanes.Frame(head), lanes.Frame(body)])

    def heartbeat(self) -> None:
        now = time.monotonic()
        if now >= self.next_hello:
            if self.hello_stale:
                self.refresh_hello()
                self.hello_stale = False
            counts = self.pool_lanes.counts()
            if counts != self.hello.lanes:  # only the lanes' counts changed: encoded again, not rebuilt
                self.hello.lanes = counts
                self.hello_bytes = m.encode(self.hello)
            self.sock.send(self.hello_bytes)
            self.next_hello = now + HEARTBEAT_S

    def wait_ms(self, now: float, nxt: int | None) -> int:
        """How long the loop's next poll may sleep: 0 while a ``Soon`` holds (polling, not sleeping), else
        what the role asked for (``after_drain``: None is 200 ms, the heartbeat's pace)."""
        if self.spin_until:
            if now < self.spin_until:
                return 0
            self.spin_until = 0.0
        return 200 if nxt is None else nxt

    def soon(self, dest: str, key: str = "", post: str = "") -> None:
        """Tell ``dest`` that a message is on its way (``Soon``): a hint on its lane, dropped when the lane
        cannot take it at once (never sent on ZeroMQ, never counted as a fallback); never on one CPU."""
        if self.wake_ahead:
            self.outbound.hint(dest, m.encode(m.Soon(SPIN_MAX_S, key, post)) if key else SOON)

    def on_soon(self, msg: m.Soon, frames: list) -> None:
        self.spin_until = time.monotonic() + min(msg.for_s, SPIN_MAX_S)

    def came(self) -> None:
        """What a ``Soon`` announced came: back to sleeping while idle."""
        self.spin_until = 0.0

    def on_log_level(self, msg: m.LogLevel, frames: list) -> None:
        procutil.set_level(msg.level)

    # -- sending ------------------------------------------------------------------
    def send(self, msg: Any) -> None:
        if type(msg) in LANE_TYPES:
            self.send_data(m.encode(msg))
        else:
            self.sock.send(m.encode(msg))

    def send_data(self, data: bytes) -> None:
        """A data-path message (``LANE_TYPES``, or a ``Bundle`` of them) to the frontend: lane, else hub."""
        if not self.outbound.send("frontend", data):
            self.sock.send(data)

    def fail(self, rid: int, code: str, message: str, ref: m.Ref | None = None) -> None:
        self.send(m.Failed(rid, code, message, ref))

    def publish(self, ring: shm.Ring, tensors, deadline: float, overflow_code: str) -> m.Ref:
        """Write one request's tensors into a slot of ``ring``; raises RequestError when it cannot."""
        tensors = list(tensors)
        nbytes = shm.payload_bytes(tensors)  # its size class (shm.Ring)
        slot = ring.alloc(nbytes)
        while slot is None:  # its class is full: backpressure until a consumer frees a slot
            if time.monotonic() > deadline:
                raise RequestError(TIMEOUT, "deadline passed waiting for a shared-memory slot")
            time.sleep(0.0005)
            self.heartbeat()
            slot = ring.alloc(nbytes)
        try:
            descs = ring.write(slot[0], tensors)
        except OverflowError as exc:
            ring.free(*slot)
            raise RequestError(overflow_code, f"{exc}; raise AIENG_SHM_SLOT_BYTES") from None
        return m.Ref(ring.seg.name, slot[0], slot[1], descs)

    def close(self) -> None:
        self.sock.close(0)
        if self.inbox is not None:
            self.inbox.close(0)
        self.pool_lanes.close()


def push_socket(addr: str) -> zmq.Socket:
    """A PUSH to the next stage's inbox; it queues while that stage restarts (bounded by in-flight)."""
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(addr)
    return sock
