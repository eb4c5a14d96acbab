"""API keys on the OIP doors (issue 37): the key file, its reload, the lookup, the principal, the budget."""
from __future__ import annotations

import logging
import os

import pytest

from aieng.gateway import apikeys, guard
from aieng.gateway.apikeys import Grant, KeyFileError, KeyRing, bearer, parse
from aieng.gateway.budget import PeerBudget
from aieng.gateway.principal import principal
from aieng.wire import protocol as p

A = "alice-0123456789abcdef"
B = "bob-0123456789abcdef00"
LOG = logging.getLogger("test.apikeys")


def grants(text: str) -> dict[str, Grant]:
    """The parsed file as key -> grant (the ring keeps digests; the test knows its keys)."""
    keys = parse(text, "keys.txt")
    out = {}
    for key in (A, B, "carol-0123456789abcdef"):
        found = keys.get(apikeys.digest(key))
        if found is not None:
            out[key] = found[1]
    assert len(out) == len(keys)
    return out


def test_lines_comments_blanks_and_allow_lists():
    text = f"# tenants\n\nalice:{A}\n  bob:{B}:tabular, iris  # two models\n"
    assert grants(text) == {A: Grant("alice"), B: Grant("bob", frozenset({"tabular", "iris"}))}


def test_one_principal_may_hold_two_keys_for_rotation():
    text = f"alice:{A}\nalice:{B}\n"
    assert grants(text) == {A: Grant("alice"), B: Grant("alice")}


@pytest.mark.parametrize("line, why", [
    ("alice", "1 ':'-separated fields"),
    (f"alice:{A}:m:x", "4 ':'-separated fields"),
    (f"al ice:{A}", "the principal must be"),
    (f":{A}", "the principal must be"),
    ("alice:short", "at least 16 printable ASCII characters"),
    ("alice:0123456789abc def", "at least 16 printable ASCII characters, without spaces"),
    ("alice:0123456789abcdéf", "at least 16 printable ASCII characters"),
    (f"alice:{A}:", "the allow-list must be"),
    (f"alice:{A}:a,,b", "the allow-list must be"),
    (f"alice:{A}:../x", "the allow-list must be"),
])
def test_a_bad_line_is_named_by_its_number(line, why):
    with pytest.raises(KeyFileError) as info:
        parse(f"# header\nbob:{B}\n{line}\n", "/etc/k.txt")
    msg = str(info.value)
    assert msg.startswith("AIENG_OIP_API_KEYS_FILE: /etc/k.txt line 3: ") and why in msg, msg
    assert "\n" not in msg and A not in msg  # one line, and never the key


def test_a_hash_inside_a_key_is_part_of_it_and_a_bom_is_not_part_of_a_name(tmp_path):
    f = tmp_path / "keys"
    f.write_text(f"\ufeffalice:{A}#x  # the comment\n", encoding="utf-8")
    ring = KeyRing(str(f), LOG)
    assert (ring.check(A + "#x"), ring.check(A)) == (Grant("alice"), None)


def test_the_lookup_compares_digests_with_compare_digest(tmp_path, monkeypatch):
    """Never ``==`` on a secret: the stored and the offered key meet only as SHA-256 digests, in
    ``hmac.compare_digest``."""
    f = tmp_path / "keys"
    f.write_text(f"alice:{A}\n")
    ring = KeyRing(str(f), LOG)
    seen = []
    real = apikeys.hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(apikeys.hmac, "compare_digest", spy)
    assert ring.check(A) == Grant("alice")
    assert seen == [(apikeys.digest(A), apikeys.digest(A))] and len(seen[0][0]) == 32


def test_a_key_given_twice_is_refused():
    with pytest.raises(KeyFileError, match="line 2: this key is already given"):
        parse(f"alice:{A}\nbob:{A}\n", "k")


def test_check_answers_the_grant_only_for_a_whole_key(tmp_path):
    f = tmp_path / "keys"
    f.write_text(f"alice:{A}:tabular\n")
    ring = KeyRing(str(f), LOG)
    assert ring.check(A) == Grant("alice", frozenset({"tabular"}))
    assert [ring.check(t) for t in (None, "", A[:-1], A + "x", A.upper(), B)] == [None] * 6


def test_bearer_reads_the_authorization_value():
    assert [bearer(v) for v in (f"Bearer {A}", f"bearer  {A} ", f"BEARER {A}")] == [A] * 3
    assert [bearer(v) for v in (None, "", "Bearer", "Bearer ", f"Basic {A}", A)] == [None] * 6


def _rewrite(path, text: str) -> None:
    """A new file put in place by rename, as a config manager or a Kubernetes Secret does (a new inode)."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_refresh_takes_a_rewrite_and_keeps_the_last_good_keys_on_a_broken_one(tmp_path, caplog):
    f = tmp_path / "keys"
    f.write_text(f"alice:{A}\n")
    ring = KeyRing(str(f), LOG)
    assert ring.refresh() is False  # unchanged: not read again
    _rewrite(f, f"bob:{B}\n")
    assert ring.refresh() is True
    assert (ring.check(A), ring.check(B)) == (None, Grant("bob"))
    with caplog.at_level(logging.ERROR, LOG.name):
        _rewrite(f, f"bob:{B}\nbroken\n")
        assert ring.refresh() is False
    assert ring.check(B) == Grant("bob")
    assert [r.getMessage() for r in caplog.records] == [
        "AIENG_OIP_API_KEYS_FILE: " + str(f) + " line 2: 1 ':'-separated fields (expected PRINCIPAL:KEY or "
        "PRINCIPAL:KEY:model_a,model_b); keeping the last good keys (1)"]
    caplog.clear()
    with caplog.at_level(logging.ERROR, LOG.name):
        assert ring.refresh() is False  # the same broken file: logged once, not every second
    assert caplog.records == []
    f.unlink()
    assert ring.refresh() is False
    assert ring.check(B) == Grant("bob")  # a removed file keeps the last good keys too
    _rewrite(f, f"alice:{A}\n")
    assert ring.refresh() is True and ring.check(A) == Grant("alice") and ring.check(B) is None


def test_refresh_sees_an_in_place_rewrite_of_the_same_size(tmp_path):
    f = tmp_path / "keys"
    f.write_text(f"alice:{A}\n")
    ring = KeyRing(str(f), LOG)
    st = os.stat(f)
    f.write_text(f"alice:{A[:-1]}Z\n")  # same size, same inode: the mtime tells
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert ring.refresh() is True
    assert ring.check(A) is None and ring.check(A[:-1] + "Z") == Grant("alice")


def test_a_missing_file_at_start_is_one_line(tmp_path):
    with pytest.raises(KeyFileError) as info:
        KeyRing(str(tmp_path / "nope"), LOG)
    want = f"AIENG_OIP_API_KEYS_FILE: cannot read {tmp_path / 'nope'}: No such file or directory"
    assert str(info.value) == want


def test_principal_prefers_the_key_then_the_certificate_then_the_address():
    assert principal(Grant("alice"), "CN=x", "10.0.0.1") == "key:alice"
    assert principal(None, "CN=x", "10.0.0.1") == "cert:CN=x"
    assert principal(None, None, "10.0.0.1") == "10.0.0.1"
    assert principal(None, None, "2001:db8::1") == "2001:db8::/64"


def test_the_budget_counts_two_principals_behind_one_address_apart():
    b = PeerBudget(128)  # 64 rows per peer
    a, c = principal(Grant("a"), None, "127.0.0.1"), principal(Grant("c"), None, "127.0.0.1")
    b.take(a, 64)
    with pytest.raises(p.RequestError):
        b.take(a, 1)
    b.take(c, 1)  # same address, another principal: its own share
    assert b.held == {"key:a": 64, "key:c": 1}


def test_guard_hides_models_outside_an_allow_list():
    g = Grant("bob", frozenset({"tabular"}))
    guard.hidden(g, "tabular", None)
    guard.hidden(Grant("all"), "other", None)
    with pytest.raises(p.RequestError) as info:
        guard.hidden(g, "other", "2")
    want = "Request for unknown model: 'other' version 2 is not found"
    assert (info.value.code, info.value.message) == (p.MODEL_NOT_FOUND, want)
    assert guard.http_model(["v2", "models", "m", "versions", "3", "infer"]) == ("m", "3")
    assert [guard.http_model(x) for x in (["v2", "models", "stats"], ["v2"], ["v2", "health", "ready"])] \
        == [None] * 3
    entries = [{"name": "tabular"}, {"name": "other"}]
    assert guard.visible(g, entries) == [{"name": "tabular"}]
    assert guard.visible(Grant("all"), entries) == entries
