"""Spark jobs, thin over the ``pipeline`` library; each runs under spark-submit."""
