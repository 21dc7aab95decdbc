"""A known defect per NIXL version: expected vs observed in each column of the matrix.

A scenario's ``known_defect`` (its text) may name the NIXL versions it was measured on in
an optional top-level list ``defect_versions: ["1.5.1", "1.4"]`` (an entry matches that
version and, without a third part, every ``1.4.x``), validated with the rest of the scenario
(``harness.scenario``). Without the list the defect is expected on every version (what
``known_defect`` means to ``mxchaos run``).

Per column: ``expected`` (the version is listed), ``observed``: ``reproduced`` (a run ended
``xfail``: a check was false), ``not reproduced`` (every run that got far enough ended
``xpass``), ``inconclusive`` (no run got to the checks: error, hang, failed step, skip). A
*headline* is a column where they disagree: a defect expected and not reproduced (fixed in
that release?) or reproduced where it is not listed (brought back, or never measured there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from harness.record.saved import DefectStatus, KnownDefect

if TYPE_CHECKING:
    from harness.record.cells import Column
    from harness.scenario import Scenario

__all__ = ["column_defects", "defect_here", "defect_info", "defect_status", "version_matches"]


def defect_info(scenario: Scenario) -> KnownDefect | None:
    """The known defect in force in a validated scenario as it is played (None: none in force):
    its text, ``versions`` (None: every one), whose defect it is (``servers``: ``defect_servers``;
    ``subjects``: the client of ``subject_defects`` whose own defect is in force; None: anyone's)."""
    if not scenario.known_defect:
        return None
    listed = [v for v in scenario.defect_versions if v.strip()] or None
    return KnownDefect(text=" ".join(scenario.known_defect.split()), versions=listed,
                       servers=list(scenario.defect_servers) or None,
                       subjects=[scenario.defect_subject] if scenario.defect_subject else None)


def column_defects(scenario: Scenario, columns: Sequence[Column]) -> dict[str, KnownDefect]:
    """Column id -> the known defect in force where that column plays ``scenario`` (``defect_info``
    of the scenario as the column's subjects play it: settled in the one place that decides,
    ``harness.scenario.subjects.with_subjects``); a column where none is in force is left out."""
    from harness.scenario.subjects import with_subjects
    from harness.subjects.mx_server import parse_subjects

    out: dict[str, KnownDefect] = {}
    for column in columns:
        arg = column.subject_arg()
        played = with_subjects(scenario, parse_subjects(arg[1])) if arg else scenario
        info = defect_info(played)
        if info is not None:
            out[column.id] = info
    return out


def defect_here(defect: KnownDefect, server: str) -> bool:
    """Whether a column whose servers are played by ``server`` (``mxref``, ``modelexpress``; "":
    each scenario's own) runs the defect at all: a defect of other servers is not judged there
    (its runs are plain scenarios: ``harness.scenario.subjects.with_subjects``)."""
    servers = defect.servers
    return not servers or not server or server in servers


def version_matches(version: str, listed: Sequence[str]) -> bool:
    """``1.5.1`` matches ``1.5.1`` and ``1.5`` (a prefix at a dot), not ``1.5.10`` for ``1.5.1``."""
    return any(version == v or version.startswith(v + ".") for v in listed)


def defect_status(defect: KnownDefect, nixl: str, verdicts: Mapping[str, int]) -> DefectStatus:
    """Expected vs observed for one cell; ``headline`` is a sentence when they disagree."""
    listed = defect.versions
    expected = True if listed is None else version_matches(nixl, listed)
    xfail, xpass = verdicts.get("xfail", 0), verdicts.get("xpass", 0)
    n = sum(verdicts.values())
    if xfail:
        observed = "reproduced"
    elif xpass:
        observed = "not reproduced"
    else:
        observed = "inconclusive"
    headline = None
    if expected and observed == "not reproduced":
        headline = f"expected on NIXL {nixl}, not reproduced in {xpass} of {n} runs: fixed in this release?"
    elif not expected and observed == "reproduced":
        headline = f"not listed for NIXL {nixl}, but reproduced in {xfail} of {n} runs: brought back (or never measured here)"
    return DefectStatus(expected=expected, observed=observed, reproduced={"k": xfail, "n": n}, headline=headline)
