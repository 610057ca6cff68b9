"""Workload files (`heteroflow apply -f`): their loading with line numbers (`load`), what
each kind means to the API (`kinds`) and their JSON Schema (`schema`). docs/cli.md#files."""
