"""The docs site (``mkdocs.yml``, ``docs/``) builds with ``mkdocs build --strict``, and
``docs/troubleshooting.md`` lists every error message the product raises.

Which messages: every ``raise <callable>(<message>, ...)`` in ``include/reclock/**/*.py`` and ``dags/*.py``
whose first positional argument is a string literal, an f-string, or a ``+`` chain holding one of those.  The
message's *literal text* is its string parts; anything else (an f-string's ``{...}``, a variable, a call, a
conditional) is a *placeholder*.  Helpers that build the exception count too (``raise self._fail("...", e)``):
their first argument is printed.  A message is checked when its literal text, without whitespace and
punctuation, has at least :data:`MIN_LITERAL` characters; shorter ones only pass another system's error on
(``f"postgres: {e}"``) and have nothing of their own to look up.  Messages built elsewhere and raised from a
variable (``raise ConfigError("\\n".join(lines))``, ``raise ChecksFailed(self.summary())``) are not seen here;
the page documents them by hand.

When a message is listed: one quote of ``docs/troubleshooting.md`` (an inline code span, `` `...` `` or
``` `` ... `` ```, on one line) holds all of its literal pieces, in order, with anything between them (the page
writes a placeholder as ``<name>``); whitespace runs count as one space.  So the page quotes each message whole,
not just a prefix: most messages begin with a placeholder (the source's name), and several share their first
words, which a prefix alone would let one entry answer for.

Neither test starts a JVM or a server: the messages are read with :mod:`ast`, the site is built by MkDocs in a
subprocess into a temporary directory.
"""
from __future__ import annotations

import ast
import os
import re
import string
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "troubleshooting.md"
#: Where the product's messages are raised (globs relative to the repository).
SOURCES = ("include/reclock/**/*.py", "dags/*.py")
#: The fewest characters of literal text (whitespace and punctuation aside) that make a message checked.
MIN_LITERAL = 12
PLACEHOLDER = None  # a piece of a message that is not literal text


def message_pieces(node: ast.expr) -> list[str | None] | None:
    """The pieces of a raised call's first argument: literal strings, and :data:`PLACEHOLDER` for the rest;
    None when the argument is not a message (no string literal or f-string in it)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value if isinstance(v, ast.Constant) else PLACEHOLDER for v in node.values]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = message_pieces(node.left), message_pieces(node.right)
        if left is None and right is None:
            return None
        return (left or [PLACEHOLDER]) + (right or [PLACEHOLDER])
    return None


def _normalized(run: str) -> str:
    """A literal run with its whitespace collapsed, keeping a space at either end if it had one."""
    core = " ".join(run.split())
    return (" " if run[:1].isspace() else "") + core + (" " if run[-1:].isspace() else "")


def literal_runs(pieces: list[str | None]) -> list[str]:
    """The literal runs between placeholders (whitespace collapsed, spaces at their ends kept)."""
    runs, current = [], ""
    for piece in pieces:
        if piece is PLACEHOLDER:
            if current.strip():
                runs.append(_normalized(current))
            current = ""
        else:
            current += piece
    if current.strip():
        runs.append(_normalized(current))
    return runs


def significant(runs: list[str]) -> int:
    """Characters of literal text other than whitespace and punctuation."""
    return sum(1 for run in runs for c in run if not c.isspace() and c not in string.punctuation)


def raised_messages(repo: Path = REPO) -> list[tuple[str, int, list[str]]]:
    """``(file, line, literal runs)`` of every checked message (see the module docstring)."""
    found = []
    for pattern in SOURCES:
        for path in sorted(repo.glob(pattern)):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args):
                    continue
                pieces = message_pieces(node.exc.args[0])
                if pieces is None:
                    continue
                runs = literal_runs(pieces)
                if significant(runs) >= MIN_LITERAL:
                    found.append((str(path.relative_to(repo)), node.lineno, runs))
    return found


def listed(runs: list[str], quotes: list[str]) -> bool:
    """Whether one of ``quotes`` (whitespace collapsed) holds every run of ``runs`` in order."""
    for line in quotes:
        at = 0
        for run in runs:
            at = line.find(run, at)
            if at < 0:
                break
            at += len(run)
        else:
            return True
    return False


#: An inline code span: a run of backticks, its text, and the same run closing it (``` `` a `b` c `` ```).
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def page_quotes(text: str) -> list[str]:
    """The inline code spans of a Markdown page, whitespace collapsed (fenced blocks' lines are not quotes)."""
    quotes, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            quotes += [" ".join(m.group(2).split()) for m in CODE_SPAN.finditer(line)]
    return quotes


def template(runs: list[str]) -> str:
    """A message as the failure lists it: its literal runs with ``<...>`` between them."""
    return "<...>".join(runs)


def test_the_docs_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, a page missing from the nav's files, any warning fails."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # Material's banner about MkDocs 2
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    assert (tmp_path / "site" / "troubleshooting" / "index.html").is_file()


def test_every_raised_message_is_in_the_troubleshooting_page():
    """Each checked message (module docstring) is quoted in one code span of docs/troubleshooting.md."""
    messages = raised_messages()
    assert len(messages) > 100, f"only {len(messages)} messages found: is the walk still reading the code?"
    quotes = page_quotes(PAGE.read_text())
    missing = [f"{path}:{line}: {template(runs)}" for path, line, runs in messages if not listed(runs, quotes)]
    assert not missing, (f"{len(missing)} error message(s) raised in the code are not in {PAGE.relative_to(REPO)} "
                         "(quote each in one code span, a placeholder as <name>):\n" + "\n".join(missing))


def test_the_rule_finds_a_message_missing_from_a_page():
    """The matching rule itself: the pieces in order in one code span; a reworded, split or absent message is
    missing, and a message of less than :data:`MIN_LITERAL` characters of its own is not checked."""
    code = ('def f(name, e):\n'
            '    raise SourceError(f"{name}: staging IntoTimes {a}..{b} failed: {e}")\n'
            '    raise SourceError(f"postgres: {e}")\n'
            '    raise ValueError("the " + kind + " has no upper yet")\n')
    raises = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Raise)]
    runs = [literal_runs(message_pieces(r.exc.args[0])) for r in raises]
    assert runs[0] == [": staging IntoTimes ", "..", " failed: "]
    assert significant(runs[1]) < MIN_LITERAL  # another system's message passed on: not checked
    assert runs[2] == ["the ", " has no upper yet"]
    page = page_quotes("`<source>: staging IntoTimes <start>..<upto> failed: <message>`\n"
                       ":   a definition, then `` the <kind> has `no` upper ``\n")
    assert page == ["<source>: staging IntoTimes <start>..<upto> failed: <message>", "the <kind> has `no` upper"]
    assert listed(runs[0], page)
    assert not listed(runs[2], page)  # the quote lacks " yet"
    assert not listed(runs[0], page_quotes("`<source>: staging IntoTimes <start>..<upto>` failed: `<message>`\n"))
    assert not listed(runs[0], page_quotes("```text\n<source>: staging IntoTimes <a>..<b> failed: <c>\n```\n"))
