"""RollArt relay: receives each delta from the trainer or an upstream relay and forwards every segment to
its subscribers the moment it arrives; caches recent deltas on disk; propagates Commit(v)."""
