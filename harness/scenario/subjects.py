"""Who plays a scenario's processes when a command names subjects (``mxchaos run --subject``,
a matrix's subject and server columns): the scenario played as ``parse_subjects`` says."""

from __future__ import annotations

from typing import Any

from harness.scenario.document import Scenario
from harness.scenario.models import ReaderProcess, ServerProcess, SourceProcess
from harness.scenario.stores import with_store
from harness.subjects.mx_server import SERVER_SUBJECTS, server_of_subject

__all__ = ["settle_subject_defect", "with_subjects"]


def with_subjects(sc: Scenario, subjects: dict[str, str]) -> Scenario:
    """``sc`` played as ``subjects`` (``parse_subjects``) says: ``client`` sets the scenario's
    ``subject`` (sources and readers without their own), ``source``/``reader`` every process of
    that role, ``server`` every server (a ModelExpress server gets the scenario's Redis store). Its
    known defect is settled for the new players (``settle_subject_defect``)."""
    if "client" in subjects:
        sc = sc.with_subject(subjects["client"])
    processes = dict(sc.processes)
    for name, spec in sc.processes.items():
        role_subject = subjects.get(spec.role)
        if role_subject is not None and isinstance(spec, ServerProcess | SourceProcess | ReaderProcess):
            processes[name] = spec.model_copy(update={"subject": role_subject})
    sc = settle_subject_defect(sc.model_copy(update={"processes": processes}))
    needs_store = any(isinstance(spec, ServerProcess) and server_of_subject(spec) in SERVER_SUBJECTS
                      and spec.store is None for spec in processes.values())
    return with_store(sc, "redis") if needs_store else sc


DEFECT_KEYS = ("known_defect", "defect_rate", "defect_versions", "defect_servers", "subject_defects")
_NONE: dict[str, Any] = {"known_defect": None, "defect_rate": None, "defect_versions": (), "defect_servers": ()}


def settle_subject_defect(sc: Scenario) -> Scenario:
    """``sc`` with the known defect in force for who plays it now, the one place that decides: a
    client's own (``subject_defects``) while that client plays a source or reader
    (``Scenario.defect_subject`` names it); else the file's general ``known_defect``, unless it
    names other servers (``defect_servers``) than those now playing: then none (the run is judged
    as a plain scenario). The file's defects as written are kept aside (``_subject_defect``), so a
    later call (``with_subjects``: ``mxchaos run --subject``, a matrix column) decides afresh.
    Called when a file is parsed and by ``with_subjects``."""
    stash = sc._subject_defect
    if stash is None and not (sc.known_defect or sc.subject_defects):
        return sc
    if stash is None:
        stash = {k: getattr(sc, k) for k in DEFECT_KEYS}
    players = {p for name, p in sc.players().items() if sc.role(name) in ("source", "reader")}
    servers = {spec.subject or "mxref" for spec in sc.processes.values() if isinstance(spec, ServerProcess)}
    own = next((s for s in sorted(players) if s in stash["subject_defects"]), None)
    if own is not None:  # the playing client's own defect, in place of the general one
        block = stash["subject_defects"][own]
        update = {**_NONE, "known_defect": block.known_defect, "defect_rate": block.defect_rate,
                  "defect_versions": block.defect_versions}
    elif stash["known_defect"] and (not stash["defect_servers"] or servers & set(stash["defect_servers"])):
        update = {k: stash[k] for k in _NONE}
    else:
        update = _NONE
    out = sc.model_copy(update=update)
    out._subject_defect = stash
    out._defect_subject = own
    return out
