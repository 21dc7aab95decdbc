"""Scenario building blocks shared by ``scenario.py``, the fault registry and the check registry.

A leaf module: it imports nothing from the harness, so fault and check modules can
declare their typed parameters with these types without import cycles.

- ``Strict``: the base of every scenario model: frozen, unknown keys rejected with
  a message that names the key and suggests the closest allowed one.
- ``Duration``: ``2s``, ``500ms``, ``1.5m``, ``1h`` or a bare number of seconds;
  always finite and positive (there is no "wait forever").
- ``Name``: process / fault / mark / host names.
- ``Ref``: a point on the timeline (a process event, a fault injection, a mark, a
  process start), resolved by checks.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

__all__ = [
    "Duration",
    "SourceOf",
    "Target",
    "Name",
    "Ref",
    "Scalar",
    "Strict",
    "custom_error",
    "format_seconds",
    "parse_duration",
]

_DURATION_RE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
DURATION_RULE = "a duration must be a positive finite number of seconds or a string like 500ms, 2s, 1.5m, 1h"


def custom_error(kind: str, message: str, **ctx: Any) -> PydanticCustomError:
    """A validation error whose message is taken verbatim (no ``{}`` templating of user text)."""
    return PydanticCustomError(kind, "{message}", {"message": message, **ctx})


def parse_duration(value: Any) -> float:
    """Seconds from ``2s`` / ``500ms`` / ``1.5m`` / ``1h`` / a number; positive and finite or an error."""
    if isinstance(value, bool):
        raise custom_error("duration", DURATION_RULE)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION_RE.match(value)
        if not match:
            raise custom_error("duration", DURATION_RULE)
        seconds = float(match["num"]) * _UNIT_SECONDS[match["unit"]]
    else:
        raise custom_error("duration", DURATION_RULE)
    if not math.isfinite(seconds) or seconds <= 0:
        raise custom_error("duration", DURATION_RULE)
    return seconds


def format_seconds(seconds: float) -> str:
    """``2.0`` -> ``2s``, ``0.25`` -> ``250ms``: for messages and report labels."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "string", "pattern": _DURATION_RE.pattern},
            ],
            "description": DURATION_RULE,
        }
    ),
]

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")]

# A value a `where` clause or a metric comparison may hold.
Scalar = str | int | float | bool | None


class Strict(BaseModel):
    """Frozen; an unknown key is an error naming it (and the closest allowed key)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)
    # a key this model once took -> what to write instead (its error names the replacement; no alias)
    RETIRED_KEYS: ClassVar[dict[str, str]] = {}

    @model_validator(mode="wrap")
    @classmethod
    def _reject_unknown_keys(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        # Every unknown key is its own error at its own location, and the known keys are
        # still validated, so one typo does not hide the other problems of the mapping.
        if not isinstance(data, Mapping):
            return handler(data)
        allowed = [field.alias or name for name, field in cls.model_fields.items()]
        unknown = [key for key in data if key not in allowed]
        if not unknown:
            return handler(data)
        errors: list[InitErrorDetails] = []
        for key in unknown:
            close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            message = f"unknown key {key!r}{hint} (allowed: {', '.join(allowed)})"
            if key in cls.RETIRED_KEYS:
                message = f"{key!r} is no longer a key: {cls.RETIRED_KEYS[str(key)]}"
            errors.append(
                InitErrorDetails(
                    type=custom_error("retired_key" if key in cls.RETIRED_KEYS else "unknown_key", message),
                    loc=(str(key),),
                    input=data[key],
                )
            )
        try:
            handler({k: v for k, v in data.items() if k not in unknown})
        except ValidationError as exc:
            for err in exc.errors():
                ctx = dict(err.get("ctx") or {})
                ctx.setdefault("message", err["msg"])
                errors.append(
                    InitErrorDetails(
                        type=PydanticCustomError(err["type"], "{message}", ctx),
                        loc=tuple(err["loc"]),
                        input=err["input"],
                    )
                )
        raise ValidationError.from_exception_data(cls.__name__, errors)


class Ref(Strict):
    """A point on the timeline, for check windows and orderings.

    Exactly one of: ``process`` (its ``event``, or its start by the harness when no
    event is given), ``fault`` (when that named fault was injected: its inject's invocation,
    or with ``at: landed`` its inject's answer, when the fault was in place), ``mark`` (a
    ``mark`` step). ``occurrence`` picks the first or last match; ``where`` filters
    event fields by equality.
    """

    process: Name | None = None
    event: str | None = None
    where: dict[str, Scalar] = Field(default_factory=dict)
    fault: Name | None = None
    at: Literal["invoked", "landed"] = "invoked"
    mark: Name | None = None
    occurrence: Literal["first", "last"] = "first"

    @model_validator(mode="after")
    def _exactly_one(self) -> Ref:
        given = [key for key in ("process", "fault", "mark") if getattr(self, key) is not None]
        if len(given) != 1:
            raise custom_error(
                "ref",
                f"a reference needs exactly one of process, fault, mark (got {', '.join(given) or 'none'})",
            )
        if (self.event is not None or self.where) and self.process is None:
            raise custom_error("ref", "'event' and 'where' belong to a process reference")
        if self.at != "invoked" and self.fault is None:
            raise custom_error("ref", "'at' belongs to a fault reference (at: landed, when its inject answered)")
        return self

    def describe(self) -> str:
        if self.fault:
            return f"fault {self.fault}" + (" landed" if self.at == "landed" else "")
        if self.mark:
            return f"mark {self.mark}"
        what = self.event or "start"
        where = "".join(f" {k}={v}" for k, v in self.where.items())
        return f"{self.process} {what}{where}" + (" (last)" if self.occurrence == "last" else "")


class SourceOf(Strict):
    """A fault target resolved when the fault fires: the source process that ``source_of``
    (a reader) is attempting right now, i.e. the process whose ``published`` worker id is
    the one in the reader's latest ``attempt_start``. Scenario authors cannot know in
    advance which candidate a reader tries first; the field incidents are about that one."""

    source_of: Name


Target = Annotated[
    Name | SourceOf,
    WithJsonSchema({
        "anyOf": [
            {"type": "string", "description": "a process name"},
            {"type": "object", "properties": {"source_of": {"type": "string"}}, "required": ["source_of"],
             "additionalProperties": False, "description": "the source a reader is attempting now"},
        ]
    }),
]
