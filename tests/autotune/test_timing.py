"""The one interleaved timing harness: its rotation, self-timed and failing variants, and the winner rule.

Checked with an injected clock and with given rates: never with a timed assertion.
"""

from __future__ import annotations

import pytest

from amp_backends.autotune.timing import MARGIN, Sample, Timings, interleaved


def test_interleaved_rotates_the_order_and_times_each_variant_per_round():
    order = []
    ticks = iter(range(1000))
    t = interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b"), "c": lambda: order.append("c")},
                    rounds=3, steps=2, units=10, clock=lambda: float(next(ticks)))
    assert order == ["a", "a", "b", "b", "c", "c", "b", "b", "c", "c", "a", "a", "c", "c", "a", "a", "b", "b"]
    assert t.rounds == 3 and t.rates["a"] == (20.0, 20.0, 20.0)  # 10 units x 2 steps in one tick
    with pytest.raises(ValueError, match="rounds >= 1"):
        interleaved({"a": lambda: None}, rounds=0)


def test_self_timed_variants_and_a_failing_variant_that_sits_out_the_rest():
    calls = {"b": 0}

    def flaky():
        calls["b"] += 1
        if calls["b"] == 2:
            raise RuntimeError("worker died")
        return Sample(100, 2.0)

    failed, rounds = [], []
    t = interleaved({"a": lambda: Sample(100, 1.0), "b": flaky}, rounds=4,
                    on_error=lambda name, exc: failed.append((name, str(exc))),
                    after_round=lambda r, so_far: rounds.append(len(so_far.rates["a"])))
    assert t.rates["a"] == (100.0,) * 4 and t.rates["b"] == (50.0,)
    assert failed == [("b", "worker died")] and calls["b"] == 2 and rounds == [1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="worker died"):
        calls["b"] = 1
        interleaved({"b": flaky}, rounds=2)


def test_a_variant_wins_only_when_it_wins_every_round_by_the_margin():
    assert MARGIN == 1.05
    assert Timings({"x": (120, 121, 119), "y": (100, 100, 100)}).winner(MARGIN) == "x"
    assert Timings({"x": (120, 103, 119), "y": (100, 100, 100)}).winner(MARGIN) is None  # one round within 5%
