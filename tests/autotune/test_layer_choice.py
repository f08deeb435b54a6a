"""The float32-layers choice as data: its verdict under noise, and its round trip through the dictionary kept."""

from __future__ import annotations

import random

from amp_backends.autotune.layer_choice import FLOAT32, NOISE, PLAN, Measurement, verdict_of


def test_a_side_is_chosen_only_when_it_wins_every_round_by_the_margin():
    assert verdict_of((100, 100, 100), (110, 111, 112)) == FLOAT32
    assert verdict_of((110, 111, 112), (100, 100, 100)) == PLAN
    assert verdict_of((100, 120, 90), (110, 100, 100)) == NOISE


def test_ten_noisy_measurements_of_equal_sides_give_one_answer():
    # This machine's speed moves by up to 13% between identical configurations within one run: two equal sides
    # under that noise must never decide the layer plan.
    answers = set()
    for seed in range(10):
        rng = random.Random(seed)
        noisy = [tuple(100 * rng.uniform(0.87, 1.13) for _ in range(5)) for _ in range(2)]
        answers.add(verdict_of(*noisy))
    assert answers == {NOISE}


def test_a_measurement_round_trips_through_its_dict():
    m = Measurement(FLOAT32, "mixed_bfloat16", 100.0, 130.0, (95.0, 104.0), (120.0, 140.0), 5, 2)
    again = Measurement.from_dict(m.to_dict())
    assert again == m and again.float32 and round(again.ratio, 2) == 1.3
    assert "every round" in str(m) and "within noise" in str(Measurement(NOISE, "mixed_bfloat16"))
