"""The HeteroFlow Python client: `from heteroflow.client import Client`.

`Client` (blocking) and `AsyncClient` (asyncio) speak the gateway's `/api/v1`; request bodies
may be the domain's own pydantic models (`TaskSpec`, `GroupSpec`, `JobSpec`, `QueueSpec`,
`PoolSpec`) or plain mappings. Refusals raise `ApiError` with the API's `code` and `fields`.
See docs/client.md.
"""

from .clients import AsyncClient, Client
from .core import ApiError, Unreachable

__all__ = ["ApiError", "AsyncClient", "Client", "Unreachable"]
