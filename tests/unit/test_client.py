"""The reference client's request builder (pure)."""
from aieng.client import build_request


def test_routing_key_is_sent_only_when_given():
    keyed = build_request(1, "tabular", {"island": "Dream"}, routing_key="user-42")
    assert keyed["routing_key"] == "user-42"
    assert "routing_key" not in build_request(2, "tabular", {"island": "Dream"})
