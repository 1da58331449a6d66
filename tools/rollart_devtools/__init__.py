"""RollArt developer tooling: model building and warm starts for tests, examples and `rollart run`, and the
vLLM engine probe. Run as ``rollart-devtools <command>``; no service imports this package (checked by
tests/unit/test_boundaries.py): services receive a model path."""
