"""``alphafeat clean CACHE``: the cache and its kept books go; anything else is refused."""

from __future__ import annotations

import json
import re

import pyarrow as pa
from hand_cache import write_hand_cache

from alphafeat.cache import MANIFEST, PREDECODED_KEY, clean_cache
from alphafeat.cli import main


def _cache(root, pre):
    write_hand_cache(root, [{"mid": pa.array([1.0, 2.0])}], [{"name": "mid"}], [30])
    man = json.loads((root / MANIFEST).read_text())
    (root / MANIFEST).write_text(json.dumps({**man, PREDECODED_KEY: str(pre)}))
    for sub in ("book/abc", "plan", "survey"):
        (pre / sub).mkdir(parents=True)
    (pre / "book/abc/book.arrow").write_bytes(b"x" * 100)
    return root


def test_clean_removes_cache_and_kept_books(tmp_path, capsys):
    inside = _cache(tmp_path / "c1", tmp_path / "c1" / ".predecoded")
    assert main(["clean", str(inside)]) == 0
    assert not inside.exists() and f"removed {inside}" in capsys.readouterr().out
    shared = tmp_path / "shared-books"
    a = _cache(tmp_path / "a", shared)
    assert clean_cache(a, keep_predecoded=True) == [a] and (shared / "book/abc/book.arrow").is_file()
    b = _cache(tmp_path / "b", tmp_path / "b-books")
    assert clean_cache(b) == [b, tmp_path / "b-books"] and not (tmp_path / "b-books").exists()
    c = _cache(tmp_path / "c", tmp_path / "c-books")
    (tmp_path / "c-books" / "my-notes.txt").write_text("not alphafeat's")  # a folder holding more: kept
    assert clean_cache(c) == [c] and (tmp_path / "c-books" / "my-notes.txt").is_file()


def test_clean_refuses_a_folder_that_is_not_a_cache(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("x")
    assert main(["clean", str(tmp_path / "data")]) == 1
    err = capsys.readouterr().err
    assert "not an alphafeat cache" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "data" / "keep.txt").is_file()
    assert main(["clean", str(tmp_path / "nowhere")]) == 1
    assert "no such folder" in capsys.readouterr().err


def test_kept_books_inside_the_cache_shared_on_request_and_cleaned(tmp_path, capsys):
    """The predecoded folder defaults to ``<out>/.predecoded`` (nothing beside the cache);
    ``--predecoded-dir`` points two caches at one folder (the second uses the first's kept
    book); ``alphafeat clean`` removes a cache and its kept books."""
    from conftest import ESH4_MBO, need

    mbo = str(need(ESH4_MBO))
    work = tmp_path / "work"
    assert main(["precompute", "-q", "--input", mbo, "--out", str(work / "realcache")]) == 0
    assert [p.name for p in work.iterdir()] == ["realcache"]
    assert any((work / "realcache" / ".predecoded" / "book").iterdir())  # MBO: the book kept, inside
    man = json.loads((work / "realcache" / MANIFEST).read_text())
    assert man[PREDECODED_KEY] == ".predecoded"  # inside the cache: relative to it
    capsys.readouterr()
    assert main(["clean", str(work / "realcache")]) == 0
    assert not (work / "realcache").exists() and list(work.iterdir()) == []
    shared = tmp_path / "books"
    for name in ("a", "b"):
        assert main(["precompute", "-q", "--input", mbo, "--out", str(work / name), "--predecoded-dir",
                     str(shared)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert re.search(r"books from the predecoded folder\s*│\s*1\s", out)  # b used a's kept book
    assert not (work / "a" / ".predecoded").exists() and (shared / "book").is_dir()
    assert main(["clean", str(work / "a"), "--keep-predecoded"]) == 0 and (shared / "book").is_dir()
    assert main(["clean", str(work / "b")]) == 0 and not shared.exists()
