"""The lake: what remains of our own Delta code, in one place, behind public functions.

``delta``: the jobs' writes (files their tasks write from Arrow, merges of small state
tables) and the driver's reads; ``transaction``: every commit, and table creation and
evolution, through delta-spark's own transaction; ``maintain``: Delta's DELETE (rows past
their retention, ``retention``'s keeps), OPTIMIZE and VACUUM, safe beside the streams; ``files``: a streaming micro-batch's files (Delta's
own source planned them), read with pyarrow where the row work runs (docs/DESIGN.md,
"Delta commits", "Reading Delta in the jobs").
"""
