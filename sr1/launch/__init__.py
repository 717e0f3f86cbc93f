"""Starting processes: the supervisor, a local Redis, the pools (local processes or Ray actors)."""
