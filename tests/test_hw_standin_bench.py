"""benchmarks/hw_standin.py: the spread it prints last (the worst M's max / min - 1 over
the calibrations of one warm-up), and bad input refused before any GPU work."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import hw_standin  # noqa: E402


def test_spread_is_the_worst_ms_range_at_one_warm_up():
    rows = [{"hot_s": 0.2, "chain_s": {"4096": 2.0, "8192": 4.0}},
            {"hot_s": 0.2, "chain_s": {"4096": 2.06, "8192": 4.04}},
            {"hot_s": 1.0, "chain_s": {"4096": 2.5, "8192": 9.0}}]
    assert hw_standin.spread(rows, 0.2) == pytest.approx(0.03)
    assert hw_standin.spread(rows, 1.0) == 0.0
    assert hw_standin.spread(rows, 0.5) == 0.0


@pytest.mark.parametrize("args, says", [(["--hot", "x"], "--hot x: expected seconds"),
                                        (["--rounds", "0"], "--rounds: at least 1"),
                                        (["--profile", "no-such"], "no-such")])
def test_bad_input_exits_2_naming_it(args, says, capsys):
    with pytest.raises(SystemExit) as e:
        hw_standin.main(args)
    assert e.value.code == 2 and says in capsys.readouterr().err
