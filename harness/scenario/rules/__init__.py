"""Cross-reference rules: what spans keys (names exist, roles fit, faults and marks are
defined, events and their fields are mxref's, budgets fit), one module per area.

``cross_references(cx)`` runs them all on a ``Context`` (a valid scenario, or the parts
of an invalid one that validated) and returns the issues found.
"""

from __future__ import annotations

from harness.scenario.rules.checks import check_checks
from harness.scenario.rules.context import Context, SemanticIssue
from harness.scenario.rules.faults import FaultRefs, check_faults, fault_refs
from harness.scenario.rules.processes import check_processes
from harness.scenario.rules.steps import check_steps, collect_names

__all__ = ["Context", "FaultRefs", "SemanticIssue", "cross_references", "fault_refs"]


def cross_references(cx: Context) -> list[SemanticIssue]:
    check_processes(cx)
    collect_names(cx)
    check_steps(cx)
    check_faults(cx)
    check_checks(cx)
    return cx.issues
