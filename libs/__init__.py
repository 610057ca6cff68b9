"""Shared code of the platform's services, agent and command line.

Importing it makes `asyncio.wait_for` keep cancellations on Python 3.11 (cancellation.py):
every process of the platform imports `libs` before it waits on anything.
"""

from . import cancellation

cancellation.install()
