"""Rolling updates: the request and state (model), events, the fold and the plan."""
