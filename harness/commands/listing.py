"""``mxchaos list`` and ``mxchaos validate``.

``list [PATH ...]`` (default ``scenarios/``): a line per scenario, its name and the first line of
its description cut to fit, and under a scenario this machine would skip, why; ``--long`` adds
the file and the references; ``--faults`` / ``--checks`` list the kinds instead. ``validate PATH
...``: ``ok`` per valid file (stdout), each invalid file's problems (stderr), then a tally.

``--json`` on either prints one JSON document instead (stdout), with the same exit code:
``list``: ``{"scenarios": [{name, path, description, references, known_defect, skip}], "invalid":
[{file, problems}], "problems": [...]}``; ``validate``: ``{"files": [{path, ok, name, kind, counts,
problems}], "problems": [...], "valid": n, "invalid": n}`` (paths as given, relative to the
working folder when inside it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any

from harness import checks, faults
from harness.commands.run import resolve_subject
from harness.errors import ScenarioInvalid
from harness.exits import EXIT_INVALID, EXIT_OK
from harness.explore import is_template
from harness.explore.template import load_template
from harness.scenario import load_scenario
from harness.scenario.capabilities import describe_missing, scenario_requirements
from harness.scenario.select import collect_paths, load_all, shown
from harness.scenario.subjects import with_subjects
from harness.subjects.envs import ENV_CLIENT_VERSION
from harness.subjects.mx_server import CLIENT_VERSION_KEY
from harness.subjects.releases import LATEST_NIGHTLY

__all__ = ["add_parser", "cmd_list", "cmd_validate"]


def add_parser(sub: Any, subjects_arg: Any) -> None:
    """Register ``list`` and ``validate``; ``subjects_arg`` parses ``--subject``."""
    lst = sub.add_parser("list", help="list scenarios (default folder: scenarios/), fault kinds or check kinds")
    lst.add_argument("paths", nargs="*", metavar="PATH")
    lst.add_argument("--faults", action="store_true")
    lst.add_argument("--checks", action="store_true")
    lst.add_argument("-l", "--long", action="store_true", help="also each scenario's file and references")
    lst.add_argument("--json", action="store_true", help="one JSON document instead of lines")
    lst.add_argument("--subject", type=subjects_arg, default=None, metavar="SUBJECT|ROLE=SUBJECT,...",
                     help="as played by this subject: which scenarios it cannot play (their subjects:) and why")
    lst.set_defaults(fn=cmd_list)

    validate = sub.add_parser("validate", help="validate scenario files (exit 2 if any is invalid)")
    validate.add_argument("paths", nargs="+", metavar="PATH")
    validate.add_argument("--json", action="store_true", help="one JSON document instead of lines")
    validate.set_defaults(fn=cmd_validate)


def _kinds(args: argparse.Namespace) -> int:
    if args.faults:
        rows: list[dict[str, Any]] = []
        for kind, cls in sorted(faults.REGISTRY.items()):
            doc = (cls.Spec.__doc__ or "").strip().splitlines()
            keys = [k for k in cls.Spec.model_fields if k != "kind"]
            rows.append({"kind": kind, "healable": cls.healable, "doc": doc[0] if doc else "", "keys": keys,
                         "requires": list(cls.requires)})
        if args.json:
            print(json.dumps({"faults": rows}, indent=1))
        for r in [] if args.json else rows:
            needs = f"; requires: {', '.join(r['requires'])}" if r["requires"] else ""
            print(f"{r['kind']:10} {'(healable) ' if r['healable'] else ''}{r['doc']}\n{'':10} keys: {', '.join(r['keys'])}{needs}")
        return EXIT_OK

    found = {kind: " ".join((d.params.__doc__ or "").split()) for kind, d in sorted(checks.REGISTRY.items())}
    if args.json:
        print(json.dumps({"checks": [{"kind": k, "doc": v} for k, v in found.items()]}, indent=1))
    for kind, text in [] if args.json else found.items():
        print(f"{kind:15} {text}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    if args.faults or args.checks:
        return _kinds(args)

    files, problems = collect_paths(args.paths or ["scenarios"])
    scenarios, invalid = load_all(files, None)
    if args.subject is not None:
        if args.subject.get(CLIENT_VERSION_KEY) == LATEST_NIGHTLY:  # asked of the registry, as mxchaos run asks it
            args.subject, nightly = resolve_subject(args.subject, log=lambda m: print(m, file=sys.stderr))
            if nightly.version is None:
                print(f"mxchaos list: --subject modelexpress@{LATEST_NIGHTLY}: {nightly.error}", file=sys.stderr)
                return EXIT_INVALID
        if CLIENT_VERSION_KEY in args.subject:  # as mxchaos run plays modelexpress@V
            os.environ[ENV_CLIENT_VERSION] = args.subject[CLIENT_VERSION_KEY]
        scenarios = [with_subjects(s, args.subject) for s in scenarios]
    rows: list[dict[str, Any]] = []
    lacks: dict[str, None] = {}  # capabilities this machine lacks, in first-seen order
    unplayable = 0  # scenarios the subjects asked for cannot play (a reason of the scenario's, not the machine's)
    for sc in scenarios:
        lacking, why = describe_missing(scenario_requirements(sc))
        lacks.update(dict.fromkeys(lacking))
        if sc.not_playable():
            lacking, why, unplayable = [*lacking, "subject"], str(sc.not_playable()), unplayable + 1
        rows.append({"name": sc.name, "path": shown(sc.path), "description": sc.description.strip(),
                     "references": list(sc.references), "known_defect": sc.known_defect, "skip": why if lacking else None})
    code = EXIT_INVALID if invalid or problems else EXIT_OK
    if args.json:
        print(json.dumps({"scenarios": rows, "invalid": [{"file": str(e.file), "problems": len(e.issues)} for e in invalid],
                          "problems": problems}, indent=1))
        return code
    for problem in problems:
        print(problem, file=sys.stderr)
    # a terminal's width cuts a description; piped (| grep, > file) every word stays
    width = max(40, shutil.get_terminal_size((100, 24)).columns - 38) if sys.stdout.isatty() else None
    for r in rows:
        first = r["description"].splitlines()[0] if r["description"] else ""
        if args.long:
            refs = f"  [{', '.join(r['references'])}]" if r["references"] else ""
            refs += "  (known defect)" if r["known_defect"] else ""
            print(f"{r['name']:36} {first}{refs}\n{'':36} {r['path']}")
        else:
            mark = " (known defect)" if r["known_defect"] else ""
            text = first + mark
            print(f"{r['name']:36} {text if width is None or len(text) <= width else text[: width - 3] + '...'}")
        if r["skip"]:
            print(f"{'':36} would SKIP here: {r['skip']}")
    for exc in invalid:
        print(f"{'INVALID':36} {exc.file} ({len(exc.issues)} problem(s); run `mxchaos validate`)")
    if rows:
        n, n_skip = len(rows), sum(1 for r in rows if r["skip"])
        where = f"{n} scenario{'s' if n != 1 else ''}"
        if n_skip:
            reasons = [f"the machine lacks {', '.join(lacks)}"] if lacks else []
            reasons += [f"{unplayable} not staged for the subjects asked"] if unplayable else []
            print(f"\n{where}; {n_skip} would be skipped here ({'; '.join(reasons)})")
        else:
            print(f"\n{where}; this machine can run every one")
    return code


def cmd_validate(args: argparse.Namespace) -> int:
    """Each file in the order given: ``ok`` (stdout) or its problems (stderr); then a tally."""
    files, problems = collect_paths(args.paths)
    quiet = bool(args.json)
    for problem in [] if quiet else problems:
        print(problem, file=sys.stderr, flush=True)
    done: list[dict[str, Any]] = []
    for file in files:
        template = is_template(file)
        try:
            if template:  # named on its own: validated as an exploration template

                sc = load_template(file).base
            else:
                sc = load_scenario(file)
        except ScenarioInvalid as exc:
            done.append({"path": shown(file), "ok": False, "problems": [i.render(exc.file) for i in exc.issues]})
            if not quiet:
                print(exc.render(), file=sys.stderr, flush=True)
            continue
        counts = {"processes": len(sc.processes), "steps": len(sc.steps), "checks": len(sc.checks)}
        done.append({"path": shown(file), "ok": True, "name": sc.name, "kind": "template" if template else "scenario",
                     "counts": counts})
        if not quiet:
            text = f"{counts['processes']} processes, {counts['steps']} steps, {counts['checks']} checks"
            print(f"ok  {shown(file)}  ({'template ' if template else ''}{sc.name}: {text})", flush=True)
    n_files, n_invalid = len(done), sum(1 for d in done if not d["ok"])
    bad = bool(n_invalid or problems or not files)
    if quiet:
        print(json.dumps({"files": done, "problems": problems, "valid": n_files - n_invalid, "invalid": n_invalid}, indent=1))
        return EXIT_INVALID if bad else EXIT_OK
    tally = f"{n_files} file{'s' if n_files != 1 else ''}: {n_files - n_invalid} valid, {n_invalid} invalid"
    if problems:
        tally += f"; {len(problems)} path problem{'s' if len(problems) != 1 else ''}"
    print(tally, file=sys.stderr if bad else sys.stdout)
    return EXIT_INVALID if bad else EXIT_OK
