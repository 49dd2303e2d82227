"""What every notebook in ``notebooks/`` needs: where the tables are, how to read them,
a SparkSession, and where figures go.

Notebooks read the folder ``qmf run --data DATA`` wrote (``QMF_DATA``, default
``data``): ``DATA/bronze``, ``DATA/silver/<table>``, ``DATA/gold/<table>``.
Plain reads go through polars' native Delta reader, which lists the table's
files with delta-rs and reads them itself; ``DeltaTable.to_pandas`` and
``to_pyarrow_table``/``to_pyarrow_dataset`` are avoided because they can
abort the process at exit (docs: spark-delta-notes pitfall 7). Spark reads go
through ``pipeline.delta.read_table`` with the project's session.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.live import last_index_value

if TYPE_CHECKING:
    import polars as pl
    from matplotlib.figure import Figure
    from pyspark.sql import DataFrame, SparkSession

DATA_ENV = "QMF_DATA"
OUT_ENV = "QMF_NOTEBOOK_OUT"
LAYERS = ("bronze", "silver", "gold")


def data_root() -> Path:
    """The ``qmf run --data`` folder the notebook reads."""
    return Path(os.environ.get(DATA_ENV, "data"))


def table_path(layer: str, name: str | None = None) -> Path:
    """``DATA/bronze`` or ``DATA/<silver|gold>/<name>``."""
    if layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r}; one of {LAYERS}")
    if layer == "bronze":
        return data_root() / "bronze"
    if not name:
        raise ValueError(f"a {layer} table needs a name")
    return data_root() / layer / name


def read_polars(layer: str, name: str | None = None) -> pl.DataFrame:
    """The whole table as a polars DataFrame (an empty table gives its columns, no rows)."""
    import polars as pl

    from pipeline import delta

    path = table_path(layer, name)
    if not delta.table_exists(path):
        raise FileNotFoundError(
            f"no Delta table at {path}: is {DATA_ENV} the qmf run --data folder?"
        )
    return pl.read_delta(str(path))



def object_name(alias: str = "name") -> pl.Expr:
    """Polars expression: the object's name from ``index_key``, else its ``object_id``."""
    import polars as pl

    from_key = pl.col("index_key").map_elements(last_index_value, return_dtype=pl.String)
    return pl.coalesce(from_key, pl.col("object_id")).alias(alias)


def spark_session(app_name: str = "qmf-notebook") -> SparkSession:
    """The running SparkSession if there is one (a test's, a pyspark shell's), else a new
    one with the project's settings (``pipeline.spark.get_spark``)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    from pipeline.spark import get_spark

    return get_spark(app_name)


def read_spark(spark: SparkSession, layer: str, name: str | None = None) -> DataFrame:
    """The table as a Spark DataFrame (``pipeline.delta.read_table``)."""
    from pipeline import delta

    return delta.read_table(spark, table_path(layer, name))


def headless() -> bool:
    """No display and no notebook kernel: figures can only be saved."""
    in_kernel = "ipykernel" in sys.modules
    return not in_kernel and not os.environ.get("DISPLAY") and not os.environ.get("MPLBACKEND")


def use_headless_backend() -> None:
    """Switch matplotlib to Agg when nothing could show a window (CI, a test)."""
    if headless():
        import matplotlib

        matplotlib.use("Agg")


def out_dir() -> Path | None:
    """Where figures are saved (``QMF_NOTEBOOK_OUT``); None: not saved."""
    out = os.environ.get(OUT_ENV)
    return Path(out) if out else None


def save_figure(fig: Figure, name: str) -> Path | None:
    """Save ``fig`` as ``<QMF_NOTEBOOK_OUT>/<name>.png`` when that is set."""
    out = out_dir()
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path
