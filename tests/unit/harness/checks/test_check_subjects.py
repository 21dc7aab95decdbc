"""A check declared for some subjects (``subjects:`` on the check: who plays the sources and
readers) is judged only where one of its processes is played by a subject it names, as
``servers:`` does for servers (``harness.checks.not_for_subject``). Nothing here starts a process."""

from __future__ import annotations

import pytest
from fixtures.defect_scenarios import CLIENT_DEFECT

from harness.checks import NOT_FOR_SUBJECT
from harness.errors import ScenarioInvalid
from harness.judge.verdict import judge, verdict_of
from harness.record.timeline import History
from harness.scenario import parse_scenario

DOC = """\
name: subjects_key
processes:
  server: {{role: server}}
  source-1: {{role: source}}
  reader-1: {{role: reader{reader_subject}}}
steps:
  - start: [server, source-1, reader-1]
checks:
  - count: {{name: mxref's own event, process: reader-1, event: fallback, min: 1{subjects}}}
  - count: {{name: every peer, process: server, event: fallback, min: 1{subjects}}}
"""


def doc(subjects: str = "", reader_subject: str = "") -> str:
    return DOC.format(subjects=f", subjects: {subjects}" if subjects else "",
                      reader_subject=f", subject: {reader_subject}" if reader_subject else "")


def test_a_check_for_mxref_is_not_judged_where_the_real_client_plays_its_process() -> None:
    sc = parse_scenario(doc("[mxref]")).with_subject("modelexpress")
    own, every = judge(sc, History(()))[:2]  # nothing happened: judged, both would fail
    assert own.valid is True and own.not_judged == NOT_FOR_SUBJECT
    assert own.summary.startswith("not for this subject: for mxref (subjects:)")
    assert "reader-1 played by modelexpress" in own.summary
    assert every.not_judged == NOT_FOR_SUBJECT  # no peer of its own: every source and reader of the run


def test_a_check_for_mxref_is_judged_where_mxref_plays_one_of_its_processes() -> None:
    results = judge(parse_scenario(doc("[mxref]")), History(()))
    assert results[0].valid is False and results[0].not_judged is None
    assert verdict_of("completed", results) != "pass"
    # a mixed fleet: the reader is the real client's, the source mxref's; the process-less check concerns both
    mixed = judge(parse_scenario(doc("[mxref]", reader_subject="modelexpress")), History(()))
    assert mixed[0].not_judged == NOT_FOR_SUBJECT  # its process, reader-1, is the real client's
    assert mixed[1].not_judged is None and mixed[1].valid is False  # source-1 is mxref's: judged


def test_an_undeclared_check_is_judged_for_every_subject() -> None:
    sc = parse_scenario(doc()).with_subject("modelexpress")
    assert sc.check_entries()[0][1].subjects is None
    assert all(r.not_judged is None and r.valid is False for r in judge(sc, History(()))[:2])


@pytest.mark.parametrize(("subjects", "message"), [
    ("[]", "checks[0].count.subjects: name the subjects (who plays the sources and readers) the check is for "
           "(mxref, modelexpress), or drop the key: it is for every subject"),
    ("[mxref, mxref]", "checks[0].count.subjects: name each subject once"),
    ("[vllm]", "checks[0].count.subjects[0]: Input should be 'mxref' or 'modelexpress' (got 'vllm')"),
])
def test_a_checks_subjects_are_validated_naming_the_key_and_the_rule(subjects: str, message: str) -> None:
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(doc(subjects))
    assert message in info.value.render()


# --- a known defect of one client (``subject_defects``): in force only while that client plays ---


def test_a_clients_defect_is_set_aside_while_another_subject_plays_and_restored() -> None:
    from harness.scenario.subjects import with_subjects

    plain = parse_scenario(CLIENT_DEFECT)  # its default subject is mxref: judged as a plain scenario
    assert plain.known_defect is None and plain.defect_rate is None and plain.defect_subject is None
    real = with_subjects(plain, {"client": "modelexpress"})
    assert real.known_defect == "the real client loads a tampered checkpoint without a check"
    assert real.defect_rate == "1/1" and real.defect_subject == "modelexpress"
    back = with_subjects(real, {"client": "mxref"})
    assert back.known_defect is None and back.defect_subject is None
    mixed = with_subjects(plain, {"reader": "modelexpress"})  # the reader is the client's: in force
    assert mixed.known_defect is not None and mixed.defect_subject == "modelexpress"


def test_the_retired_spelling_is_refused_naming_the_file_the_key_and_its_replacement() -> None:
    old = CLIENT_DEFECT.replace("subject_defects:\n  modelexpress:\n    known_defect: the real client loads a tampered checkpoint "
                         "without a check\n    defect_rate: 1/1\n",
                         "known_defect: the real client loads a tampered checkpoint without a check\n"
                         "defect_rate: 1/1\ndefect_subjects: [modelexpress]\n")
    assert "defect_subjects" in old
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(old, file="old.yaml")
    text = info.value.render()
    assert "old.yaml:4: defect_subjects: 'defect_subjects' is no longer a key: a client's own known defect is written " \
           "under subject_defects, e.g. subject_defects: {modelexpress: {known_defect: ..., defect_rate: 1/1}}" in text
    assert "did you mean" not in text  # no guess at a near key: the replacement is named
