"""Whole-number options with a floor (``--repeat``, ``--maxfail``, ``--keep``, ``--jobs``): one
argparse type, so every command refuses ``--repeat 0`` the same way, before it does anything."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["at_least"]


def at_least(floor: int, what: str) -> Callable[[str], int]:
    """An argparse ``type``: ``text`` as an int that is ``floor`` or more, else the error names
    the value and the rule (``0: give a number of runs >= 1``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give {what} (a whole number >= {floor})") from None
        if value < floor:
            raise argparse.ArgumentTypeError(f"{value}: give {what} >= {floor}")
        return value

    parse.__name__ = f"at_least_{floor}"
    return parse
