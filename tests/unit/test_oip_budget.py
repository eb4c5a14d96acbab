"""The gateway's per-peer row budget (issue 20, finding 6): pure logic."""
from __future__ import annotations

import pytest

from aieng.gateway.budget import PeerBudget, gateway_share
from aieng.wire import protocol as p


def test_gateways_share_half_of_max_inflight_within_the_per_client_limit():
    assert gateway_share(256, 128, 1) == 128
    assert gateway_share(256, 128, 2) == 64
    assert gateway_share(256, 10, 1) == 10  # the frontend would refuse more than its per-client limit
    assert gateway_share(1, 1, 4) == 1


def test_a_peer_holds_at_most_half_and_two_peers_fit():
    b = PeerBudget(128)
    b.take("a", 32)
    b.take("a", 32)
    with pytest.raises(p.RequestError) as info:
        b.take("a", 1)
    assert info.value.code == p.OVERLOADED and "64 rows in flight at this gateway" in info.value.message
    b.take("b", 64)
    assert (b.total, b.held) == (128, {"a": 64, "b": 64})


def test_a_request_is_taken_whole_or_not_at_all():
    b = PeerBudget(10)  # 5 per peer
    b.take("a", 4)
    with pytest.raises(p.RequestError):
        b.take("a", 2)
    assert b.held == {"a": 4}  # nothing of the refused request was taken


def test_the_gateway_share_bounds_all_peers_together():
    b = PeerBudget(4)
    b.take("a", 2)
    b.take("b", 2)
    with pytest.raises(p.RequestError) as info:
        b.take("c", 1)
    assert "this gateway has 4 rows in flight" in info.value.message


def test_an_idle_peer_may_always_send_one_request_even_a_wide_one():
    b = PeerBudget(8)  # 4 per peer
    b.take("a", 6)  # wider than the per-peer half, but a has nothing in flight
    b.give("a", 6)
    assert (b.total, b.held) == (0, {})
    b.take("a", 9)  # wider than the whole share, on an idle gateway
    assert b.total == 9


def test_rows_given_back_one_by_one_free_the_peer():
    b = PeerBudget(8)
    b.take("a", 3)
    for _ in range(3):
        b.give("a")
    assert (b.total, b.held) == (0, {})
    b.take("a", 4)
    assert b.held == {"a": 4}
