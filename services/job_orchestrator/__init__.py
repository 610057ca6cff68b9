"""The job orchestrator: the dependency cascade of jobs (SPEC §7, seed 004)."""
