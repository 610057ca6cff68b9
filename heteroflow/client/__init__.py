"""The HeteroFlow Python client: `from heteroflow.client import Client`.

`Client` (blocking) and `AsyncClient` (asyncio) speak the gateway's `/api/v1`: tasks, task
groups (scale, autoscale, window, rollout, serving), jobs, queues, pools, timelines, logs
(followed as they come), nodes and tenants. Request bodies may be the domain's own pydantic
models (`TaskSpec`, `GroupSpec`, `JobSpec`, `QueueSpec`, `PoolSpec`) or plain mappings.
Refusals raise `ApiError` with the API's `code` and `fields`. See docs/client.md.
"""

from .clients import AsyncClient, Client
from .core import ApiError, SseEvent, Unreachable
from .credentials import CredentialsError, Target, resolve_target

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "CredentialsError",
    "SseEvent",
    "Target",
    "Unreachable",
    "resolve_target",
]
