"""What people read without a Spark job: the live view and its tails (``qmf top``, ``qmf serve-metrics``), the run's progress and summary, the notebooks' helpers."""
