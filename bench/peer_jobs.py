"""Job functions the peer benchmarks enqueue by import path (RQ needs an importable one)."""


def noop(i: int) -> None:
    """Do nothing: the benchmark measures the queue, not the work."""
