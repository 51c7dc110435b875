"""The pure reclocking engine: frontiers, remap, reclocked, resumption, CDC v2. No Airflow or Spark here."""
from .frontier import Antichain, Frontier, FrontierError, Partition
from .reclocked import Reclocked, Update, as_of, compact_updates, reclock
from .remap import Binding, Increment, ProgressRow, Range, Remap, RemapError
from .resumption import offset_resumption_frontier, timestamp_resumption_frontier

__all__ = [
    "Antichain", "Binding", "Frontier", "FrontierError", "Increment", "Partition", "ProgressRow", "Range",
    "Reclocked", "Remap", "RemapError", "Update", "as_of", "compact_updates",
    "offset_resumption_frontier", "reclock", "timestamp_resumption_frontier",
]
