"""The wall clock IntoTimes are read from."""
import time


def now_ms() -> int:
    """Milliseconds since the Unix epoch: the IntoTime of now."""
    return time.time_ns() // 1_000_000
