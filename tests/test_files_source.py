"""FileSource over a local directory and an fsspec memory:// filesystem (same tests for both)."""
from __future__ import annotations

import hashlib
import json
import pickle
import uuid

import pytest
from hypothesis import given, settings, strategies as st

from reclock.engine import Frontier
from reclock.sources import SourceError, build_source
from reclock.sources.base import BadRecord, reads_bad_records
from reclock.sources.files import COMMITTED_NAME, FileSource, by_preference, fingerprint, region_end


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


def fp(first_line: bytes) -> str:
    """The identity of a file whose first line is ``first_line`` (the default fingerprint)."""
    return hashlib.sha256(first_line).hexdigest()[:16]


def ident(src, key):
    """The partition of the file now at ``key``."""
    return {k: i for i, k in src.names().items()}[key]


def keyed(src):
    """``{key: upper}``: the upper frontier by the file now holding each identity."""
    up, names = src.upper(), src.names()
    return {names.get(p, p): u for p, u in up}


def lines(src, key, start, end):
    return [(d["line"], off, diff) for d, off, diff in src.read(ident(src, key), start, end)]


def test_partial_last_line_excluded_until_completed(where):
    url, append, *_ = where
    append("a.jsonl", b'{"x": 1}\n{"x": 2}\n{"x": 3')
    src = FileSource(url)
    a = fp(b'{"x": 1}\n')
    assert src.upper() == Frontier.of({a: 18}) and src.names() == {a: "a.jsonl"}
    assert lines(src, "a.jsonl", 0, 18) == [('{"x": 1}', 0, 1), ('{"x": 2}', 9, 1)]
    append("a.jsonl", b"}")
    assert src.upper()[a] == 18
    append("a.jsonl", b"\n")
    assert src.upper()[a] == 27
    assert lines(src, "a.jsonl", 18, 27) == [('{"x": 3}', 18, 1)]
    with pytest.raises(SourceError, match="beyond the upper"):
        list(src.read(a, 18, 30))


def test_exact_ranged_reads(where):
    url, append, *_ = where
    append("d/b.txt", b"aa\nbbbb\n\nc\n")  # offsets 0, 3, 8, 9; upper 11
    src = FileSource(url)
    b = fp(b"aa\n")
    assert src.upper() == Frontier.of({b: 11}) and src.names() == {b: "d/b.txt"}
    assert lines(src, "d/b.txt", 3, 9) == [("bbbb", 3, 1), ("", 8, 1)]
    assert lines(src, "d/b.txt", 3, 4) == [("bbbb", 3, 1)]  # lines *starting* in the range
    assert lines(src, "d/b.txt", 9, 9) == []
    assert [o for _, o, _ in src.read(b, 0, 11)] == [0, 3, 8, 9]
    with pytest.raises(SourceError, match=rf"file {b} \(key 'd/b.txt'\) byte offset 4 is not the start of a line"):
        list(src.read(b, 4, 11))
    with pytest.raises(SourceError):
        src.read(7, 0, 1)
    with pytest.raises(SourceError, match="does not exist"):
        list(src.read("nope", 0, 1))
    with pytest.raises(SourceError, match=rf"file {b} \(key 'd/b.txt'\): no complete line at 11"):
        list(src.read(b, 0, 12))


def test_ranged_read_does_not_read_whole_file(where, monkeypatch):
    url, append, *_ = where
    big = b"".join(b"%07d\n" % i for i in range(300_000))  # 2.4 MB
    append("big.txt", big)
    src = FileSource(url)
    cat, scanned = src.fs.cat_file, []
    monkeypatch.setattr(src.fs, "cat_file", lambda p, start=None, end=None: scanned.append((end or 0) - (start or 0))
                        or cat(p, start=start, end=end))  # keywords: s3fs's second positional is version_id
    assert src.upper()[fp(b"0000000\n")] == len(big) and sum(scanned) <= 64 * 1024 + 4096  # tail and first line
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
    assert f1.less_equal(f2) and f2 == Frontier.of({fp(b"1\n"): 2, fp(b"x\n"): 2})
    assert f2.increments_from(f1) == {fp(b"x\n"): 2}


@pytest.mark.parametrize("head, skip, n, end", [
    (b"", 0, 1, None),
    (b"partial", 0, 1, None),
    (b"one\n", 0, 1, 4),
    (b"one\ntwo", 0, 1, 4),  # bytes after the region do not matter
    (b"one\ntwo", 0, 2, None),
    (b"one\ntwo\n", 0, 2, 8),
    (b"\n", 0, 1, 1),  # an empty first line is a line
    (b"#header\nbody\n", 8, 1, 13),  # ignored_header_bytes
    (b"#header\nbody\n", 3, 1, 8),  # skipping into a line: the rest of that line
    (b"#h\n", 3, 1, None),  # nothing after the skipped header yet: held back
])
def test_fingerprint_region(head, skip, n, end):
    assert region_end(head, skip, n) == end
    expected = None if end is None else hashlib.sha256(head[skip:end]).hexdigest()[:16]
    assert fingerprint(head, skip, n) == expected
    assert fingerprint(head + b"more bytes\n", skip, n) == expected or end is None  # appends never change it


@pytest.mark.parametrize("holders, previous, order", [
    ({"app.log": 10, "app.log.1": 4}, None, ["app.log", "app.log.1"]),  # copy in progress: the longer
    ({"app.log": 4, "app.log.1": 10}, "app.log", ["app.log.1", "app.log"]),
    ({"b": 7, "a": 7}, None, ["a", "b"]),  # equal: by name
    ({"b": 7, "a": 7}, "b", ["b", "a"]),  # equal: the previous holder
])
def test_holder_preference(holders, previous, order):
    assert by_preference(holders, previous) == order


OLD = b"".join(b"old %d\n" % i for i in range(100))
NEW = b"".join(b"new %d\n" % i for i in range(100))


def rename(fs, root, append):
    fs.mv(f"{root}/app.log", f"{root}/app.log.1")


def copy_truncate(fs, root, append):
    fs.pipe_file(f"{root}/app.log.1", fs.cat_file(f"{root}/app.log"))
    fs.pipe_file(f"{root}/app.log", b"")


def copy_truncate_watched(fs, root, append, src):
    """copy-truncate with the source looking at every step: half-copied, copied, truncated, partial first line."""
    fs.pipe_file(f"{root}/app.log.1", OLD[:len(OLD) // 2 + 3])
    assert src.upper() == Frontier.of({fp(b"old 0\n"): len(OLD)})  # a copy in progress: one identity
    assert src.names() == {fp(b"old 0\n"): "app.log"}  # read from the longer
    fs.pipe_file(f"{root}/app.log.1", OLD)
    assert src.names() == {fp(b"old 0\n"): "app.log"}  # equal copies: the previous holder
    fs.pipe_file(f"{root}/app.log", b"")
    assert src.names() == {fp(b"old 0\n"): "app.log.1"}
    append("app.log", b"new")  # no complete first line yet: held back, no error
    assert src.upper() == Frontier.of({fp(b"old 0\n"): len(OLD)})
    fs.pipe_file(f"{root}/app.log", b"")


def delete_recreate(fs, root, append, src):
    """Deleted, then a run between (its tick and commit see the key empty), then a new file under the old name."""
    fs.rm_file(f"{root}/app.log")
    src.commit(src.upper())


@pytest.mark.parametrize("rotate, old_name, commit_first", [
    (rename, "app.log.1", False),
    (copy_truncate, "app.log.1", False),
    (copy_truncate_watched, "app.log.1", False),
    (delete_recreate, None, True),  # a new file under an old name: a new partition
])
def test_rotation_neither_duplicates_nor_skips(where, rotate, old_name, commit_first):
    url, append, _, fs, root = where
    append("app.log", OLD)
    src = FileSource(url, pattern="app.log*")
    old, new = fp(b"old 0\n"), fp(b"new 0\n")
    before = src.upper()
    assert before == Frontier.of({old: len(OLD)})
    if commit_first:
        src.commit(before)
    rotate(*(fs, root, append) + ((src,) if rotate in (copy_truncate_watched, delete_recreate) else ()))
    append("app.log", NEW)
    after = src.upper()
    assert after == Frontier.of({old: len(OLD), new: len(NEW)})
    assert src.names() == {new: "app.log", **({old: old_name} if old_name else {})}
    # what the next tick reads: the new lines only, each once
    read = [d["line"] for p, end in after for d, _, _ in src.read(p, before[p], end)]
    assert read == NEW.decode().splitlines()
    fresh = FileSource(url, pattern="app.log*")  # a Spark worker finds the files by identity
    if old_name:
        assert [d["line"] for d, _, _ in fresh.read(old, 0, len(OLD))] == OLD.decode().splitlines()
    assert [o for _, o, _ in fresh.read(new, 6, 12)] == [6]


def test_follows_a_rename_without_rereading(where, monkeypatch):
    url, append, _, fs, root = where
    append("app.log", OLD)
    src = FileSource(url)
    src.upper()
    fs.mv(f"{root}/app.log", f"{root}/app.log.1")
    append("app.log.1", b"late line\n")  # a writer holding the renamed file open
    read = []
    cat = fs.cat_file
    monkeypatch.setattr(src.fs, "cat_file", lambda p, start=None, end=None: read.append((p, start, end))
                        or cat(p, start=start, end=end))
    assert src.upper() == Frontier.of({fp(b"old 0\n"): len(OLD) + 10})
    assert all(start >= len(OLD) - 64 for _, start, _ in read if start)  # the head and the tail, no more


@pytest.mark.parametrize("options, outcome", [
    ({}, "conflict"),
    ({"fingerprint_lines": 2}, 2),
    ({"ignored_header_bytes": len(b"time,value\n")}, 2),
    ({"identity": "name"}, 2),
])
def test_same_fingerprint(where, options, outcome):
    url, append, *_ = where
    append("a.csv", b"time,value\n1,a\n")
    append("b.csv", b"time,value\n2,b\n")
    src = FileSource(url, **options)
    if outcome == "conflict":
        with pytest.raises(SourceError, match=r"files 'a.csv' and 'b.csv' have the same fingerprint .*"
                                              r"fingerprint_lines or ignored_header_bytes"):
            src.upper()
        with pytest.raises(SourceError, match="same fingerprint"):  # and reads refuse to pick one
            list(src.read(fp(b"time,value\n"), 0, 15))
    else:
        assert len(src.upper().partitions) == outcome
        assert sorted(d["line"] for p, end in src.upper() for d, _, _ in src.read(p, 0, end)) == [
            "1,a", "2,b", "time,value", "time,value"]


OVERWRITTEN = r"file {} \(key 'a.log'\) was overwritten: .*committed up to byte offset 16.*move it to a new key"


def test_overwritten_object_is_a_new_identity_on_a_disk_and_refused_on_an_object_store(where):
    """Replaced with other first bytes: the old identity's lines not yet committed are lost (refused everywhere);
    committed, a local disk reads the new file as a new partition (as rename rotation followed by deletion), and an
    object store refuses the overwrite (this process or a fresh one) until the object moves to a new key; a key seen
    empty by a run takes a new object."""
    url, append, write, fs, root = where
    append("a.log", b"one\ntwo\n")
    src = FileSource(url)
    one, uno, eins = fp(b"one\n"), fp(b"uno\n"), fp(b"eins\n")
    src.upper()
    write("a.log", b"uno\ndos\ntres\n")
    with pytest.raises(SourceError, match=rf"file {one} \(key 'a.log'\) disappeared with lines \[0, 8\) not yet "
                                          r"committed"):
        src.upper()
    write("a.log", b"one\ntwo\n")
    src.commit(src.upper())  # committed: the old identity may go
    write("a.log", b"one\ntwo\nuno\ndos\n")  # extends what was read: the same identity, read on
    src.commit(src.upper())
    assert src.committed() == Frontier.of({one: 16})
    write("a.log", b"uno\ndos\ntres\n")  # an object writer's "append" that dropped lines already read
    if not src.object_store:
        assert src.upper() == Frontier.of({one: 16, uno: 13}) and src.names() == {uno: "a.log"}
        assert [d["line"] for d, _, _ in src.read(uno, 0, 13)] == ["uno", "dos", "tres"]
        return
    for source in (src, FileSource(url)):  # a fresh process knows the key from the commit file's names
        with pytest.raises(SourceError, match=OVERWRITTEN.format(one)):
            source.upper()
    with pytest.raises(SourceError, match=OVERWRITTEN.format(one)):
        src.commit(Frontier.of({one: 16}))
    fs.mv(f"{root}/a.log", f"{root}/a.2.log")  # the way on the error says: a new key
    assert src.upper() == Frontier.of({one: 16, uno: 13}) and src.names() == {uno: "a.2.log"}
    src.commit(src.upper())  # this run saw a.log empty: it takes a new object
    write("a.log", b"eins\n")
    assert FileSource(url).upper() == Frontier.of({one: 16, uno: 13, eins: 5})


def test_shrink_and_rewrite_detected(where):
    url, append, write, *_ = where
    append("a.txt", b"one\ntwo\n")
    src = FileSource(url)
    a = fp(b"one\n")
    assert src.upper()[a] == 8
    write("a.txt", b"one\n")
    with pytest.raises(SourceError, match=rf"file {a} \(key 'a.txt'\) shrank from 8 to 4 bytes"):
        src.upper()
    write("a.txt", b"one\nTWO\nthree\n")  # same first line, changed content before the upper, grew
    with pytest.raises(SourceError, match=rf"file {a} \(key 'a.txt'\) was rewritten: bytes before offset 8"):
        src.upper()
    # a fresh source detects shrink below the committed frontier, whatever the file is called now
    write("a.txt", b"one\ntwo\n")
    src2 = FileSource(url)
    src2.commit(src2.upper())
    write("a.txt", b"one\n")
    with pytest.raises(SourceError, match="shrank from 8 to 4"):
        FileSource(url).upper()


def test_commit_round_trip_and_delete_committed(where):
    url, append, _, fs, root = where
    append("a.txt", b"1\n2\n")
    append("b.txt", b"x\ny\nparti")
    a, b = fp(b"1\n"), fp(b"x\n")
    src = FileSource(url, delete_committed=True)
    assert src.committed() == Frontier()
    up = src.upper()
    src.commit(Frontier.of({a: 2}))
    assert FileSource(url).committed() == Frontier.of({a: 2})
    assert fs.exists(f"{root}/a.txt")  # only part of it is committed
    src.commit(up)
    doc = json.loads(fs.cat_file(f"{root}/{COMMITTED_NAME}"))
    assert doc == {"version": 2, "file_identity": "sha256:lines=1:skip=0", "committed": {a: 4, b: 4},
                   "names": {b: "b.txt"}}  # identities, and the names they have (a.txt is deleted: a new key)
    assert not fs.exists(f"{root}/a.txt") and fs.exists(f"{root}/b.txt")  # b has a partial line
    fresh = FileSource(url)
    assert fresh.committed() == up
    assert fresh.upper() == up and "_reclock" not in str(fresh.upper())  # released identity stays at its upper
    with pytest.raises(SourceError, match=rf"file {a} byte offset 0: already released upstream"):
        list(fresh.read(a, 0, 4))
    assert lines(fresh, "b.txt", 2, 4) == [("y", 2, 1)]  # not deleted: still readable
    src.commit(Frontier.of({a: 2}))  # never goes backwards
    assert src.committed() == up
    with pytest.raises(SourceError, match="cannot commit"):
        src.commit(Frontier.of({b: 9}))
    append("a.txt", b"new\n")  # the key reclock emptied takes a new object, on an object store too
    assert src.upper() == FileSource(url).upper() == Frontier.of({a: 4, b: 4, fp(b"new\n"): 4})


@pytest.mark.parametrize("written, options, error", [
    ({"version": 1, "committed": {"a.txt": 2}}, {}, r"keyed by 'name' identities.*identity: name, or start a new"),
    ({"version": 1, "committed": {"a.txt": 2}}, {"identity": "name"}, None),  # the name-keyed format, as before
    ({"version": 2, "file_identity": "sha256:lines=1:skip=0", "committed": {fp(b"1\n"): 2}}, {}, None),
    ({"version": 2, "file_identity": "sha256:lines=1:skip=0", "committed": {fp(b"1\n"): 2}},
     {"fingerprint_lines": 2}, r"keyed by 'sha256:lines=1:skip=0' identities, this source by "
                               r"'sha256:lines=2:skip=0': set the files source's identity options back"),
])
def test_commit_file_of_another_scheme_refused(where, written, options, error):
    url, append, _, fs, root = where
    append("a.txt", b"1\n2\n")
    fs.pipe_file(f"{root}/{COMMITTED_NAME}", json.dumps(written).encode())
    src = FileSource(url, **options)
    if error:
        for call in (src.committed, src.upper, lambda: src.commit(Frontier())):
            with pytest.raises(SourceError, match=error):
                call()
    else:
        assert src.committed() == Frontier.of(written["committed"])
        assert src.identity() == {"file_identity": written.get("file_identity", "name")}


@pytest.mark.parametrize("options, error", [
    ({"identity": "inode"}, "identity must be 'fingerprint' or 'name'"),
    ({"fingerprint_lines": 0}, "fingerprint_lines must be an int >= 1"),
    ({"ignored_header_bytes": -1}, "ignored_header_bytes must be an int >= 0"),
    ({"ignored_header_bytes": True}, "ignored_header_bytes must be an int >= 0"),
])
def test_bad_identity_options(where, options, error):
    with pytest.raises(SourceError, match=error):
        FileSource(where[0], **options)


def test_committed_path_configurable(where):
    url, append, _, fs, root = where
    append("a.txt", b"1\n")
    src = FileSource(url, committed_path=f"{root}/meta/state.json")
    src.commit(src.upper())
    assert fs.exists(f"{root}/meta/state.json")
    assert FileSource(url, committed_path=f"{root}/meta/state.json").committed() == Frontier.of({fp(b"1\n"): 2})
    assert src.upper() == Frontier.of({fp(b"1\n"): 2})  # the commit file is not a key


def test_undecodable_line(where):
    url, append, *_ = where
    append("a.txt", b"ok\n\xff\xfe\nlast\n")
    src, a = FileSource(url), fp(b"ok\n")
    with pytest.raises(SourceError, match=r"'a.txt'\) byte offset 3.*utf-8") as failed:
        list(src.read(a, 0, src.upper()[a]))
    assert str(failed.value).startswith(f"{url} file {a} (key 'a.txt') byte offset 3: line is not valid utf-8: ")
    # on_bad_record="dead_letter": the line comes back as a BadRecord with its bytes and that error; the read goes on
    assert list(src.read(a, 0, 11, on_bad_record="dead_letter")) == [
        ({"line": "ok"}, 0, 1), (BadRecord(b"\xff\xfe", str(failed.value)), 3, 1), ({"line": "last"}, 6, 1)]
    with pytest.raises(SourceError, match="on_bad_record must be one of"):
        src.read(a, 0, 11, on_bad_record="skip")
    assert reads_bad_records(src) and FileSource.dead_letter_problem({"url": url}) is None
    assert lines(FileSource(url, encoding="latin-1"), "a.txt", 3, 6) == [("\xff\xfe", 3, 1)]
    with pytest.raises(SourceError, match="newline"):
        FileSource(url, encoding="utf-16")


def test_registry_and_pickle(where):
    url, append, *_ = where
    append("a.txt", b"1\n")
    url = url if "://" in url else "file://" + url  # file:// URLs and plain paths are the same source
    src = build_source({"kind": "files", "url": url, "pattern": "*.txt"})
    assert isinstance(src, FileSource) and src.upper() == Frontier.of({fp(b"1\n"): 2})
    assert pickle.loads(pickle.dumps(src)).upper() == Frontier.of({fp(b"1\n"): 2})
    named = build_source({"kind": "files", "url": url, "identity": "name"})
    assert named.upper() == Frontier.of({"a.txt": 2}) and named.identity() == {"file_identity": "name"}


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
            # Lines start with their key: two files never share a first line.
            data = content.get(key, b"") + "".join(f"{key}:{x}\n" for x in new_lines).encode()
            pending = content.get(key, b"")
            content[key] = data
            keep = len(pending) + cut % (len(data) - len(pending) + 1)
            fs.makedirs(f"{root}/{key}".rsplit("/", 1)[0], exist_ok=True)
            fs.pipe_file(f"{root}/{key}", data[:keep])
            up = src.upper()
            assert prev.less_equal(up)
            prev = up
            held = {k: i for i, k in src.names().items()}
            for k in content:
                written = fs.cat_file(f"{root}/{k}")
                complete = written[:written.rfind(b"\n") + 1].decode().split("\n")[:-1]
                got = [d["line"] for d, _, _ in src.read(held[k], 0, up[held[k]])] if k in held else []
                assert got == complete
    finally:
        if kind == "memory" and fs.exists(root):
            fs.rm(root, recursive=True)


_op = st.one_of(st.tuples(st.just("append"), st.integers(1, 5)), st.tuples(st.just("rename"), st.booleans()),
                st.tuples(st.just("copytruncate"), st.booleans()))


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(_op, min_size=1, max_size=12))
def test_rotations_read_every_line_once(tmp_path_factory, ops):
    """Appends and rotations (looked at mid-way or not), a tick after each: every line is read exactly once."""
    root = tmp_path_factory.mktemp("rot")
    src, prev, read, written, n = FileSource(str(root), pattern="app.log*"), Frontier(), [], [], 0

    def tick():
        nonlocal prev
        up = src.upper()
        assert prev.less_equal(up)
        read.extend(d["line"] for p, end in up for d, _, _ in src.read(p, prev[p], end))
        prev = up

    for i, (op, arg) in enumerate(ops):
        log = root / "app.log"
        if op == "append":
            new = [f"line {n + j}" for j in range(arg)]  # unique lines: first lines never repeat
            n += arg
            written += new
            with open(log, "a") as f:
                f.write("".join(x + "\n" for x in new))
        elif op == "rename" and log.exists():
            log.rename(root / f"app.log.{i}")
        elif op == "copytruncate" and log.exists():
            data = log.read_bytes()
            (root / f"app.log.{i}").write_bytes(data[:len(data) // 2])
            if arg:
                tick()  # mid-copy
            (root / f"app.log.{i}").write_bytes(data)
            log.write_bytes(b"")
        if arg is True or op == "append":
            tick()
    tick()
    assert sorted(read, key=lambda x: int(x.split()[1])) == written  # files are read partition by partition


def test_status_the_page_and_the_tick_log_name_each_identity_by_its_file(tmp_path, caplog):
    """A files source's partitions are content fingerprints; the tick keeps the file holding each (the rotated-away
    one by its last known name while it is bound), and ``reclock status``, the progress page and the tick's log
    line show it."""
    from conftest import write_sources_config

    from reclock import pipeline, status
    from reclock.progress import collect_sources
    from reclock.progress_view import partition_table, render_page
    from reclock.runtime import Runtime

    A, B = fp(b"a1\n"), fp(b"b1\n")  # the identities of the first and the second app.log
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "app.log").write_bytes(b"a1\na2\n")
    config = write_sources_config(tmp_path, ("web", "files", {"url": str(logs), "pattern": "app.log*"}))
    pipeline.tick("web", config, now=1_000)
    (logs / "app.log").rename(logs / "app.log.1")  # rotated: the old identity follows its file
    (logs / "app.log").write_bytes(b"b1\n")
    with caplog.at_level("INFO", logger="reclock"):
        pipeline.tick("web", config, now=2_000)
    assert f"'{A}': 'app.log.1'" in caplog.text and f"'{B}': 'app.log'" in caplog.text
    (row,) = status.status(config)
    assert row["partition_names"] == {A: "app.log.1", B: "app.log"}
    with Runtime.of(config).source("web", connect=False) as ctx:  # a tick that no longer sees app.log.1
        sample = ctx.tables.upstream_sample()
        ctx.tables.record_upstream_sample(sample["upper"], sample["bound"], "tick", 3_000, names={B: "app.log"})
    (progress,) = collect_sources(Runtime.of(config).config, upstream=False)
    assert progress["partition_names"] == {A: "app.log.1", B: "app.log"}
    table = partition_table(progress)
    assert f"app.log.1 ({A})" in table and f"app.log ({B})" in table
    assert f"app.log.1 ({A})" in render_page({"generated_at": 3_000, "config": config, "warehouse": "",
                                                      "error": None, "sources": [progress]})


def test_a_tick_refuses_an_overwritten_object_and_binds_nothing(tmp_path):
    """On an object store, an object rewritten whole with the lines read before and more (its first bytes
    changed) is refused by the tick, which binds nothing: no line is published twice."""
    import fsspec
    from conftest import write_sources_config

    from reclock import pipeline
    from reclock.runtime import Runtime

    url = f"memory://reclock-tick-{uuid.uuid4().hex}"
    fs, root = fsspec.filesystem("memory"), url[len("memory:/"):]
    fs.pipe_file(f"{root}/a.log", b"one\ntwo\n")
    one = fp(b"one\n")
    config = write_sources_config(tmp_path, ("objs", "files", {"url": url}))
    try:
        pipeline.tick("objs", config, now=1_000)
        FileSource(url).commit(Frontier.of({one: 8}))  # what resume commits once it is published
        fs.pipe_file(f"{root}/a.log", b"zero\none\ntwo\nthree\n")
        with pytest.raises(SourceError, match=rf"file {one} \(key .a.log.\) was overwritten"):
            pipeline.tick("objs", config, now=2_000)
        with Runtime.of(config).source("objs", connect=False) as ctx:
            assert ctx.tables.remap_upper() == 1_001 and ctx.tables.read_remap().frontier == Frontier.of({one: 8})
    finally:
        fs.rm(root, recursive=True)
