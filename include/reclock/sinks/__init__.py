"""Sinks: write a source's reclocked collection out of the warehouse for other systems."""
from .cdcv2 import SinkError, sink_cdcv2, write_cdcv2

__all__ = ["SinkError", "sink_cdcv2", "write_cdcv2"]
