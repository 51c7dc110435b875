"""The composition root of a process: one :class:`Runtime`, built once from the parsed sources file.

Contract:

* A process parses its sources file once (:meth:`Runtime.load`); every step, command and page of the
  process is handed that runtime (``step(name, runtime)``) and takes what it needs from it: the
  :class:`~reclock.config.Config`, the :class:`~reclock.storage.Warehouse`, a source opened for the step
  (:meth:`Runtime.source`: its adapter, its tables), and a Spark session.
* Spark is lazy: :meth:`Runtime.spark` starts (or connects to) the configured session on first use, and a
  source's tables ask for it only when a write needs it (creating a missing table, a Spark write).  A step
  that does not need Spark (status, the progress page, an idle tick, a publish without dead letters)
  neither starts a JVM nor connects to a server, nor imports pyspark.
* The environment's overrides of the file (``RECLOCK_CONFIG``, ``RECLOCK_WAREHOUSE``,
  ``RECLOCK_SPARK_MASTER``, ``RECLOCK_SPARK_REMOTE``) are read when the file is parsed, in
  :func:`reclock.config.load_config`, and nowhere else.

A ``where`` of :meth:`Runtime.of` may be a runtime (used as it is) or a path (parsed now): a caller that holds
neither a runtime nor a path gets the default file's.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Union

from .config import Config, SourceConfig, load_config
from .connections import resolved_options
from .engine import Frontier
from .offsets import offset_type_of
from .sources import build_source, source_class, source_options
from .sources.base import Source
from .sources.epoch import in_epoch
from .storage import SourceTables, Warehouse


class Runtime:
    """What a process's steps share: the parsed config, the warehouse, and (lazily) one Spark session."""

    def __init__(self, config: Config, spark: Any = None):
        """``spark``: a session to use instead of the configured one (a Spark job's, a test's)."""
        self.config = config
        self._spark = spark
        self._warehouse: Warehouse | None = None

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, spark: Any = None) -> "Runtime":
        """Parse the sources file at ``path`` (default ``$RECLOCK_CONFIG``, else the bundled one)."""
        return cls(load_config(path), spark)

    @classmethod
    def of(cls, where: "Where" = None, spark: Any = None) -> "Runtime":
        """``where`` itself when it is a runtime (with ``spark`` as its session, if given), else the runtime of
        the sources file at ``where``."""
        if isinstance(where, Runtime):
            return where if spark is None or spark is where._spark else where.with_spark(spark)
        return cls.load(where, spark)

    def with_spark(self, spark: Any) -> "Runtime":
        """This runtime (same config, same warehouse) using ``spark`` as its session."""
        other = Runtime(self.config, spark)
        other._warehouse = self._warehouse
        return other

    @property
    def warehouse(self) -> Warehouse:
        if self._warehouse is None:
            self._warehouse = Warehouse(self.config.warehouse, self.config.storage_options)
        return self._warehouse

    @property
    def spark_started(self) -> bool:
        """Whether this runtime holds a Spark session (given, or started by :meth:`spark`)."""
        return self._spark is not None

    def spark(self, app_name: str = "reclock"):
        """The process's Spark session: the one given, else the configured one, started (or connected to, for a
        Spark Connect ``spark.remote``) on first use, named ``app_name``."""
        if self._spark is None:
            from .spark.session import get_spark

            config = self.config
            self._spark = get_spark(config.spark_master, app_name, s3=config.warehouse.startswith("s3"),
                                    conf=config.spark_conf, remote=config.spark_remote)
        return self._spark

    @contextmanager
    def source(self, name: str, connect: bool = True, create: bool = False) -> Iterator["SourceContext"]:
        """Source ``name`` opened for one step: its adapter and its tables.

        ``connect=False`` (reading what is published): when the source's class declares its schema,
        ``ctx.upstream`` is that class, good for ``partition_type``, ``data_schema``, ``offset_type`` and
        ``content_columns`` only, and nothing upstream is contacted (or created, like a slot).  A connected source
        is closed when the block ends, and seen in its gauge (``ctx.source``): after a new epoch, shifted by the
        epoch's offset base.  ``create``: a step that writes creates the source's tables when missing (delta-rs,
        no Spark); the others only check the schemas of those that exist.
        """
        source_config = self.config.source(name)
        upstream = None if connect else source_class(source_config.kind)
        connected = upstream is None
        options = None
        if connected:
            options = resolved_options(source_config)  # the Airflow connection it names, if any, read now
            if "state_url" in (source_options(source_config.kind) or {}) and not options.get("state_url"):
                options["state_url"] = f"{self.warehouse.source_uri(name)}/state"  # a source keeping its own state
            upstream = build_source({"kind": source_config.kind, **options})
        try:
            tables = self.warehouse.source(name, upstream.partition_type, upstream.data_schema,
                                           offset_type_of(upstream), spark=lambda: self.spark(f"reclock-{name}"),
                                           create=create)
            record = tables.upstream_record() if connected else None
            yield SourceContext(self, source_config, upstream, tables, record.base if record else Frontier(), options,
                                record.retired if record else Frontier())
        finally:
            if connected:
                upstream.close()


#: Where a runtime comes from: itself, or the path of a sources file (None: the default file).
Where = Union[Runtime, str, os.PathLike, None]


@dataclass
class SourceContext:
    """A source opened for one step (:meth:`Runtime.source`)."""

    runtime: Runtime
    config: SourceConfig
    upstream: Source  # as built from the config, in its own offsets
    tables: SourceTables
    base: Frontier = Frontier()  # the current epoch's offset base (reclock.engine.upstream)
    #: The options the upstream was built from: the file's, with what its Airflow connection gives
    #: (reclock.connections); they may hold credentials, so never log them.
    options: dict | None = field(default=None, repr=False)
    retired: Frontier = Frontier()  # the partitions compaction retired (reclock.engine.upstream), hidden upstream

    @property
    def spark(self):
        """The runtime's Spark session (started now if it was not)."""
        return self.runtime.spark(f"reclock-{self.config.name}")

    @property
    def source(self) -> Source:
        """The upstream in the source's gauge: its offsets shifted by the epoch's offset base, if any, its retired
        partitions hidden."""
        return in_epoch(self.upstream, self.base, self.retired)

    @property
    def spec(self) -> dict:
        """How Spark workers rebuild the source."""
        return {"kind": self.config.kind, **(self.config.options if self.options is None else self.options)}


@contextmanager
def open_source(name: str, where: Where = None, connect: bool = True, spark: Any = None) -> Iterator[SourceContext]:
    """:meth:`Runtime.source` of ``Runtime.of(where, spark)``; ``spark`` given (a session, or True for the
    configured one): the tables are created when missing."""
    runtime = Runtime.of(where, None if spark is True else spark)
    with runtime.source(name, connect=connect, create=spark is not None) as ctx:
        yield ctx
