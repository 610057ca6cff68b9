"""Jobs: the DAG (spec, model), events, the fold and the cascade (decide)."""
