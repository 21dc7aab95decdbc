"""``mxchaos explore``: generated fault schedules that shrink to a scenario.

A template (``template``: a scenario with an ``explore:`` section, named ``*.explore.yaml``)
declares a fault space; ``schedule`` draws schedules from it with Hypothesis and turns each
into a plain scenario; ``search`` runs them (each a real run), shrinks the first failure
within the budget and measures how often the minimal one reproduces; ``report`` writes
``explore.json`` and ``explore.html``; ``command`` is the sub-command.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TEMPLATE_SUFFIXES", "is_template"]

# A template is named *.explore.yaml, so that a folder of scenarios given to ``mxchaos run`` /
# ``validate`` / pytest skips it (it is no ordinary scenario: its ``explore`` key is refused there).
TEMPLATE_SUFFIXES = (".explore.yaml", ".explore.yml")


def is_template(path: Path) -> bool:
    """Whether ``path`` is named as an exploration template (``*.explore.yaml``)."""
    return path.name.endswith(TEMPLATE_SUFFIXES)
