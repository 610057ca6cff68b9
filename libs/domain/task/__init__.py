"""Tasks: what a user asks for (model), its events, the fold (evolve) and the commands (decide)."""
