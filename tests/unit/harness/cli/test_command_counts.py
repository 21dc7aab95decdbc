"""``at_least``: the one argparse type behind ``--repeat``, ``--maxfail``, ``--keep``, ``--jobs``
and ``mutate --min-kills``: every command refuses a count below its floor with the same words."""

from __future__ import annotations

import argparse

import pytest

from harness import cli
from harness.counts import at_least


def test_a_count_at_or_above_its_floor_is_taken() -> None:
    assert at_least(1, "a number of runs")("1") == 1
    assert at_least(0, "a number of reruns")("0") == 0
    assert at_least(1, "a number of runs")("12") == 12


@pytest.mark.parametrize(("text", "said"), [("0", "0: give a number of runs >= 1"),
                                            ("-3", "-3: give a number of runs >= 1"),
                                            ("two", "'two': give a number of runs (a whole number >= 1)"),
                                            ("1.5", "'1.5': give a number of runs (a whole number >= 1)")])
def test_a_count_below_its_floor_or_not_a_number_is_refused_naming_it(text: str, said: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        at_least(1, "a number of runs")(text)
    assert str(refused.value) == said


@pytest.mark.parametrize("argv", [["run", "--repeat", "0"], ["run", "--maxfail", "0"],
                                  ["nightly", "--repeat", "0"], ["nightly", "--keep", "0"],
                                  ["matrix", "--repeat", "0"], ["matrix", "--jobs", "0"],
                                  ["mutate", "--repeat", "-1"], ["mutate", "--min-kills", "-1"]])
def test_every_command_refuses_a_count_below_its_floor_before_it_runs(argv: list[str],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"argument {argv[1]}: {argv[2]}: give " in err
