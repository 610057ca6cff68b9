"""The job orchestrator's settings: the common ones (it reads none of its own yet)."""

from __future__ import annotations

from libs.config import CommonSettings


class OrchestratorSettings(CommonSettings):
    """`heteroflow service job-orchestrator`: database, bus and logging, as every service."""
