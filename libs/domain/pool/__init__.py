"""Resource pools and queues: specs (model), events, the folds and the entry rules."""
