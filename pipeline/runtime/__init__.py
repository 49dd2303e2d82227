"""What runs our code in Spark: the JARs, the streaming loop, the jobs' entry, the task workers, the JVM's log, Arrow IPC between driver and tasks.

The session factory itself stays ``pipeline.spark.get_spark`` (the public entry).
"""
