"""A draining replica gets no new request, even when it is the least loaded."""

from __future__ import annotations

from libs.domain.group.serving import Replica, pick


def test_pick_skips_draining_replicas() -> None:
    old = Replica("old", "a:1", ready=True, draining=True)
    new = Replica("new", "b:1", ready=True, outstanding=5)
    assert pick([old, new]) is new
    assert pick([old]) is None
