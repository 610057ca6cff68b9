"""Tenants and credentials: their rows (model) and events; the store folds them in SQL."""
