"""RollArt reward service: stateless scorers behind an elastic worker pool."""
