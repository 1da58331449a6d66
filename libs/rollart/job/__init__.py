"""Jobs: job files (YAML) to protobuf specs, and ``rollart run`` (a local cluster training one job)."""
