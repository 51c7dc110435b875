"""The progress page as pure functions: the data of :func:`reclock.progress.collect` -> HTML with inline SVG.

Nothing here reads storage, the clock or the network, so every function is testable
with fabricated data.  The page is self-contained (inline CSS, inline SVG, no script,
no external asset) and every name that comes from the config, the upstream or a check
report is escaped.  The last check links to its Great Expectations Data Docs pages (which the Airflow plugin
serves at ``gx/<source>/...`` beside the page).

The chart of a source plots each partition's upper (offset, byte offset or LSN) against
IntoTime: ``Remap.progress()`` rows ``(into_time, partition, offset)``, drawn as a step
line (an upper holds until the next binding) with a point at every binding.
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from html import escape
from typing import Any, Hashable, Iterable, Mapping, Sequence
from urllib.parse import quote

from .engine.frontier import partition_sort_key

Point = tuple[int, int]  # (into_time ms, offset)

WIDTH, HEIGHT = 760, 280
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 84, 40, 14, 42
MAX_PARTITIONS = 12
MAX_POINTS = 400
REPORT_ORDER = ["remap", "reclocked", "dead_letter"]
#: Where the plugin serves each source's Great Expectations Data Docs, relative to the page.
DOCS_HREF = "gx"
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#7f7f7f", "#bcbd22", "#393b79", "#ad494a")
_TIME_STEPS = [s * 1000 for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
                                  21600, 43200, 86400, 2 * 86400, 7 * 86400, 14 * 86400, 30 * 86400)]


def h(value: Any) -> str:
    """HTML-escape anything (quotes too, so it is safe in attributes)."""
    return escape("" if value is None else str(value), quote=True)


# --- formatting -------------------------------------------------------------------------------


def fmt_time(ms: int | None) -> str:
    """IntoTime (ms since the epoch) as ``YYYY-MM-DD HH:MM:SS.mmm UTC``."""
    if ms is None:
        return "–"
    t = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d} UTC"


def fmt_duration(ms: int | None) -> str:
    """A duration in ms as ``850 ms``, ``12.5 s``, ``3 min 20 s``, ``2 h 5 min`` or ``3 d 4 h``."""
    if ms is None:
        return "–"
    sign, ms = ("-" if ms < 0 else ""), abs(int(ms))
    if ms < 1000:
        return f"{sign}{ms} ms"
    if ms < 60_000:
        return f"{sign}{ms / 1000:.1f} s"
    s = ms // 1000
    if s < 3600:
        return f"{sign}{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{sign}{s // 3600} h {s % 3600 // 60} min"
    return f"{sign}{s // 86400} d {s % 86400 // 3600} h"


def fmt_count(n: float | None) -> str:
    """An offset or count: ``12,345`` below ten million, else ``12.3M`` / ``4.56G`` / ``7.89T`` / ``4.96e55``."""
    if n is None:
        return "–"
    if abs(n) < 10_000_000:
        return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.2f}"
    if abs(n) >= 1e18:  # sparse gauges (Kinesis sequence numbers): 4.96e55
        return f"{float(n):.3g}".replace("e+", "e")
    for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:,.0f}"  # pragma: no cover


def partition_label(partition: Hashable, names: Mapping | None = None) -> str:
    """How a partition is named on the page (Postgres' single partition is the empty string; a files source's
    identity with the name of the file holding it, from ``names``)."""
    if partition == "":
        return "(single)"
    name = (names or {}).get(str(partition))
    return f"{name} ({partition})" if name else str(partition)


# --- the chart --------------------------------------------------------------------------------


def series(rows: Iterable[Sequence]) -> dict[Hashable, list[Point]]:
    """Progress rows ``(into_time, partition, offset)`` -> ``{partition: [(into_time, offset), ...]}``.

    Partitions in their natural order (ints numerically), points in IntoTime order.
    """
    out: dict[Hashable, list[Point]] = {}
    for into_time, partition, offset in rows:
        out.setdefault(partition, []).append((int(into_time), int(offset)))
    return {p: sorted(out[p]) for p in sorted(out, key=partition_sort_key)}


def downsample(points: Sequence[Point], max_points: int = MAX_POINTS) -> list[Point]:
    """At most ``max_points`` evenly spread points, always keeping the first and the last."""
    n = len(points)
    if n <= max_points or max_points < 2:
        return list(points)
    keep = sorted({round(i * (n - 1) / (max_points - 1)) for i in range(max_points)})
    return [points[i] for i in keep]


def nice_step(span: float, count: int) -> float:
    """A 1, 2 or 5 times a power of ten step that cuts ``span`` into about ``count`` parts."""
    if span <= 0:
        return 1.0
    raw = span / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def value_ticks(lo: float, hi: float, count: int = 5, min_step: float = 1) -> tuple[float, float, list[float]]:
    """A padded ``[lo, hi]`` on tick boundaries and its ticks (offsets: steps of at least 1)."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        lo, hi = lo - min_step, hi + min_step
    step = max(min_step, nice_step(hi - lo, count))
    lo, hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
    ticks = [lo + i * step for i in range(int(round((hi - lo) / step)) + 1)]
    return lo, hi, ticks


def time_ticks(t0: int, t1: int, count: int = 6) -> list[int]:
    """Round IntoTimes (ms) within ``[t0, t1]``: about ``count`` of them, on second/minute/hour/day steps."""
    span = max(1, t1 - t0)
    step = next((s for s in _TIME_STEPS if span / s <= count), None)
    if step is None:
        step = int(nice_step(span / 86_400_000, count) * 86_400_000)
    first = -(-t0 // step) * step
    return list(range(first, t1 + 1, step))


def fmt_tick_time(ms: int, span: int) -> str:
    t = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    if span < 120_000:
        return t.strftime("%H:%M:%S")
    if span < 2 * 86_400_000:
        return t.strftime("%H:%M")
    return t.strftime("%m-%d %H:%M")


class Scale:
    """Maps ``[t0, t1] x [lo, hi]`` onto the plot area of a ``width`` x ``height`` chart."""

    def __init__(self, t0: int, t1: int, lo: float, hi: float, width: int = WIDTH, height: int = HEIGHT):
        self.t0, self.t1, self.lo, self.hi = t0, t1, lo, hi
        self.left, self.right = MARGIN_LEFT, width - MARGIN_RIGHT
        self.top, self.bottom = MARGIN_TOP, height - MARGIN_BOTTOM

    def x(self, t: float) -> float:
        return self.left + (t - self.t0) / (self.t1 - self.t0) * (self.right - self.left)

    def y(self, v: float) -> float:
        return self.bottom - (v - self.lo) / (self.hi - self.lo) * (self.bottom - self.top)


def chart_domain(data: Mapping[Hashable, Sequence[Point]]) -> tuple[int, int, float, float, list[float]]:
    """IntoTime range (padded 1 s each side when there is a single binding) and the offset axis."""
    times = [t for points in data.values() for t, _ in points]
    offsets = [o for points in data.values() for _, o in points]
    t0, t1 = min(times), max(times)
    if t0 == t1:
        t0, t1 = t0 - 1000, t1 + 1000
    lo, hi, ticks = value_ticks(min(offsets), max(offsets))
    return t0, t1, lo, hi, ticks


def chart_svg(rows: Iterable[Sequence], label: str = "", width: int = WIDTH, height: int = HEIGHT,
              max_partitions: int = MAX_PARTITIONS, max_points: int = MAX_POINTS) -> str:
    """Inline SVG: every partition's upper against IntoTime (empty-state text when there is no binding)."""
    all_series = series(rows)
    title = f"Frontier over IntoTime{': ' + label if label else ''}"
    if not all_series:
        height = 60
    head = (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}" role="img" aria-label="{h(title)}"><title>{h(title)}</title>')
    if not all_series:
        return (head + f'<text class="empty" x="{width / 2:.0f}" y="{height / 2 + 5:.0f}" text-anchor="middle">'
                f'no bindings yet</text></svg>')
    shown = dict(list(all_series.items())[:max_partitions])
    t0, t1, lo, hi, ticks = chart_domain(shown)
    s = Scale(t0, t1, lo, hi, width, height)
    parts = [head, '<g class="axes">']
    for v in ticks:
        y = s.y(v)
        parts.append(f'<line class="grid" x1="{s.left}" y1="{y:.1f}" x2="{s.right}" y2="{y:.1f}"/>'
                     f'<text class="ytick" x="{s.left - 6}" y="{y + 4:.1f}" text-anchor="end">{h(fmt_count(v))}</text>')
    for t in time_ticks(t0, t1):
        x = s.x(t)
        parts.append(f'<line class="tick" x1="{x:.1f}" y1="{s.bottom}" x2="{x:.1f}" y2="{s.bottom + 5}"/>'
                     f'<text class="xtick" x="{x:.1f}" y="{s.bottom + 18}" text-anchor="middle">'
                     f'{h(fmt_tick_time(t, t1 - t0))}</text>')
    parts.append(f'<line class="axis" x1="{s.left}" y1="{s.bottom}" x2="{s.right}" y2="{s.bottom}"/>'
                 f'<line class="axis" x1="{s.left}" y1="{s.top}" x2="{s.left}" y2="{s.bottom}"/>'
                 f'<text class="caption" x="{(s.left + s.right) / 2:.0f}" y="{height - 6}" text-anchor="middle">'
                 f'IntoTime (UTC)</text>'
                 f'<text class="caption" transform="translate(14 {(s.top + s.bottom) / 2:.0f}) rotate(-90)" '
                 f'text-anchor="middle">upper (offset)</text></g>')
    for i, (partition, points) in enumerate(shown.items()):
        color, name = PALETTE[i % len(PALETTE)], partition_label(partition)
        dash, dy = series_style(i)
        points = downsample(points, max_points)
        steps = [(s.x(points[0][0]), s.y(points[0][1]))]
        for (_, before), (t, o) in zip(points, points[1:]):
            steps += [(s.x(t), s.y(before)), (s.x(t), s.y(o))]
        parts.append(f'<g class="series" data-partition="{h(name)}" stroke="{color}" fill="{color}"'
                     + (f' transform="translate(0 {dy:.1f})"' if dy else "") + '>'
                     '<polyline class="step" fill="none"' + (f' stroke-dasharray="{dash}"' if dash else "")
                     + ' points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in steps) + '"/>')
        for t, o in points:
            parts.append(f'<circle class="point" cx="{s.x(t):.1f}" cy="{s.y(o):.1f}" r="2.5" '
                         f'data-t="{t}" data-offset="{o}"><title>{h(name)} @ {h(fmt_time(t))}: '
                         f'{h(fmt_count(o))}</title></circle>')
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


#: Dash patterns of the series, in turn; with :data:`SERIES_SHIFT_PX` per series (cycling over four) partitions
#: whose uppers coincide stay apart in the chart instead of the later line hiding the earlier.
DASHES = ("", "7 3", "2 3", "9 3 2 3")
SERIES_SHIFT_PX = 2.0


def series_style(i: int) -> tuple[str, float]:
    """``(stroke-dasharray, vertical shift in px)`` of the ``i``-th series."""
    return DASHES[i % len(DASHES)], -SERIES_SHIFT_PX * (i % 4)


def legend(rows: Iterable[Sequence], max_partitions: int = MAX_PARTITIONS, names: Mapping | None = None) -> str:
    drawn = list(series(rows))
    items = [f'<li><svg class="swatch" width="26" height="10" aria-hidden="true"><line x1="0" y1="5" x2="26" y2="5" '
             f'stroke="{PALETTE[i % len(PALETTE)]}" stroke-width="2.5"'
             + (f' stroke-dasharray="{series_style(i)[0]}"' if series_style(i)[0] else "") + '/></svg>'
             f'{h(partition_label(p, names))}</li>' for i, p in enumerate(drawn[:max_partitions])]
    if len(drawn) > max_partitions:
        items.append(f'<li class="more">+{len(drawn) - max_partitions} more partitions not drawn</li>')
    return f'<ul class="legend">{"".join(items)}</ul>' if items else ""


# --- a source ---------------------------------------------------------------------------------


def error_box(message: str, kind: str = "error") -> str:
    return f'<div class="error {h(kind)}" role="alert">{h(message)}</div>'


def check_badge(record: Mapping | None) -> str:
    if record is None:
        return '<span class="badge none">never checked</span>'
    return ('<span class="badge pass">checks passed</span>' if record.get("success")
            else '<span class="badge fail">checks failed</span>')


def docs_link(record: Mapping, page: str, text: str, docs_href: str = DOCS_HREF) -> str:
    """A link to ``page`` of the record's source's Great Expectations Data Docs (served by the plugin at
    ``<docs_href>/<source>/<page>``, relative to the progress page)."""
    href = f'{docs_href}/{quote(str(record.get("source", "")), safe="")}/{quote(page)}'
    return f'<a class="data-docs" href="{h(href)}">{h(text)}</a>'


def render_checks(record: Mapping | None, error: str | None = None, now: int | None = None) -> str:
    """The last check run: pass/fail, when, which window, and every check with its outcome; links to the run's
    Great Expectations Data Docs pages when it has them."""
    out = ['<div class="checks"><h3>Last check</h3>']
    if error:
        out.append(error_box(error, "check-log"))
    if record is None:
        if not error:
            out.append('<p class="muted">never checked</p>')
        return "".join(out) + "</div>"
    at = record.get("checked_at")
    age = f" ({h(fmt_duration(now - at))} ago)" if now is not None and at is not None else ""
    verdict = "PASS" if record.get("success") else "FAIL"
    window = record.get("window")
    if not window:
        batch = "; no staged batch"
    elif not window[0]:
        batch = f"; batch of IntoTimes up to {h(fmt_time(window[1]))}"
    else:
        batch = f"; batch of IntoTimes {h(fmt_time(window[0]))} … {h(fmt_time(window[1]))}"
    docs = f" · {docs_link(record, 'index.html', 'Data Docs')}" if record.get("data_docs") else ""
    out.append(f'<p class="verdict {verdict.lower()}"><strong class="check-result">{verdict}</strong> at '
               f'<span class="checked-at">{h(fmt_time(at))}</span>{age}{batch}{docs}</p>')
    reports = record.get("reports") or {}
    for kind in sorted(reports, key=lambda k: (REPORT_ORDER.index(k) if k in REPORT_ORDER else len(REPORT_ORDER), k)):
        report = reports[kind]
        ok = report.get("success")
        outcome = "passed" if ok else "failed: " + h(", ".join(report.get("failed") or []))
        out.append(f'<div class="report {"pass" if ok else "fail"}" data-report="{h(kind)}">'
                   f'<p class="summary"><strong>{h(kind)}</strong>: {h(report.get("subject", ""))}, '
                   f'{h(report.get("rows", "?"))} rows, {outcome}'
                   + "".join(f" · {docs_link(record, page, 'result')}" for page in report.get("docs") or ())
                   + "</p>")
        results = report.get("results")
        if results:
            out.append('<table class="results"><thead><tr><th>check</th><th>result</th><th>law</th>'
                       '<th>detail</th></tr></thead><tbody>')
            for r in results:
                passed = r.get("success")
                detail = ("" if r.get("observed") is None else r["observed"]) if passed else (
                    r.get("error") or f'{r.get("unexpected_count")} bad, e.g. {r.get("sample")}')
                out.append(f'<tr class="{"pass" if passed else "fail"}"><td>{h(r.get("name"))}</td>'
                           f'<td>{"PASS" if passed else "FAIL"}</td><td>{h(r.get("description"))}</td>'
                           f'<td>{h(detail)}</td></tr>')
            out.append("</tbody></table>")
        elif report.get("summary"):
            out.append(f'<pre class="summary-text">{h(report["summary"])}</pre>')
        out.append("</div>")
    return "".join(out) + "</div>"


def partition_table(src: Mapping) -> str:
    """Per partition: bound upper, upstream upper and the offsets not yet bound."""
    bound, upstream = src.get("bound_frontier") or {}, src.get("upstream_frontier")
    lag, known = src.get("lag_by_partition") or {}, src.get("partition_names") or {}
    names = sorted(set(bound) | set(upstream or {}), key=lambda p: (0, int(p), "") if p.isdigit() else (1, 0, p))
    if not names:
        return ""
    rows = "".join(
        f'<tr><td>{h(partition_label(p, known))}</td><td class="num">{h(fmt_count(bound.get(p, 0)))}</td>'
        f'<td class="num">{h(fmt_count(upstream.get(p, 0)) if upstream is not None else "?")}</td>'
        f'<td class="num">{h(fmt_count(lag.get(p, 0)) if upstream is not None else "?")}</td></tr>'
        for p in names[:50])
    more = (f'<tr><td colspan="4" class="muted">+{len(names) - 50} more partitions</td></tr>'
            if len(names) > 50 else "")
    return ('<table class="partitions"><thead><tr><th>partition</th><th>bound upper</th><th>upstream upper</th>'
            f'<th>not yet bound</th></tr></thead><tbody>{rows}{more}</tbody></table>')


def unreachable(src: Mapping) -> str:
    """``upstream unreachable since <time>`` (when this collection failed to reach it, if known)."""
    since = src.get("upstream_unreachable_since")
    return "upstream unreachable" + (f" since {fmt_time(since)}" if since is not None else "")


def _since(since: int | None) -> str:
    if since is None:
        return "–"
    return f"{since} (nothing compacted)" if since == 0 else f"{since} = {fmt_time(since)}"


def facts(src: Mapping, now: int | None = None) -> str:
    """since, uppers and lags as a definition list."""
    remap_upper, reclocked_upper = src.get("remap_upper"), src.get("reclocked_upper")
    last_bound = remap_upper - 1 if src.get("tables") and remap_upper else None
    age = f" ({fmt_duration(now - last_bound)} ago)" if now is not None and last_bound is not None else ""
    if src.get("upstream_frontier") is not None:
        lag_offsets = f"{fmt_count(src.get('lag_offsets'))} offsets"
        if (by := src.get("upstream_measured_by")) is not None:
            at = src.get("upstream_measured_at")
            ago = f", {fmt_duration(now - at)} ago" if now is not None and at is not None else ""
            lag_offsets += f" (upstream upper as the {by} step measured it at {fmt_time(at)}{ago})"
        if src.get("upstream_error"):
            lag_offsets += f"; {unreachable(src)}"
    else:
        lag_offsets = (f"unknown ({unreachable(src)})" if src.get("upstream_error")
                       else "not measured yet (the first tick measures it)")
    published = ("nothing published yet" if reclocked_upper == 0
                 else f"{reclocked_upper} = {fmt_time(reclocked_upper)}" if reclocked_upper is not None else "–")
    items = [
        ("since", "since", _since(src.get("since"))),
        ("remap-upper", "remap upper", "–" if remap_upper is None else f"{remap_upper} = {fmt_time(remap_upper)}"),
        ("last-binding", "last binding", "–" if last_bound is None else f"{fmt_time(last_bound)}{age}"),
        ("reclocked-upper", "reclocked upper", published),
        ("publish-lag", "publish lag (remap upper − reclocked upper)", fmt_duration(src.get("publish_lag_ms"))),
        ("bind-lag", "upstream lag (upstream upper − bound frontier)", lag_offsets),
    ]
    if (lag_ms := src.get("lag_ms")) is not None:  # a source that lands what it reads (Kinesis)
        at = src.get("lag_ms_measured_at")
        shards = ", ".join(f"{partition_label(p)} {fmt_duration(ms)}"
                           for p, ms in sorted((src.get("lag_ms_by_partition") or {}).items())[:20])
        items.append(("time-lag", "upstream lag in time (MillisBehindLatest at the last read)",
                      f"{fmt_duration(lag_ms)} (read at {fmt_time(at)}; by shard: {shards})"))
    if src.get("dead_letters") is not None or src.get("on_bad_record") == "dead_letter":
        items.append(("dead-letters", "dead letters (records that could not be decoded)",
                      f"{fmt_count(src.get('dead_letters') or 0)} in {src.get('source')}_dead_letter"))
    return '<dl class="facts">' + "".join(
        f'<div class="fact {k}"><dt>{h(label)}</dt><dd>{h(value)}</dd></div>' for k, label, value in items) + "</dl>"


def render_source(src: Mapping, now: int | None = None) -> str:
    """One source's section: errors first, then facts, chart, partitions and the last check."""
    name = src.get("source", "?")
    out = [f'<section class="source" id="source-{h(name)}" data-source="{h(name)}">'
           f'<h2><span class="name">{h(name)}</span> <span class="kind">{h(src.get("kind", ""))}</span> '
           f'{check_badge(src.get("last_check"))}</h2>']
    if src.get("error"):
        out.append(error_box(src["error"]))
    if src.get("upstream_error"):
        out.append(error_box(src["upstream_error"], "upstream"))
    if not src.get("tables") and not src.get("error"):
        out.append('<p class="muted">no remap table yet: the source was never ticked</p>')
    out.append(facts(src, now))
    rows = src.get("progress") or []
    out.append(f'<figure>{chart_svg(rows, str(name))}{legend(rows, names=src.get("partition_names"))}</figure>')
    out.append(partition_table(src))
    out.append(render_checks(src.get("last_check"), src.get("last_check_error"), now))
    out.append("</section>")
    return "".join(out)


# --- the page ---------------------------------------------------------------------------------

CSS = """
body{font-family:"DejaVu Sans","Liberation Sans",Arial,sans-serif;margin:16px 24px;color:#1a1a1a;
background:#fff;font-size:14px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:0 0 8px}h3{font-size:15px;margin:12px 0 4px}
.muted,.meta{color:#666}.meta{margin:0 0 12px}
a{color:#0b5cad}
section.source{border:1px solid #d0d7de;border-radius:6px;padding:12px 16px;margin:16px 0}
.kind{font-size:12px;font-weight:normal;color:#555;border:1px solid #ccc;border-radius:10px;padding:1px 8px}
.badge{font-size:12px;font-weight:normal;border-radius:10px;padding:2px 8px;color:#fff}
.badge.pass{background:#1a7f37}.badge.fail{background:#cf222e}.badge.none{background:#8c959f}
.error{background:#ffebe9;border:1px solid #ff8182;color:#82071e;padding:6px 10px;border-radius:4px;margin:6px 0;
white-space:pre-wrap}
dl.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:2px 16px;margin:8px 0}
.fact{display:flex;gap:8px}.fact dt{color:#555;min-width:150px}.fact dd{margin:0;font-weight:600}
figure{margin:8px 0}
svg.chart{background:#fafbfc;border:1px solid #eaeef2;max-width:100%;height:auto}
svg .grid{stroke:#e1e4e8}svg .axis,svg .tick{stroke:#57606a}
svg text{font-size:11px;fill:#444}svg .caption{font-size:12px;fill:#222}svg .empty{font-size:14px;fill:#888}
svg .step{stroke-width:1.8}
ul.legend{list-style:none;padding:0;margin:4px 0;display:flex;flex-wrap:wrap;gap:4px 14px}
.swatch{display:inline-block;margin-right:5px;vertical-align:0}
table{border-collapse:collapse;margin:6px 0}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.fail td{background:#fff5f5}.verdict.pass strong{color:#1a7f37}.verdict.fail strong{color:#cf222e}
.report.fail .summary strong{color:#cf222e}
pre{background:#f6f8fa;padding:6px;overflow:auto}
table.overview td.ok{color:#1a7f37}table.overview td.bad{color:#cf222e}
"""


def overview(sources: Sequence[Mapping]) -> str:
    """One line per source: links to its section, upstream state and last check."""
    rows = []
    for src in sources:
        name, record = src.get("source", "?"), src.get("last_check")
        upstream = (unreachable(src) if src.get("upstream_error") else
                    f'{fmt_duration(src["lag_ms"])} behind' if src.get("lag_ms") is not None else
                    f'{fmt_count(src.get("lag_offsets"))} offsets behind' if src.get("upstream_frontier") is not None
                    else "–")
        check = "never" if record is None else ("PASS" if record.get("success") else "FAIL")
        warehouse = "error" if src.get("error") else "ok" if src.get("tables") else "never ticked"
        rows.append(f'<tr><td><a href="#source-{h(name)}">{h(name)}</a></td>'
                    f'<td class="{"bad" if src.get("error") else "ok"}">{warehouse}</td>'
                    f'<td class="{"bad" if src.get("upstream_error") else "ok"}">{h(upstream)}</td>'
                    f'<td>{h(fmt_duration(src.get("publish_lag_ms")))}</td>'
                    f'<td class="{ {"FAIL": "bad", "PASS": "ok"}.get(check, "")}">{check}</td></tr>')
    return ('<table class="overview"><thead><tr><th>source</th><th>warehouse</th><th>upstream</th>'
            '<th>publish lag</th><th>last check</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table>")


def render_page(data: Mapping, json_href: str = "api/progress", refresh_s: int | None = 60) -> str:
    """The whole page for :func:`reclock.progress.collect`'s result."""
    now = data.get("generated_at")
    sources = data.get("sources") or []
    refresh = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s else ""
    body = [f'<h1>reclock progress</h1><p class="meta">generated {h(fmt_time(now))} · config '
            f'<code>{h(data.get("config"))}</code> · warehouse <code>{h(data.get("warehouse"))}</code> · '
            f'<a href="{h(json_href)}">JSON</a></p>']
    if data.get("error"):
        body.append(error_box(data["error"], "config"))
    if sources:
        body.append(overview(sources))
    body += [render_source(src, now) for src in sources]
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'{refresh}<title>reclock progress</title><style>{CSS}</style></head>'
            f'<body>{"".join(body)}</body></html>')
