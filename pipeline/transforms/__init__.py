"""DataFrame -> DataFrame transforms, one module per layer (pure: no I/O, no sinks)."""
