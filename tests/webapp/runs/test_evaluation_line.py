"""A run's log names how an evaluation decoded ("greedy", "temperature 1"), not a bare "T=0"."""

from __future__ import annotations

from webapp.runs.sink import evaluation_line


def test_it_names_the_decoding():
    result = {"step": 4, "temperature": 0.0, "n": 8, "team": {"success": 0.5}, "agents": {"tool": {"success": 0.25}}}
    assert evaluation_line(result) == "held-out at step 4 (greedy, 8 tasks): team success 0.500 · tool 0.25"
    assert evaluation_line({**result, "temperature": 1.0}).startswith("held-out at step 4 (temperature 1, 8 tasks)")
