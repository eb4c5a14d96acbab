"""A cold version's waiters shared per client (issue 37): the version manager with fake workers (the rig of
test_versions.py), AIENG_MAX_INFLIGHT=4 so four may wait.  Principal A's four waiters fill the bound; B's
first request takes the place of A's newest (answered OVERLOADED); every other waiter goes on its way once
the version is ready."""
from __future__ import annotations

import dataclasses

from aieng.wire import protocol as p
from tests.component.test_versions import Rig, infer_request


def test_one_principal_cannot_keep_another_out_of_a_cold_load(tmp_path):
    rig = Rig(tmp_path, served=("1",), cold=("1",), lazy=True, max_inflight=4)
    for rid, owner in [(rid, "via:key:a") for rid in (1, 2, 3, 4)] + [(5, "via:key:b")]:
        req, inputs = infer_request(rig, "1", rid)
        assert rig.vm.start(dataclasses.replace(req, owner=owner), inputs) is False  # waits, or refused
    assert [(r.rid, code) for r, code, _ in rig.refused] == [(4, p.OVERLOADED)]
    assert "is loading (cold start) and 4 requests wait for it already" in rig.refused[0][2]
    req, inputs = infer_request(rig, "1", 6)
    assert rig.vm.start(dataclasses.replace(req, owner="via:key:b"), inputs) is False
    assert [r.rid for r, _, _ in rig.refused] == [4, 3]  # A held 3, B would hold 2: one more place
    req, inputs = infer_request(rig, "1", 7)
    assert rig.vm.start(dataclasses.replace(req, owner="via:key:b"), inputs) is False
    assert [r.rid for r, _, _ in rig.refused] == [4, 3, 7]  # 2 and 2: B's third is refused itself
    assert rig.validated("tabular:1") == "loading"
    rig.build_everywhere("tabular:1")
    rig.answer_golden()
    assert [r.rid for r in rig.started] == [1, 2, 5, 6]
