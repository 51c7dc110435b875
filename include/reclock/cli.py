"""``reclock`` command line: run pipeline steps, show status, query AS OF a time, backfill a window.

Every error is one line ``reclock: error: ...`` on stderr and exit status 2, no traceback: a bad
argument (a time that is not ms since the epoch, an ISO datetime or ``latest``; one outside
:data:`INTO_TIMES`; a ``--limit`` outside ``[0, 2**31)``; an unknown source name, checked before
any work starts) as much as a refusal of the work itself.  A sources file with several problems
gives one such line each.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import datetime, timezone

from . import epochs, pipeline
from .config import config_schema_text
from .query import QueryError, common_readable, duckdb_as_of, query_as_of
from .runtime import Runtime
from .secrets import redact
from .status import status

STEP_COMMANDS = (*pipeline.STEPS, "run")  # a step of a source, or all of them in order
#: The IntoTimes a command accepts: from the epoch to the last ms of year 9999 (what an ISO datetime can name).
INTO_TIMES = range(0, int(datetime(9999, 12, 31, 23, 59, 59, 999000, timezone.utc).timestamp() * 1000) + 1)
MAX_LIMIT = 2**31 - 1  # Spark's show() takes a Java int


class _Parser(argparse.ArgumentParser):
    """A usage error is one line, like every other error."""

    def error(self, message: str):
        self.exit(2, f"reclock: error: {message} (see {self.prog} --help)\n")


def into_time(text: str) -> int:
    """IntoTime from milliseconds since the epoch or an ISO-8601 datetime (UTC if no zone), in :data:`INTO_TIMES`."""
    try:
        if text.lstrip("-").isdigit():
            t = int(text)
        else:
            moment = datetime.fromisoformat(text)
            t = int((moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither milliseconds since the epoch nor an ISO datetime "
                                         f"(nor 'latest' where that is allowed)") from None
    if t not in INTO_TIMES:
        raise argparse.ArgumentTypeError(f"{text} is out of range: IntoTimes are ms from 0 (1970-01-01T00:00:00Z) "
                                         f"to {INTO_TIMES[-1]} (9999-12-31T23:59:59.999Z)")
    return t


def time_or_latest(text: str) -> int | str:
    return text if text == "latest" else into_time(text)


def limit(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to {MAX_LIMIT}, got {text!r}")
    return n


def parse_time(t: int | str, names: list[str], runtime: Runtime) -> int:
    """An :func:`into_time`, or for ``latest`` the last IntoTime readable for all of ``names``."""
    if t != "latest":
        return t
    since, upper = common_readable(names, runtime)
    if upper <= since:
        raise QueryError(f"no time is readable for all of {', '.join(names)} yet")
    return upper - 1


def _check_names(args: argparse.Namespace, config) -> None:
    """Refuse unknown source names before any work starts (ConfigError names the known ones)."""
    for name in ([args.source] if isinstance(getattr(args, "source", None), str) else getattr(args, "source", None)
                 or []):
        config.source(name)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="reclock", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="sources config (default: $RECLOCK_CONFIG or include/sources.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)
    for step in STEP_COMMANDS:
        sub.add_parser(step, help=f"run the {step} step for a source").add_argument("source")
    sub.add_parser("accept-lost", help="go on without records the upstream released before they were read "
                   "(retention): record the gap with remap").add_argument("source")
    e = sub.add_parser("new-epoch", help="start the source over on a replaced upstream (a recreated topic; for "
                       "Postgres a fresh snapshot, after a lost slot) as a new epoch, keeping what was published")
    e.add_argument("source")
    e.add_argument("--drop-slot", action="store_true", help="Postgres: replace a replication slot that still exists "
                   "(e.g. after a schema change the source cannot follow)")
    sub.add_parser("status", help="frontiers, uppers and lag of every source")
    sub.add_parser("config-schema", help="print the JSON schema of the sources file (docs/sources.schema.json), "
                   "for editors")
    q = sub.add_parser("query", help="query sources AS OF one IntoTime")
    q.add_argument("--as-of", required=True, type=time_or_latest, help="ms since epoch, ISO datetime, or 'latest'")
    q.add_argument("--sql", help="SQL over the sources' views, DuckDB's or Spark's after --engine (default: SELECT * "
                   "FROM the first source)")
    q.add_argument("--engine", choices=("auto", "duckdb", "spark"), default="auto",
                   help="duckdb: no JVM, the published tables read through delta-rs; spark: a Spark session (the "
                   "sources file's); auto (default): duckdb")
    q.add_argument("--source", action="append", help="source(s) to expose (default: all configured)")
    q.add_argument("--limit", type=limit, default=50, help="rows to show (default 50)")
    k = sub.add_parser("sink-cdcv2", help="write a source's reclocked collection as CDC v2 (new intervals only)")
    k.add_argument("source")
    k.add_argument("--to", required=True, help="kafka://host:port/topic or a directory URL (file:///dir, s3://...)")
    x = sub.add_parser("transactions", help="publish the complete Debezium transactions of a 'transactions' entry")
    x.add_argument("name")
    b = sub.add_parser("backfill", help="replay published IntoTimes [--from, --to] from remap and the upstream "
                       "and compare them with the published rows (--repair: rewrite them if they differ)")
    b.add_argument("source")
    b.add_argument("--from", dest="start", required=True, type=into_time,
                   help="first IntoTime: ms since epoch or ISO datetime")
    b.add_argument("--to", dest="end", required=True, type=into_time,
                   help="last IntoTime (inclusive): ms since epoch or ISO datetime")
    b.add_argument("--repair", action="store_true", help="replace the window's published rows by the replay")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.command == "config-schema":
        sys.stdout.write(config_schema_text())
        return 0
    try:
        runtime = Runtime.load(args.config)  # the one parse of the sources file in this process
        _check_names(args, runtime.config)
        if args.command in STEP_COMMANDS:
            if args.command == "run":
                done = pipeline.run_once(args.source, runtime)
            else:  # one step, with its point after it (reclock.points)
                done = pipeline.run_once(args.source, runtime, steps=(args.command,))[args.command]
            print(json.dumps(done, indent=2, default=str))
        elif args.command == "accept-lost":
            print(json.dumps(epochs.accept_lost(args.source, runtime), indent=2))
        elif args.command == "new-epoch":
            print(json.dumps(epochs.new_epoch(args.source, runtime, drop_slot=args.drop_slot), indent=2))
        elif args.command == "sink-cdcv2":
            from .sinks import sink_cdcv2
            print(json.dumps(sink_cdcv2(args.source, args.to, runtime), indent=2))
        elif args.command == "transactions":
            from .transactions import publish_transactions
            txn = runtime.config.transaction(args.name)
            print(json.dumps(publish_transactions(txn.name, txn.data_source, txn.tx_source, runtime), indent=2))
        elif args.command == "backfill":
            from .backfill import replay
            start, end = args.start, args.end
            mode = "repair" if args.repair else "verify"
            print(json.dumps(replay(args.source, runtime, start, end, mode=mode), indent=2))
        elif args.command == "status":
            print(json.dumps(status(runtime), indent=2))
        else:
            names = args.source or list(runtime.config.sources)
            t = parse_time(args.as_of, names, runtime)
            sql = args.sql or f"SELECT * FROM {names[0]}"
            engine = args.engine
            if engine == "auto":
                engine = "duckdb"
            if engine == "duckdb":
                con, _ = duckdb_as_of(t, names, runtime)
                print(f"AS OF {t} ({datetime.fromtimestamp(t / 1000, timezone.utc).isoformat()})")
                import duckdb

                try:
                    con.sql(sql).limit(args.limit).show(max_rows=args.limit, max_width=10_000)
                except duckdb.Error as e:
                    raise QueryError(f"the query failed in DuckDB: {str(e).splitlines()[0]} (Spark SQL: --engine "
                                     "spark)") from e
                return 0
            spark = runtime.spark("reclock-query")
            print(f"AS OF {t} ({datetime.fromtimestamp(t / 1000, timezone.utc).isoformat()})")
            query_as_of(spark, sql, t, names, runtime).show(args.limit, truncate=False)
    except (QueryError, ValueError, RuntimeError) as e:
        for line in getattr(e, "problems", None) or [str(e)]:
            print(f"reclock: error: {redact(str(line))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
