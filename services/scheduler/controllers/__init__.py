"""The scheduler's leader-only loops, one module each, on the controller runtime
(libs/controller.py): `placement` (rounds, with `lending` for its loans), `node_monitor`
(liveness, with `confirm` for the stops it waits on) and `groups` (group status and
self-heal). Each writes through its term's `FencedWriter` (`term.writer`)."""
