"""The border between the harness and mxref has one home per rule: every option a scenario
may give an mxref process (``harness.scenario.models``: ``ServerOptions``, ``SourceOptions``,
``ReaderOptions``) is a flag ``python -m mxref ROLE`` accepts, with the same type (a value the
harness passes parses back to itself) and, where the harness states one, the same default; a
``None`` default leaves mxref's own in force."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from harness.scenario.models import Options, ReaderOptions, ServerOptions, SourceOptions
from mxref.__main__ import parse_argv
from mxref.options import RoleFlags

ROLES: dict[str, type[Options]] = {"server": ServerOptions, "source": SourceOptions, "reader": ReaderOptions}


def _samples(model: type[BaseModel], key: str) -> list[Any]:
    """Values of the field's type the harness may pass (every choice of a ``Literal``)."""
    field = model.model_fields[key]
    annotation = field.annotation
    kinds = [a for a in typing.get_args(annotation) if a is not type(None)] if isinstance(
        annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union else [annotation]
    assert len(kinds) == 1, f"{model.__name__}.{key}: one type (or None), not {annotation}"
    kind = kinds[0]
    if typing.get_origin(kind) is typing.Annotated:  # a Duration: a float of seconds
        kind = typing.get_args(kind)[0]
    if typing.get_origin(kind) is Literal:
        return list(typing.get_args(kind))
    low = next((m.ge for m in field.metadata if hasattr(m, "ge")), None)
    samples: dict[Any, list[Any]] = {bool: [True], int: [3 if low is None else low + 3], float: [2.5], str: ["x"]}
    assert kind in samples, f"{model.__name__}.{key}: no sample for {kind}"
    return samples[kind]


def _parsed(role: str, argv: list[str]) -> RoleFlags:
    return parse_argv([role, *argv])


def _cases() -> list[tuple[str, str]]:
    return [(role, key) for role, model in ROLES.items() for key in model.model_fields]


@pytest.mark.parametrize(("role", "key"), _cases(), ids=[f"{r}.{k}" for r, k in _cases()])
def test_every_harness_option_is_an_mxref_flag_of_the_same_type_and_default(role: str, key: str) -> None:
    model = ROLES[role]
    for sample in _samples(model, key):
        argv = model(**{key: sample}).argv()
        try:
            args = _parsed(role, argv)
        except SystemExit:
            pytest.fail(f"python -m mxref {role} refuses {argv} (harness option {model.__name__}.{key})")
        got = getattr(args, key)
        got = str(got) if isinstance(got, Path) else got
        assert got == sample and type(got) is type(sample), (
            f"{model.__name__}.{key}={sample!r} reaches mxref {role} as {got!r}")
    default = model.model_fields[key].default
    if default is not None:
        assert getattr(_parsed(role, []), key) == default, f"{model.__name__}.{key}: the harness's default differs"


def test_the_border_test_catches_a_flag_mxref_lacks() -> None:
    class Wider(ServerOptions):
        no_such_flag: int | None = None

    with pytest.raises(SystemExit):
        _parsed("server", Wider(no_such_flag=1).argv())
