"""Subcommands of the `qmf` console command, one module each.

Each module exposes ``register(subparsers)`` which adds its parser and sets
``func`` to a callable taking the parsed namespace and returning an exit code.
Modules keep their top-level imports light (no pyspark) so ``qmf --help`` is fast.
"""
