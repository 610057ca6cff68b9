"""Task groups: shapes and state (model), events, the fold, and the controllers' decisions."""
