"""QMF telemetry pipeline: codec, Spark source, Delta layer and jobs."""

__version__ = "0.1.0"
