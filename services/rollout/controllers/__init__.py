"""The rollout service's leader-only loop: the rollout controller (rollout.py)."""
