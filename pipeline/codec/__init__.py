"""Pure QMF codec: bytes in, typed records out. Never imports pyspark."""
