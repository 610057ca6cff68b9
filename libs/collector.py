"""The cyclic garbage collector, set for a long-running service.

CPython starts a young-generation collection after every 700 net allocations of tracked
objects, and a full one after ten of the middle generation (when a quarter of the old heap is
new). A control-plane process allocates tens of thousands of short-lived objects a second
(events, rows, bus messages, the planner's candidates) while it holds a large, long-lived heap
(the cluster view: ~37 MiB at 10,000 nodes; the modules, the app, its models): each
collection walks what it holds with the event loop stopped. Measured (docs/benchmarks.md,
"The collector in the control plane"): committed placements 10-20 % faster at 1,000 and
10,000 nodes with a young generation of 10,000 instead of 700, for ~20 MiB more RSS at
10,000 nodes (what cyclic garbage waits a little longer; reference counting frees the rest
at once, as before). `freeze` moves what start-up allocated out of the collector's reach for good
(`gc.freeze`); it lives as long as the process.
"""

from __future__ import annotations

import gc

PYTHON_DEFAULT = 700  # CPython's own first threshold (3.11, 3.12)
SERVICE_DEFAULT = 10_000


def tune(threshold: int) -> None:
    """Collect the young generation after `threshold` net allocations (0: Python's own)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(threshold or PYTHON_DEFAULT, middle, old)


def freeze() -> None:
    """Collect once, then keep everything alive now out of every later collection."""
    gc.collect()
    gc.freeze()
