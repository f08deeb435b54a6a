"""The answers kept between runs: a cache file is written atomically, and nothing else is ever replaced."""

from __future__ import annotations

import json
import logging

from amp_backends import cache


def test_a_file_that_is_no_cache_is_never_replaced(tmp_path, caplog):
    """AMP_AUTOTUNE_CACHE pointed at a file of the user's: storing an answer replaced it with JSON."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, not JSON\n")
    with caplog.at_level(logging.WARNING, logger="amp_backends"):
        assert cache.store(notes, "key", {"policy": "float32"}) is False
        assert cache.store(tmp_path, "key", 1) is False  # a folder given for the file
    assert notes.read_text() == "my notes, not JSON\n"
    assert "left as it is, so no answer is kept there. Fix: point the cache at another file" in caplog.text
    # a cache of its own: entries added, atomically; a missing one made
    kept = tmp_path / "sub" / "tune.json"
    assert cache.store(kept, "a", 1) and cache.store(kept, "b", 2)
    assert json.loads(kept.read_text()) == {"a": 1, "b": 2} and cache.load(kept) == {"a": 1, "b": 2}
