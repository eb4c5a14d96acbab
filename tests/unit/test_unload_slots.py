"""An unloaded version leaves no input slot behind in the executor: what still waits in its queues when the
frontend releases it (a shadow copy, which the frontend's drain does not wait for; a request it answered
TIMEOUT before the executor's own expiry) has its slot freed then, not at the ring's lease."""
from __future__ import annotations

import os
import time

from aieng.wire import messages as m
from aieng.wire import shm
from tests.unit.demo import needs_demo_models
from tests.unit.test_background_lane import batching_executor


@needs_demo_models
def test_unloading_a_version_frees_the_input_slots_still_queued_for_it():
    ex, spec = batching_executor()
    sess = ex.sessions[spec.key]
    tensors = [[i.name, i.dtype.name, [1 if not isinstance(d, int) or d < 0 else d for d in i.dims], 0]
               for i in sess.inputs]
    ring = shm.Ring.create(shm.segment_name(f"9{os.getpid()}", "pre-0", os.getpid()), 4, 4096)
    ex.inputs, ex.bg_runs, ex.spare_runs = shm.RingCache(), {}, {}
    try:
        slots = [ring.alloc() for _ in range(2)]
        for rid, (slot, gen), background in ((1, slots[0], False), (2, slots[1], True)):
            ref = m.Ref(ring.seg.name, slot, gen, tensors)
            assert ex.accept(m.InferTask(rid, "tabular", "1", time.monotonic() + 5, ref, 0, 0, "post-0", {},
                                         background=background))
        assert all(ring.holds(*s) for s in slots)
        ex.remove_version(spec.key)
        assert ring.in_use() == 0
        assert spec.key not in ex.batcher.queues and spec.key not in ex.bg_batcher.queues
    finally:
        ex.inputs.close()
        ring.close()
        ring.seg.unlink()
