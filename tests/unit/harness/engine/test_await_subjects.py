"""An event await declared for some subjects (``subjects:`` on ``await``: an event only mxref emits)
is passed over, recorded, where another subject plays its process, and awaited where one it names
does (``harness.engine.steps.StepInterpreter``). Nothing here starts a process."""

from __future__ import annotations

from typing import Any

import pytest

from harness.engine.steps import StepInterpreter
from harness.errors import ScenarioInvalid
from harness.record.timeline import Timeline
from harness.scenario import AwaitEvent, AwaitStep, parse_scenario
from harness.scenario.subjects import with_subjects

DOC = """\
name: await_subjects
processes:
  server: {{role: server}}
  source-1: {{role: source}}
steps:
  - start: [server, source-1]
  - await: {{process: source-1, event: heartbeat, where: {{ok: true}}{subjects}}}
"""


class Awaited(Exception):
    """The fake clock or table was asked: the step awaited the event."""


class FakeTable:
    def __getattr__(self, name: str) -> Any:
        raise Awaited(name)


def interpreter(subject: str) -> tuple[StepInterpreter, Timeline, AwaitEvent]:
    sc = with_subjects(parse_scenario(DOC.format(subjects=", subjects: [mxref]")), {"client": subject})
    step = sc.steps[1]
    assert isinstance(step, AwaitStep) and isinstance(step.await_, AwaitEvent)
    timeline = Timeline()
    none: Any = None
    interp = StepInterpreter(sc, timeline=timeline, clock=FakeTable(), table=FakeTable(), nemesis=none, scraper=none,  # type: ignore[arg-type]
                             stacks=none, start=none, deferred=none)
    return interp, timeline, step.await_


def test_an_await_for_mxref_is_passed_over_where_the_real_client_plays_its_process() -> None:
    interp, timeline, arg = interpreter("modelexpress")
    assert interp._await_event("2", arg) == {"not_for_subject": "modelexpress"}
    (entry,) = [e for e in timeline.entries() if e.f == "await_passed_over"]
    assert entry.get("process") == "source-1" and entry.get("player") == "modelexpress" and entry.get("subjects") == ["mxref"]


def test_an_await_for_mxref_is_awaited_where_mxref_plays_its_process() -> None:
    interp, timeline, arg = interpreter("mxref")
    with pytest.raises(Awaited):
        interp._await_event("2", arg)
    assert not [e for e in timeline.entries() if e.f == "await_passed_over"]


@pytest.mark.parametrize(("subjects", "message"), [("[]", "steps[1].await.subjects"), ("[vllm]", "steps[1].await.subjects")])
def test_an_awaits_subjects_are_validated(subjects: str, message: str) -> None:
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(DOC.format(subjects=f", subjects: {subjects}"))
    assert message in info.value.render()
