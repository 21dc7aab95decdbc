"""Subjects: who plays the sources and readers of a scenario, and the environment each runs in.

``mxref`` (the default) runs ``{python} -m mxref`` in the project's environment. ``modelexpress``
runs the real ModelExpress client (``modelexpress==0.7.0``) through its adapter,
``<subject env>/bin/python -m mxref.modelexpress.adapter`` (``mxref/modelexpress/adapter.py`` says which client
paths run unmodified and what the adapter stands in for), in an environment of its own built
on first use (``harness.subjects.envs``: torch is a few GB). The metadata server is mxref's
(it serves both ``mxref.v1`` and ModelExpress's ``model_express.p2p``) unless a ``server``
process says ``subject: modelexpress``: the real ModelExpress server (``harness.subjects.mx_server``).

A scenario chooses with ``subject:`` (a source or reader with its own ``subject:``: a mixed
fleet); ``mxchaos run --subject`` overrides every scenario's default.
``prepare_subjects`` builds the environments the scenarios need before they run; a subject
whose environment is not ready is a missing capability (``<name>-env``), so its scenarios SKIP
naming it rather than fail.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness.subjects.envs import STAMP, ensure_subject_env, inputs_hash, subject_env_dir, subject_spec

__all__ = ["ADAPTER_MODULE", "REPO", "capability", "env_ready", "prepare_subjects", "subject_launcher", "subject_versions",
           "subjects_of"]

REPO = Path(__file__).resolve().parents[2]
ADAPTER_MODULE = "mxref.modelexpress.adapter"


def capability(subject: str) -> str:
    """The capability a subject's scenarios need (``modelexpress-env``)."""
    return f"{subject}-env"


def env_ready(subject: str) -> bool:
    """Whether the subject's environment is built for the current inputs (cheap: reads the stamp)."""
    spec = subject_spec(subject)
    path = subject_env_dir(spec)
    stamp = path / STAMP
    if not stamp.is_file() or not (path / "bin" / "python").exists():
        return False
    return stamp.read_text().split()[0] == inputs_hash(spec, REPO)


def subject_launcher(subject: str) -> list[str] | None:
    """How a source or reader of ``subject`` is started; ``None``: the scenario's own launcher."""
    spec = subject_spec(subject)
    if not spec.needs_env:
        return None
    # the env holds the project's dependencies, not the project: the adapter (and mxref) come from
    # this checkout, whichever clone it is, so one cached env serves them all; a PYTHONPATH the
    # harness was given goes first, as it does for mxref's own processes (``mxchaos mutate`` puts its
    # mutated copy of mxref, the adapter included, there)
    given = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = os.pathsep.join([*given, str(REPO)])
    return ["env", f"PYTHONPATH={path}", str(subject_env_dir(spec) / "bin" / "python"), "-m", ADAPTER_MODULE]


def subjects_of(scenario: Any) -> set[str]:
    """Every subject that plays a source or reader of ``scenario``."""
    used = set()
    default = getattr(scenario, "subject", "mxref")
    for spec in getattr(scenario, "processes", {}).values():
        if getattr(spec, "role", "") in ("source", "reader"):
            used.add(getattr(spec, "subject", None) or default)
    return used


def subject_versions(scenario: Any) -> dict[str, Any]:
    """What played the sources and readers (``versions.json``): each subject, its pinned
    package and the environment it ran in."""
    out: dict[str, Any] = {}
    for subject in sorted(subjects_of(scenario)):
        spec = subject_spec(subject)
        if spec.needs_env:
            out[subject] = {"version": spec.version, "requirements": list(spec.requirements),
                            "environment": str(subject_env_dir(spec))}
        else:
            out[subject] = {"version": "this repository", "environment": "the project's own"}
    return out


def prepare_subjects(scenarios: Iterable[Any], log: Callable[[str], None]) -> dict[str, str | None]:
    """Build (or find cached) the environment of every subject the scenarios use; subject ->
    the error that keeps it from running (``None``: ready)."""
    out: dict[str, str | None] = {}
    used: set[str] = set()
    for sc in scenarios:
        used |= subjects_of(sc)
    for subject in sorted(used):
        spec = subject_spec(subject)
        if not spec.needs_env:
            continue
        env = ensure_subject_env(spec, REPO, log=log)
        out[subject] = env.error
        if env.error:
            log(f"subject {subject}: its environment is not available ({env.error}); its scenarios will SKIP")
        else:
            log(f"subject {subject}: {env.version} in {env.path}" + (" (cached)" if env.cached else ""))
    return out
