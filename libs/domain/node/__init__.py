"""Nodes: inventory and state (model), events, the fold and card watching (decide)."""
