"""``mxchaos explore``: generated fault schedules that shrink to a scenario.

A template (``template``: a scenario with an ``explore:`` section, named ``*.explore.yaml``)
declares a fault space; ``schedule`` draws schedules from it with Hypothesis and turns each
into a plain scenario; ``search`` runs them (each a real run), shrinks the first failure
within the budget and measures how often the minimal one reproduces; ``report`` writes
``explore.json`` and ``explore.html``; ``command`` is the sub-command.
"""

from __future__ import annotations

from harness.scenario.select import TEMPLATE_SUFFIXES, is_template

__all__ = ["TEMPLATE_SUFFIXES", "is_template"]
