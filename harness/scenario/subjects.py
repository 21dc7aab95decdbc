"""Who plays a scenario's processes when a command names subjects (``mxchaos run --subject``,
a matrix's subject and server columns): the scenario played as ``parse_subjects`` says."""

from __future__ import annotations

from harness.scenario.document import Scenario
from harness.scenario.models import ReaderProcess, ServerProcess, SourceProcess
from harness.scenario.stores import with_store
from harness.subjects.mx_server import SERVER_SUBJECTS, server_of_subject

__all__ = ["settle_subject_defect", "with_subjects"]


def with_subjects(sc: Scenario, subjects: dict[str, str]) -> Scenario:
    """``sc`` played as ``subjects`` (``parse_subjects``) says: ``client`` sets the scenario's
    ``subject`` (sources and readers without their own), ``source``/``reader`` every process of
    that role, ``server`` every server (a ModelExpress server gets the scenario's Redis store). A
    ``known_defect`` of other servers than those now playing (``defect_servers``) is dropped: the
    run is judged as a plain scenario."""
    if "client" in subjects:
        sc = sc.with_subject(subjects["client"])
    processes = dict(sc.processes)
    for name, spec in sc.processes.items():
        role_subject = subjects.get(spec.role)
        if role_subject is not None and isinstance(spec, ServerProcess | SourceProcess | ReaderProcess):
            processes[name] = spec.model_copy(update={"subject": role_subject})
    sc = sc.model_copy(update={"processes": processes})
    if sc.defect_servers and not any(isinstance(spec, ServerProcess) and (spec.subject or "mxref") in sc.defect_servers
                                     for spec in processes.values()):  # another server's defect: judged as plain
        sc = sc.model_copy(update={"known_defect": None, "defect_rate": None, "defect_versions": (), "defect_servers": ()})
    sc = settle_subject_defect(sc)
    needs_store = any(isinstance(spec, ServerProcess) and server_of_subject(spec) in SERVER_SUBJECTS
                      and spec.store is None for spec in processes.values())
    return with_store(sc, "redis") if needs_store else sc


DEFECT_KEYS = ("known_defect", "defect_rate", "defect_versions", "defect_subjects")


def settle_subject_defect(sc: Scenario) -> Scenario:
    """``sc`` with its client's known defect (``defect_subjects``) in force only while one of those
    clients plays a source or reader: otherwise set aside (the run is judged as a plain scenario),
    and restored when such a client plays again (``mxchaos run --subject modelexpress`` on a
    file whose default is mxref). Called when a file is parsed and by ``with_subjects``."""
    stash = sc._subject_defect or ({k: getattr(sc, k) for k in DEFECT_KEYS} if sc.defect_subjects else None)
    if stash is None:
        return sc
    players = {p for name, p in sc.players().items() if sc.role(name) in ("source", "reader")}
    applies = bool(players & set(stash["defect_subjects"]))
    out = sc.model_copy(update=stash if applies else {"known_defect": None, "defect_rate": None,
                                                      "defect_versions": (), "defect_subjects": ()})
    out._subject_defect = stash
    return out
