"""QMF telemetry pipeline: codec, Spark source, Delta layer and jobs."""

__version__ = "0.1.0"


class SetupError(RuntimeError):
    """The machine lacks something a command needs (e.g. Java): ``qmf`` prints the
    message on one line and exits 2 instead of a traceback."""
