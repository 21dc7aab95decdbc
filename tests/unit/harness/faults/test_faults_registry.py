"""The fault registry and base: registration rules, ``make_fault`` refusing a spec of another
kind, ``undo_on_failure``, and every registered kind having its own unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest

from harness.errors import FaultError, RunInterrupted
from harness.faults import REGISTRY, Fault, FaultContext, FaultSpec, Injected, make_fault, register, undo_on_failure
from harness.faults.process import KillSpec, PauseSpec
from harness.spec import Name


class NoopSpec(FaultSpec):
    kind: Literal["noop"]
    target: Name


class Noop(Fault[NoopSpec, None]):
    kind = "noop"
    Spec = NoopSpec

    def inject(self, ctx: FaultContext) -> Injected[None]:
        return Injected(None, {})


def test_register_checks_the_kind_and_its_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("harness.faults.REGISTRY", dict(REGISTRY))
    from harness import faults

    assert register(Noop) is Noop and faults.REGISTRY["noop"] is Noop
    assert register(Noop) is Noop  # the same class again: fine

    class Other(Noop):
        pass

    with pytest.raises(ValueError, match="fault kind 'noop' registered twice"):
        register(Other)

    class Mislabelled(Noop):
        kind = "mislabelled"

    with pytest.raises(ValueError, match=r"NoopSpec.kind must be Literal\['mislabelled'\]"):
        register(Mislabelled)


def test_make_fault_refuses_a_spec_of_another_kind() -> None:
    class Impostor(KillSpec):
        kind: Literal["pause"]  # type: ignore[assignment]  # a pause that is not a PauseSpec

    with pytest.raises(TypeError, match="fault f: a pause fault takes a PauseSpec, not a Impostor"):
        make_fault(Impostor(kind="pause", target="a"), "f")
    fault = make_fault(PauseSpec(kind="pause", target="a"), "f")
    assert fault.name == "f" and fault.spec == PauseSpec(kind="pause", target="a")


def test_undo_on_failure_runs_the_undos_last_first_on_any_exception() -> None:
    done: list[str] = []
    with pytest.raises(RunInterrupted), undo_on_failure() as undo:
        undo.callback(done.append, "first")
        undo.callback(done.append, "second")
        raise RunInterrupted(2)
    assert done == ["second", "first"]


def test_undo_on_failure_drops_the_undos_when_the_block_completes() -> None:
    done: list[str] = []
    with undo_on_failure() as undo:
        undo.callback(done.append, "undo")
    assert done == []


def test_a_failing_undo_does_not_hide_the_error() -> None:
    def broken() -> None:
        raise OSError("undo broke")

    with pytest.raises(FaultError, match="the cause") as raised, undo_on_failure() as undo:
        undo.callback(broken)
        raise FaultError("the cause")
    assert raised.value.__notes__ == ["undoing it failed too: OSError: undo broke"]


def test_references_are_declared_on_the_spec() -> None:
    spec = KillSpec(kind="kill", target="a")
    assert spec.process_refs() == ("a",) and spec.proxy_refs() == () and spec.host_refs() == ()
    assert REGISTRY["partition"].Spec.host_kinds == ("netns",) and REGISTRY["kill"].Spec.host_kinds == ()


def test_every_fault_kind_has_unit_tests() -> None:
    here = Path(__file__).parent
    text = "".join(p.read_text() for p in here.glob("test_faults_*.py") if p.name != Path(__file__).name)
    untested = [kind for kind, cls in REGISTRY.items() if cls.Spec.__name__ not in text]
    assert untested == []


def heal_signature(cls: type[Fault[Any, Any]]) -> tuple[str, ...]:
    return tuple(cls.heal.__code__.co_varnames[: cls.heal.__code__.co_argcount])


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_healable_kinds_define_heal_and_the_others_do_not(kind: str) -> None:
    cls = REGISTRY[kind]
    assert heal_signature(cls) == ("self", "ctx", "token")
    assert (cls.heal is not Fault.heal) == cls.healable
