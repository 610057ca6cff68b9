"""The scheduler's consumers, one module each: `dispatch` (task transitions → node
commands), `reports` (agent reports and registrations) and `wake` (events that wake the
placer). routes.py binds them to their subscriptions."""
