"""A node's kept universe hashes (cels.node.hash_cache): a re-run's calls answered from the
first run's, byte for byte, without the curve or group operations; a cut entry ends the file."""

from __future__ import annotations

import stat

import pytest

from cels.crypto.commutative_cipher import PohligHellmanHash
from cels.crypto.ec_hash import X25519Hash
from cels.crypto.groups import group_for_bits
from cels.engine.routines import id_width
from cels.node.hash_cache import HashCache, cached


def ciphers():
    yield X25519Hash(bytes(range(32)))
    yield PohligHellmanHash.from_exponent(group_for_bits(1024, allow_paper_bits=True), (65537).to_bytes(3, "big"))


@pytest.mark.parametrize("plain", list(ciphers()), ids=["x25519", "pohlig-hellman"])
def test_a_re_run_reads_the_first_runs_hashes(tmp_path, plain) -> None:
    path, key = tmp_path / "s.hashes", b"k" * 32
    first = cached(plain, HashCache(path, key))
    assert type(first).__mro__[2] is type(plain) and id_width(first) == id_width(plain)
    ids = [f"query-{i}\turl-{i}".encode() for i in range(50)]
    hashed = first.hash(ids)
    layered = first.apply(hashed[:10])
    assert hashed == plain.hash(ids) and layered == plain.apply(hashed[:10])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    calls = []

    class Counting(type(plain)):
        def hash(self, items):
            calls.append("hash")
            return plain.hash(items)

        def apply(self, items):
            calls.append("apply")
            return plain.apply(items)

    counting = Counting.__new__(Counting)
    again = cached(plain, HashCache(path, key))
    again._plain = counting
    assert again.hash(ids) == hashed and again.apply(hashed[:10]) == layered and calls == []
    assert again.apply(hashed[10:12]) == plain.apply(hashed[10:12]) and calls == ["apply"]  # not kept: computed
    other_key = cached(plain, HashCache(path, b"x" * 32))
    other_key._plain = counting
    other_key.hash(ids[:1])
    assert calls == ["apply", "hash"]  # another session's key reads nothing of this one's


def test_an_entry_cut_by_the_nodes_death_ends_the_file(tmp_path) -> None:
    path, key, plain = tmp_path / "s.hashes", b"k" * 32, X25519Hash(bytes(range(32)))
    cache = HashCache(path, key)
    cached(plain, cache).hash([b"a", b"b"])
    cached(plain, cache).hash([b"c"])
    whole = path.read_bytes()
    path.write_bytes(whole[:-5])
    assert len(HashCache(path, key).known) == 1


def test_the_unions_layers_are_kept_too(tmp_path) -> None:
    """The secure union's key (its layers on the released records) reads back as the universe's."""
    from cels.crypto.commutative_cipher import PohligHellman, encode_record

    group = group_for_bits(1024, allow_paper_bits=True)
    plain = PohligHellman.from_exponent(group, (65537).to_bytes(3, "big"))
    first = cached(plain, HashCache(tmp_path / "s.hashes", b"k" * 32))
    records = [encode_record(group, f"record {i}".encode(), 2) for i in range(5)]
    layered = [first.encrypt_record(r) for r in records]
    assert layered == [plain.encrypt_record(r) for r in records]
    assert [first.decrypt_record(r) for r in layered] == records
    again = cached(plain, HashCache(tmp_path / "s.hashes", b"k" * 32))
    again._plain = None  # a call not read back would fail
    assert [again.encrypt_record(r) for r in records] == layered and [again.decrypt_record(r) for r in layered] == records


def test_a_call_is_answered_only_by_the_same_call(tmp_path) -> None:
    """The MAC is injective in (kind, inputs): split differently, or of another kind, it is another call."""
    cache = HashCache(tmp_path / "s.hashes", b"k" * 32)
    calls = [("hash", [b"ab", b"cd"]), ("hash", [b"abcd"]), ("hash", [b"abc", b"d"]), ("hash", [b"a", b"bcd"]), ("apply", [b"ab", b"cd"]), ("hash", [])]
    answers = [cache.answer(kind, inputs, lambda items, n=n: [bytes([n])] * len(items)) for n, (kind, inputs) in enumerate(calls)]
    assert cache.misses == len(calls) and cache.hits == 0
    reopened = HashCache(tmp_path / "s.hashes", b"k" * 32)  # a re-run's
    again = [reopened.answer(kind, inputs, lambda items: pytest.fail("computed again")) for kind, inputs in calls]
    assert again == answers and reopened.hits == len(calls)
