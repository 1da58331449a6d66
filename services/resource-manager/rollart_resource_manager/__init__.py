"""RollArt resource manager: the real-time view of pools, workers and bindings, kept in Redis."""
