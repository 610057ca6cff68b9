"""Shared code of the platform's services, agent and command line.

`cancellation.install()` (3.12's `asyncio.wait_for` on 3.11) is not run: installed for every
library, it let the agent's STARTs be acknowledged before their reports were on the stream
(docs/status.md, "Stopping within its bound").
"""
