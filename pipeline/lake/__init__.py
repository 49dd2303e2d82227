"""The lake: what remains of our own Delta code, in one place.

``transaction``: commits of the files the jobs' tasks write, through
delta-spark's own transaction (docs/DESIGN.md, "Delta through delta-spark").
"""
