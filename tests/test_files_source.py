"""FileSource over a local directory and an fsspec memory:// filesystem (same tests for both)."""
from __future__ import annotations

import pickle
import uuid

import pytest
from hypothesis import given, settings, strategies as st

from reclock.engine import Frontier
from reclock.sources import SourceError, build_source
from reclock.sources.files import COMMITTED_NAME, FileSource


@pytest.fixture(params=["local", "memory"])
def where(request, tmp_path):
    """A fresh directory URL and an ``append(key, bytes)`` writer for it."""
    import fsspec

    if request.param == "local":
        url = str(tmp_path / "in")
        fs = fsspec.filesystem("file")
        root = url
    else:
        url = f"memory://reclock-test-{uuid.uuid4().hex}"
        fs = fsspec.filesystem("memory")
        root = url[len("memory:/"):]

    def append(key: str, data: bytes) -> None:
        path = f"{root}/{key}"
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, (fs.cat_file(path) if fs.exists(path) else b"") + data)

    def write(key: str, data: bytes) -> None:
        fs.pipe_file(f"{root}/{key}", data)

    yield url, append, write, fs, root
    if request.param == "memory":
        fs.rm(root, recursive=True) if fs.exists(root) else None


def lines(src, key, start, end):
    return [(d["line"], off, diff) for d, off, diff in src.read(key, start, end)]


def test_partial_last_line_excluded_until_completed(where):
    url, append, *_ = where
    append("a.jsonl", b'{"x": 1}\n{"x": 2}\n{"x": 3')
    src = FileSource(url)
    assert src.upper() == Frontier.of({"a.jsonl": 18})
    assert lines(src, "a.jsonl", 0, 18) == [('{"x": 1}', 0, 1), ('{"x": 2}', 9, 1)]
    append("a.jsonl", b"}")
    assert src.upper()["a.jsonl"] == 18
    append("a.jsonl", b"\n")
    assert src.upper()["a.jsonl"] == 27
    assert lines(src, "a.jsonl", 18, 27) == [('{"x": 3}', 18, 1)]
    with pytest.raises(SourceError, match="beyond the upper"):
        list(src.read("a.jsonl", 18, 30))


def test_exact_ranged_reads(where):
    url, append, *_ = where
    append("d/b.txt", b"aa\nbbbb\n\nc\n")  # offsets 0, 3, 8, 9; upper 11
    src = FileSource(url)
    assert src.upper() == Frontier.of({"d/b.txt": 11})
    assert lines(src, "d/b.txt", 3, 9) == [("bbbb", 3, 1), ("", 8, 1)]
    assert lines(src, "d/b.txt", 3, 4) == [("bbbb", 3, 1)]  # lines *starting* in the range
    assert lines(src, "d/b.txt", 9, 9) == []
    assert [o for _, o, _ in src.read("d/b.txt", 0, 11)] == [0, 3, 8, 9]
    with pytest.raises(SourceError, match="not the start of a line"):
        list(src.read("d/b.txt", 4, 11))
    with pytest.raises(SourceError):
        src.read(7, 0, 1)
    with pytest.raises(SourceError, match="does not exist"):
        list(src.read("nope", 0, 1))


def test_ranged_read_does_not_read_whole_file(where, monkeypatch):
    url, append, *_ = where
    big = b"".join(b"%07d\n" % i for i in range(300_000))  # 2.4 MB
    append("big.txt", big)
    src = FileSource(url)
    cat, scanned = src.fs.cat_file, []
    monkeypatch.setattr(src.fs, "cat_file", lambda p, start=None, end=None: scanned.append((end or 0) - (start or 0))
                        or cat(p, start=start, end=end))  # keywords: s3fs's second positional is version_id
    assert src.upper()["big.txt"] == len(big) and sum(scanned) <= 64 * 1024  # upper scans the tail only
    reads = []
    orig = src.fs.open

    def counting_open(*a, **kw):
        f = orig(*a, **kw)
        raw_read = f.read
        f.read = lambda n=-1: reads.append(n) or raw_read(n)
        return f

    monkeypatch.setattr(src.fs, "open", counting_open)
    start = 8 * 200_000
    assert lines(src, "big.txt", start, start + 16) == [("0200000", start, 1), ("0200001", start + 8, 1)]
    assert reads and all(0 < n <= 1 << 20 for n in reads) and sum(reads) < 100_000


def test_new_key_later_keeps_frontier_monotone(where):
    url, append, *_ = where
    append("a.txt", b"1\n")
    src = FileSource(url, pattern="*.txt")
    f1 = src.upper()
    append("b.txt", b"x\ny")
    append("c.log", b"ignored\n")
    f2 = src.upper()
    assert f1.less_equal(f2) and f2 == Frontier.of({"a.txt": 2, "b.txt": 2})
    assert f2.increments_from(f1) == {"b.txt": 2}


def test_shrink_and_rewrite_detected(where):
    url, append, write, *_ = where
    append("a.txt", b"one\ntwo\n")
    src = FileSource(url)
    assert src.upper()["a.txt"] == 8
    write("a.txt", b"one\n")
    with pytest.raises(SourceError, match="shrank"):
        src.upper()
    write("a.txt", b"ONE\ntwo\nthree\n")  # same prefix length, changed content, grew
    with pytest.raises(SourceError, match="rewritten"):
        src.upper()
    # a fresh source detects shrink below the committed frontier
    write("a.txt", b"one\ntwo\n")
    src2 = FileSource(url)
    src2.commit(src2.upper())
    write("a.txt", b"one\n")
    with pytest.raises(SourceError, match="shrank"):
        FileSource(url).upper()


def test_commit_round_trip_and_delete_committed(where):
    url, append, _, fs, root = where
    append("a.txt", b"1\n2\n")
    append("b.txt", b"x\ny\nparti")
    src = FileSource(url, delete_committed=True)
    assert src.committed() == Frontier()
    up = src.upper()
    src.commit(Frontier.of({"a.txt": 2}))
    assert FileSource(url).committed() == Frontier.of({"a.txt": 2})
    assert fs.exists(f"{root}/a.txt")  # only part of it is committed
    src.commit(up)
    assert fs.exists(f"{root}/{COMMITTED_NAME}")
    assert not fs.exists(f"{root}/a.txt") and fs.exists(f"{root}/b.txt")  # b has a partial line
    fresh = FileSource(url)
    assert fresh.committed() == up
    assert fresh.upper() == up and "_reclock" not in str(fresh.upper())  # released key stays at its upper
    with pytest.raises(SourceError, match="already released upstream"):
        list(fresh.read("a.txt", 0, 4))
    assert lines(fresh, "b.txt", 2, 4) == [("y", 2, 1)]  # not deleted: still readable
    src.commit(Frontier.of({"a.txt": 2}))  # never goes backwards
    assert src.committed() == up
    with pytest.raises(SourceError, match="cannot commit"):
        src.commit(Frontier.of({"b.txt": 9}))


def test_committed_path_configurable(where):
    url, append, _, fs, root = where
    append("a.txt", b"1\n")
    src = FileSource(url, committed_path=f"{root}/meta/state.json")
    src.commit(src.upper())
    assert fs.exists(f"{root}/meta/state.json")
    assert FileSource(url, committed_path=f"{root}/meta/state.json").committed() == Frontier.of({"a.txt": 2})
    assert src.upper() == Frontier.of({"a.txt": 2})  # the commit file is not a key


def test_undecodable_line(where):
    url, append, *_ = where
    append("a.txt", b"ok\n\xff\xfe\n")
    src = FileSource(url)
    with pytest.raises(SourceError, match=r"'a.txt' byte offset 3.*utf-8"):
        list(src.read("a.txt", 0, src.upper()["a.txt"]))
    assert lines(FileSource(url, encoding="latin-1"), "a.txt", 3, 6) == [("\xff\xfe", 3, 1)]
    with pytest.raises(SourceError, match="newline"):
        FileSource(url, encoding="utf-16")


def test_registry_and_pickle(where):
    url, append, *_ = where
    append("a.txt", b"1\n")
    url = url if "://" in url else "file://" + url  # file:// URLs and plain paths are the same source
    src = build_source({"kind": "files", "url": url, "pattern": "*.txt"})
    assert isinstance(src, FileSource) and src.upper() == Frontier.of({"a.txt": 2})
    assert pickle.loads(pickle.dumps(src)).upper() == Frontier.of({"a.txt": 2})


_line = st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["a", "b/c"]), st.lists(_line, min_size=1, max_size=4),
                                st.integers(0, 10**6)), min_size=1, max_size=8),
       kind=st.sampled_from(["local", "memory"]))
def test_random_appends_read_back_exactly(tmp_path_factory, steps, kind):
    import fsspec

    if kind == "local":
        root = url = str(tmp_path_factory.mktemp("prop"))
        fs = fsspec.filesystem("file")
    else:
        url = f"memory://reclock-prop-{uuid.uuid4().hex}"
        root, fs = url[len("memory:/"):], fsspec.filesystem("memory")
    src = FileSource(url)
    content: dict[str, bytes] = {}
    prev = Frontier()
    try:
        for key, new_lines, cut in steps:
            # Append complete lines, then split the stream at a random point: a partial line may trail.
            data = content.get(key, b"") + "".join(x + "\n" for x in new_lines).encode()
            pending = content.get(key, b"")
            content[key] = data
            keep = len(pending) + cut % (len(data) - len(pending) + 1)
            fs.makedirs(f"{root}/{key}".rsplit("/", 1)[0], exist_ok=True)
            fs.pipe_file(f"{root}/{key}", data[:keep])
            up = src.upper()
            assert prev.less_equal(up)
            prev = up
            for k in content:
                written = fs.cat_file(f"{root}/{k}")
                complete = written[:written.rfind(b"\n") + 1].decode().split("\n")[:-1]
                got = [d["line"] for d, _, _ in src.read(k, 0, up[k])]
                assert got == complete
    finally:
        if kind == "memory" and fs.exists(root):
            fs.rm(root, recursive=True)
