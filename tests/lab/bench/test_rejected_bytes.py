"""ops/lab/bench/rejected_bytes.py measures a fresh queue of its own and deletes it after."""

from __future__ import annotations

from ops.lab.bench.rejected_bytes import bytes_per_shed


def test_bytes_per_shed_with_and_without_a_key(redis_url: str) -> None:
    without, held = bytes_per_shed(redis_url, 50, with_key=False)
    with_key, held_with_key = bytes_per_shed(redis_url, 50, with_key=True)
    assert 0 < without < with_key <= 300
    # A bucket (two if the sheds straddle a bucket's edge), and an index of keys beside it.
    assert held <= 2 and held_with_key <= 4
