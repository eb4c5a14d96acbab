"""Cold-load waiters shared per client (issue 37): at the bound, one owner holding many gives a place up."""
from __future__ import annotations

from aieng.frontend.versions.pool import ColdStarts

K = ("lazy", "1")


def test_a_newcomer_takes_the_newest_place_of_the_owner_holding_the_most():
    cold: ColdStarts[str] = ColdStarts(max_waiting=4)
    cold.start(K)
    for i in range(4):
        assert cold.add(K, 10.0 + i, f"a{i}", "key:a")
    assert cold.add(K, 20.0, "b0", "key:b") is False  # full
    assert cold.make_place(K, "key:b") == "a3"  # the caller refuses a3 OVERLOADED
    assert cold.add(K, 20.0, "b0", "key:b")
    assert cold.add(K, 21.0, "b1", "key:b") is False
    assert cold.make_place(K, "key:b") == "a2"  # a holds 3, b would hold 2
    assert cold.add(K, 21.0, "b1", "key:b")
    assert cold.add(K, 22.0, "b2", "key:b") is False
    assert cold.make_place(K, "key:b") is None  # 2 and 2: no swap that helps anyone
    assert cold.ready(K) == ["a0", "a1", "b0", "b1"]


def test_owners_with_one_place_each_keep_them():
    """The per-version bound as before: each waiter its own client, the fifth is refused."""
    cold: ColdStarts[str] = ColdStarts(max_waiting=2)
    cold.start(K)
    assert cold.add(K, 1.0, "r1", b"conn-1") and cold.add(K, 1.0, "r2", b"conn-2")
    assert cold.add(K, 1.0, "r3", b"conn-3") is False
    assert cold.make_place(K, b"conn-3") is None
    assert cold.waiting(K) == 2


def test_expired_waiters_keep_their_owners():
    cold: ColdStarts[str] = ColdStarts(max_waiting=3)
    cold.start(K)
    cold.add(K, 5.0, "short", "key:a")
    cold.add(K, 50.0, "a1", "key:a")
    cold.add(K, 50.0, "a2", "key:a")
    assert cold.expired(10.0) == [(K, "short")]
    cold.add(K, 50.0, "a3", "key:a")
    assert cold.make_place(K, "key:b") == "a3"
