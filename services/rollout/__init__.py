"""The rollout service: the leader-only controller of rolling updates (docs/rollout.md)."""
