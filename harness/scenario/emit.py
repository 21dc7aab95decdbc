"""Writing a scenario back out as a file a person reads: ``scenario_text``.

A scenario model becomes YAML with only the keys that differ from their defaults (every
shipped scenario round-trips through that form), top-level sections in block style, each
step and check on one line (flow style) with comment lines above the ones a caller
annotates, and a header comment. The text is parsed again before it is returned, and must
mean exactly the model it was written from (``EmitError`` otherwise): a written scenario is
always one ``mxchaos validate`` accepts. ``mxchaos replay`` and ``mxchaos explore`` write
their scenarios with it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from harness.errors import HarnessError, ScenarioInvalid
from harness.scenario.document import Scenario
from harness.scenario.load import parse_scenario

__all__ = ["EmitError", "compact_data", "scenario_text"]


class EmitError(HarnessError):
    """The text written for a scenario does not read back as that scenario (a bug here)."""


def compact_data(scenario: Scenario) -> dict[str, Any]:
    """The scenario as plain data without the keys at their defaults (the full form when the
    compact one would not read back as the same scenario)."""
    full = scenario.model_dump(mode="json", by_alias=True)
    compact = scenario.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    try:
        again = Scenario.model_validate(compact)
    except ValueError:
        return full
    return compact if again.model_dump(mode="json", by_alias=True) == full else full


def _flow(item: Any) -> str:
    text = yaml.safe_dump(item, default_flow_style=True, width=math.inf, sort_keys=False, allow_unicode=True)
    return text.strip().removesuffix("...").strip()


def _comment(line: str, indent: str = "") -> str:
    return f"{indent}# {line}".rstrip() if line else f"{indent}#"


def scenario_text(
    data: Mapping[str, Any],
    *,
    header: Sequence[str] = (),
    step_comments: Mapping[int, Sequence[str]] | None = None,
    file: str | Path = "<written scenario>",
) -> str:
    """YAML text of scenario ``data`` (as ``compact_data`` returns it): ``header`` lines as
    comments on top, ``step_comments[i]`` as comments above top-level step ``i``. Raises
    ``EmitError`` when the text does not validate or does not read back as ``data`` means."""
    step_comments = step_comments or {}
    lines = [_comment(h) for h in header]
    for key, value in data.items():
        if key in ("steps", "checks") and isinstance(value, list):
            lines.append(f"{key}:")
            for i, item in enumerate(value):
                if key == "steps":
                    lines += [_comment(c, "  ") for c in step_comments.get(i, ())]
                lines.append(f"  - {_flow(item)}")
        else:
            style = None if isinstance(value, dict | list) else False  # None: leaf collections in flow style
            dumped = yaml.safe_dump({key: value}, default_flow_style=style, width=110, sort_keys=False, allow_unicode=True)
            lines += dumped.rstrip("\n").splitlines()
    text = "\n".join(lines) + "\n"
    try:
        parsed = parse_scenario(text, file)
    except ScenarioInvalid as exc:
        raise EmitError(f"the scenario written for {data.get('name')!r} is not valid:\n{exc.render()}") from None
    try:
        meant = Scenario.model_validate(dict(data)).model_dump(mode="json", by_alias=True)
    except ValueError as exc:
        raise EmitError(f"the scenario data for {data.get('name')!r} is not valid: {exc}") from None
    if parsed.model_dump(mode="json", by_alias=True) != meant:
        raise EmitError(f"the scenario written for {data.get('name')!r} does not read back as the same scenario")
    return text
