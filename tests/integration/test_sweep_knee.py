"""The knee of a capacity curve (Kneedle over log rate)."""
from llm_replay.replay.sweep import knee


def test_knee_is_where_latency_turns_up():
    assert knee([1, 2, 4, 8, 16, 32], [10, 11, 12, 14, 1500, 3000]) == 8
    assert knee([1, 2.828, 8, 64], [22, 714, 3449, 4613]) == 2.828


def test_no_knee_without_a_bend():
    assert knee([1, 2], [1, 5]) is None                 # too few points
    assert knee([1, 2, 4], [5, 5, 5]) is None           # flat
    assert knee([1, 2, 4, 8], [100, 900, 990, 1000]) is None  # concave: already saturated at the start
