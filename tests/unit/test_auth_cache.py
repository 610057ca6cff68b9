"""The gateway's credential cache: hits within the TTL, misses after it, bounded, off at 0."""

from __future__ import annotations

from libs.auth import CredentialCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_entry_lives_for_the_ttl_and_no_longer() -> None:
    clock = Clock()
    cache = CredentialCache(5.0, clock=clock)
    cache.put("k", "principal")
    clock.now += 4.9
    assert cache.get("k") == "principal"
    clock.now += 0.1
    assert cache.get("k") is None
    assert cache.get("k") is None  # the expired entry is gone, not revived


def test_ttl_zero_caches_nothing() -> None:
    cache = CredentialCache(0)
    cache.put("k", "principal")
    assert cache.get("k") is None


def test_bounded_by_dropping_the_oldest() -> None:
    cache = CredentialCache(60.0, max_entries=3)
    for key in "abcd":
        cache.put(key, key.upper())
    assert cache.get("a") is None
    assert [cache.get(k) for k in "bcd"] == ["B", "C", "D"]
