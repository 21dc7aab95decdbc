"""The one name of each outcome, and what it means: the terminal, the pages, ``summary.json``,
``invocation.json``, JUnit's messages, ``--json`` and the glossary all take their words here.

A run's verdict is saved lower case (``verdict.json``: ``xfail``) and shown upper case (``XFAIL``);
a cell of ``--repeat N`` runs (``harness.record.rates``) is named by the same word when it means
the same thing: a known defect that showed is ``XFAIL`` for one run and for N runs, one that did
not show is ``XPASS``. ``FIXED?`` and ``FLAKY`` exist only for N runs. Records written before
the names were one (``REPRODUCED``, ``NOT_REPRODUCED``) read as the new names (``canonical``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OUTCOMES", "RENAMED", "Outcome", "canonical", "meaning"]


@dataclass(frozen=True)
class Outcome:
    name: str  # as shown: PASS, XFAIL, ...; a run's verdict saves it lower case
    meaning: str  # the glossary's line
    fails_run: bool  # whether it makes ``mxchaos run`` exit 1


OUTCOMES: tuple[Outcome, ...] = (
    Outcome("PASS", "every check passed (under --repeat N: in all N runs)", False),
    Outcome("FAIL", "a step failed or a check is false", True),
    Outcome("FLAKY", "under --repeat N: passed in some runs only", True),
    Outcome("UNKNOWN", "a check could not judge (what it needs is not in the timeline)", True),
    Outcome("HANG", "the run stopped making progress and was cut", True),
    Outcome("ERROR", "the harness failed, was interrupted or could not heal a fault", True),
    Outcome("NOT_EXERCISED", "a fault had no effect: the scenario did not happen, so it is judged neither way", True),
    Outcome("XFAIL", "a scenario's known defect showed, as expected (under --repeat N: in at least one run)", False),
    Outcome("XPASS", "a scenario's known defect did not show (under --repeat N: in no run, too few to call it fixed)", False),
    Outcome("FIXED?", "under --repeat N: a known defect showed in no run and the 95% bound is below its measured rate", False),
    Outcome("SKIP", "nothing ran: this machine lacks what the scenario needs (root, toxiproxy, a subject)", False),
)

RENAMED = {"REPRODUCED": "XFAIL", "NOT_REPRODUCED": "XPASS"}  # the cells' words in older records

_BY_NAME = {o.name: o for o in OUTCOMES}


def canonical(word: str) -> str:
    """A word of any record in this vocabulary: an older word renamed (``REPRODUCED``, any case,
    is ``XFAIL``), any other returned as given (a run's ``xfail`` stays lower case)."""
    return RENAMED.get(word.upper(), word)


def meaning(word: str) -> str:
    """What an outcome means ('' for a word of no outcome)."""
    found = _BY_NAME.get(canonical(word).upper())
    return found.meaning if found is not None else ""
