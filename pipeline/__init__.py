"""QMF telemetry pipeline: codec, Spark source, Delta layer and jobs."""

__version__ = "0.1.0"


class SetupError(RuntimeError):
    """The machine lacks something a command needs (e.g. Java): ``qmf`` prints the
    message on one line and exits 2 instead of a traceback."""


def _child_logging() -> None:
    # In a Python process Spark started for ``qmf run`` (a data source reader with the
    # embedded receiver, a decode task), our warnings must reach the driver's terminal:
    # sparklog marks them so the driver copies them from the log file. No-op elsewhere.
    from pipeline.sparklog import child_logging

    child_logging()


_child_logging()
