"""Tenants and credentials: their events (the projection lives in libs/store)."""
