"""The lake: what remains of our own Delta code, in one place, behind public functions.

``delta``: the jobs' writes (files their tasks write from Arrow, merges of small state
tables) and the driver's reads; ``transaction``: every commit, and table creation and
evolution, through delta-spark's own transaction; ``maintain``: Delta's OPTIMIZE and
VACUUM, safe beside the streams; ``delta_source``: the ``qmf-delta`` stream of a table's
appends (docs/DESIGN.md, "Delta commits").
"""
