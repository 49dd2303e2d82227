"""Every table schema of the pipeline, defined once (as Arrow schemas)."""
