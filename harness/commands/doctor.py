"""``mxchaos doctor``: what each place a run may use has, what it lacks, and the command that fixes it.

``mxchaos doctor [--inventory FILE] [--nixl V,...] [--subject S] [PATH ...]`` probes:

- **here**: this interpreter (the project's environment);
- **each ``--nixl`` environment** (``harness.subjects.nixl_envs.ensure_env``: built, or reused, as the
  matrix would, native extension included);
- **each ``--subject`` environment** (``harness.subjects``: probed when built; never built here,
  it is gigabytes);
- **each inventory machine**, over ssh with its own interpreter and checkout (``SshHost``), and
  its clock offset.

Every place is probed by the same code, ``probe()`` (``python -m harness.commands.doctor --probe``, run
in that place's interpreter with the checkout on ``PYTHONPATH``): the Python, NIXL (its version
and whether ``nixl._api`` imports), UCX (its version and the transports its wheel carries), the
native extension (whether it imports, and whether it is this checkout's source), the
capabilities of ``harness.scenario.capabilities`` (root, netns, toxiproxy, redis-server, sshd, iptables,
tc ...), GPUs and RDMA devices. For the scenarios given, a table says where each runs, SKIPs
(a capability it lacks, as ``mxchaos run`` would say) or is **blocked**: the place would fail
its runs before their first step, for a reason that is no verdict on NIXL (``BLOCKING``: NIXL
does not import; the scenario's server is the native one and the extension is missing; the host
does not answer). ``mxchaos matrix``, ``nightly`` and ``run --inventory`` run this preflight on
their scenarios and refuse, with these words, before starting anything (exit ``EXIT_ENV_BROKEN``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError
from harness.exits import EXIT_ENV_BROKEN
from harness.hosts.allocation import open_inventory
from harness.hosts.hardware import local_hardware
from harness.hosts.slurm import SlurmUnavailable
from harness.hosts.ssh import SshHost
from harness.record.versions import ucx_version
from harness.scenario.capabilities import have, scenario_requirements
from harness.scenario.select import scenarios_to_run
from harness.subjects import env_ready
from harness.subjects.envs import SUBJECTS, ensure_subject_env, subject_env_dir, subject_spec
from harness.subjects.native import installed_hash, source_hash
from harness.subjects.nixl_envs import ensure_env

if TYPE_CHECKING:
    from harness.hosts.inventory import Inventory

__all__ = ["EXIT_ENV_BROKEN", "ProbeSite", "add_parser", "blocking", "cmd_doctor", "preflight", "probe", "render",
           "scenario_needs"]

REPO = Path(__file__).resolve().parents[2]
PROBE_TIMEOUT_S = 120.0
PROBE_ATTEMPTS = 2
CAPABILITIES = ("root", "netns", "toxiproxy", "redis-server", "sshd", "iptables", "tc", "ip", "ss", "cuda", "rdma")
NATIVE = "mxref-native"  # the requirement of a scenario whose server is the native one (the default)
BLOCKING = ("nixl", NATIVE, "reachable", "probe")

FIXES: dict[str, str] = {
    "nixl": "pip install --no-deps nixl-cu12==V nixl==V (./.ci/bootstrap does, for the project's .venv)",
    NATIVE: "./.ci/bootstrap here; mxchaos doctor --nixl V for a matrix env; on an ssh host: ./.ci/bootstrap in its checkout",
    "toxiproxy": "./.ci/bootstrap (go install of the toxiproxy server; needs Go)",
    "redis-server": "apt-get install redis-server",
    "sshd": "apt-get install openssh-server",
    "iptables": "apt-get install iptables",
    "tc": "apt-get install iproute2",
    "ip": "apt-get install iproute2",
    "ss": "apt-get install iproute2",
    "netns": "run as root, with iproute2 (apt-get install iproute2)",
    "root": "run as root (sudo)",
    "cuda": "a machine with an NVIDIA GPU (give it in --inventory)",
    "rdma": "a machine with an RDMA NIC (give it in --inventory)",
    "inventory": "--inventory FILE with the GPU/RDMA machines the scenario's hosts require",
    "modelexpress-env": "MXCHAOS_BUILD_SUBJECTS=1 ./.ci/bootstrap (builds the subject's environment, a few GB)",
    "reachable": "check the inventory's address, user, key, interpreter and checkout (ssh -i KEY USER@ADDRESS true)",
    "probe": "rebuild the environment: mxchaos matrix --rebuild-envs --nixl V ... (or delete it under ~/.cache/mxchaos/envs)",
}


# ------------------------------------------------------------------ the probe (runs in the place's interpreter)


def _child_ok(code: str) -> tuple[bool, str]:
    """Whether ``python -c code`` succeeds in this interpreter (a child: a broken library cannot take us down)."""
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    return done.returncode == 0, (lines[-1].strip() if lines else "")


def _transports() -> list[str]:
    """The UCX transports (UCT modules) the NIXL wheel carries: ``libuct_ib.so`` -> ``ib``."""
    purelib = sysconfig.get_paths()["purelib"]
    names = {p.name.removeprefix("libuct_").split(".so")[0] for p in Path(purelib).glob("nixl*.libs/ucx/libuct_*.so*")}
    return sorted(names)


def probe(capabilities: Iterable[str] = CAPABILITIES) -> dict[str, Any]:
    """What this interpreter's environment and machine have (JSON-able)."""
    facts: dict[str, Any] = {"python": sys.executable, "python_version": platform.python_version(),
                             "machine": platform.node()}
    try:
        facts["nixl_version"] = importlib.metadata.version("nixl")
    except importlib.metadata.PackageNotFoundError:
        facts["nixl_version"] = None
    ok, why = _child_ok("import nixl._api")
    facts["nixl_import"] = None if ok else (why or "import nixl._api failed")
    facts["ucx_version"] = ucx_version()
    facts["ucx_transports"] = _transports()
    ok, why = _child_ok("import mxref_native")
    facts["native_import"] = None if ok else (why or "import mxref_native failed")
    checkout = REPO / "mxref" / "native"
    facts["native_source"] = source_hash(REPO) if checkout.is_dir() else None
    facts["native_installed"] = installed_hash(Path(sys.prefix))  # None: bootstrap's (or nobody's) install
    caps: dict[str, bool] = {}
    for cap in dict.fromkeys([*CAPABILITIES, *capabilities]):
        if cap == "sshd":  # /usr/sbin is not on every PATH
            caps[cap] = have(cap) or os.access("/usr/sbin/sshd", os.X_OK)
        else:
            caps[cap] = have(cap)
    facts["capabilities"] = caps
    hw = local_hardware()
    facts["gpus"], facts["rdma_devices"] = hw.gpus, list(hw.rdma)
    facts["uid"] = os.geteuid()
    return facts


# ------------------------------------------------------------------ places


@dataclass
class ProbeSite:
    """Where roles run: ``here``, a ``nixl-V`` env, a ``subject-S`` env, or an inventory machine."""

    name: str
    kind: str  # here | env | subject | host | unavailable (an env that could not be built: not probed)
    facts: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # the place could not be probed at all (why)
    clock: dict[str, float] | None = None

    def lacks(self, needs: Iterable[str]) -> list[str]:
        """Which of ``needs`` this place lacks (``BLOCKING`` ones included)."""
        if self.error is not None:
            return ["reachable" if self.kind == "host" else "probe"]
        out = []
        caps = self.facts.get("capabilities", {})
        for need in needs:
            if need == "nixl":
                bad = self.facts.get("nixl_import") is not None
            elif need == NATIVE:
                bad = self.facts.get("native_import") is not None
            else:
                bad = not caps.get(need, False)
            if bad:
                out.append(need)
        return out

    def why(self, need: str) -> str:
        if need in ("reachable", "probe"):
            return f"not probed: {self.error}"
        if need == "nixl":
            return f"NIXL does not import: {self.facts.get('nixl_import')}"
        if need == NATIVE:
            return f"the native extension (mxref_native, the default server) does not import: {self.facts.get('native_import')}"
        return f"no {need}"

    def fix(self, need: str) -> str:
        """The command that gives this place ``need``."""
        if need == NATIVE and self.kind == "host":
            return ("on the host, in its checkout: ./.ci/bootstrap (or pip install --no-deps the wheel of "
                    "~/.cache/mxchaos/wheels/mxref_native-<hash>/ into its interpreter's environment)")
        if need == NATIVE and self.kind in ("env", "subject"):
            return (f"mxchaos doctor --{'nixl' if self.kind == 'env' else 'subject'} {self.name.split('-', 1)[1]} "
                    "(installs the cached wheel; building it needs cargo: https://rustup.rs)")
        if need == NATIVE:
            return "./.ci/bootstrap (builds mxref/native with cargo), or .venv/bin/python -m pip install ./mxref/native"
        return FIXES.get(need, "")


def _probe_in(python: Sequence[str], capabilities: Sequence[str]) -> tuple[dict[str, Any], str | None]:
    argv = [*python, "-m", "harness.commands.doctor", "--probe", "--capabilities", ",".join(capabilities)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {}, f"{type(exc).__name__}: {exc}"
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line), None
            except ValueError:
                break
    tail = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    return {}, f"the probe failed (rc {done.returncode}): {tail[-1] if tail else 'no output'}"


def probe_env(name: str, kind: str, python: Path, capabilities: Sequence[str]) -> ProbeSite:
    facts, error = _probe_in([str(python)], capabilities)
    return ProbeSite(name, kind, facts, error)


def probe_inventory(path: Path | Inventory, capabilities: Sequence[str]) -> list[ProbeSite]:
    """Each machine of the inventory (a file, ``slurm:``, or one already read), probed over ssh with its own
    interpreter and checkout."""
    inventory = path if not isinstance(path, Path) else open_inventory(path)
    places = []
    run_dir = Path(tempfile.mkdtemp(prefix="mxchaos-doctor-"))
    for name, machine in inventory.machines.items():
        host = SshHost(name, name, machine, f"doctor-{os.getpid()}", run_dir)
        place = ProbeSite(f"host {name}", "host")
        try:
            env = f"PYTHONPATH={shlex.quote(machine.repo)} " if machine.repo else ""
            line = (f"{env}{shlex.quote(machine.interpreter)} -m harness.commands.doctor --probe "
                    f"--capabilities {shlex.quote(','.join(capabilities))}")
            for _attempt in range(PROBE_ATTEMPTS):  # a fresh sshd may drop the first connection
                done = host.run_remote(line, timeout=PROBE_TIMEOUT_S)
                found = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
                if (done.rc == 0 and found) or done.timed_out or host.lost:
                    break
            if done.rc == 0 and found:
                place.facts = json.loads(found[-1])
                place.clock = host.probe_clock()
            else:
                tail = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
                place.error = (f"{machine.target}:{machine.port}: the probe failed (rc {done.rc}): "
                               f"{tail[-1] if tail else 'no output'} (interpreter {machine.interpreter}, "
                               f"checkout {machine.repo or 'none'})")
        except (HarnessError, ValueError) as exc:
            place.error = str(exc)
        finally:
            host.close_master()
        places.append(place)
    return places


# ------------------------------------------------------------------ scenarios and the verdict per place


def scenario_needs(sc: Any) -> dict[str, list[str]]:
    """What a scenario needs of a place: ``capabilities.scenario_requirements`` (a lack: SKIP),
    plus NIXL and, for a server on the native gRPC (the default), the native extension (a lack:
    blocked, every run would fail before its first step)."""
    needs = {"nixl": ["readers and sources"], **scenario_requirements(sc)}
    native = [name for name, spec in getattr(sc, "processes", {}).items()
              if getattr(spec, "role", "") == "server" and not _grpcio(spec)
              and getattr(spec, "subject", None) in (None, "mxref")]  # ModelExpress's own server is its binary
    if native:
        needs[NATIVE] = [f"server ({', '.join(native)})"]
    return needs


def _grpcio(spec: Any) -> bool:
    """Whether a server runs Python's grpcio (its ``grpc_impl`` option, or its extra arguments)."""
    if getattr(getattr(spec, "options", None), "grpc_impl", None) == "grpcio":
        return True
    joined = " ".join(getattr(spec, "extra_args", ()))
    return "--grpc-impl grpcio" in joined or "--grpc-impl=grpcio" in joined


def blocking(places: Sequence[ProbeSite], scenarios: Sequence[Any]) -> list[str]:
    """A line per (place, scenario) that would fail before its first step; empty: nothing blocks."""
    out = []
    for place in places:
        if place.kind == "unavailable":  # a release that cannot be installed is a column saying so, not a refusal
            continue
        for sc in scenarios:
            needs = scenario_needs(sc)
            if place.kind == "host":  # only what decides the host's role: native and NIXL; the rest SKIPs per run
                needs = {k: v for k, v in needs.items() if k in BLOCKING}
            bad = [n for n in place.lacks(needs) if n in BLOCKING]
            if bad:
                out.append(f"{place.name}: {sc.name} cannot run: " + "; ".join(place.why(n) for n in bad)
                           + " -> fix: " + "; ".join(place.fix(n) for n in bad))
    return out


def _yes(value: Any) -> str:
    return "yes" if value else "NO"


def render(places: Sequence[ProbeSite], scenarios: Sequence[Any]) -> str:
    """The doctor's report: each place's facts, then a table of where each scenario runs, and the fixes."""
    lines: list[str] = []
    wanted: set[str] = set()
    for place in places:
        f = place.facts
        lines.append(f"== {place.name}" + (f" ({f.get('python')}, Python {f.get('python_version')})" if f else ""))
        if place.error:
            lines.append(f"   NOT PROBED: {place.error}")
            wanted.update(place.lacks(["nixl"]))
            continue
        lines.append(f"   NIXL {f.get('nixl_version') or 'not installed'}: "
                     + ("imports" if f.get("nixl_import") is None else f"does NOT import ({f.get('nixl_import')})"))
        lines.append(f"   UCX {f.get('ucx_version') or 'not found'}; transport modules: "
                     f"{', '.join(f.get('ucx_transports') or []) or 'none'} (tcp, shared memory, self: built in)")
        native = "imports" if f.get("native_import") is None else f"does NOT import ({f.get('native_import')})"
        if f.get("native_installed") and f.get("native_source") and f["native_installed"] != f["native_source"]:
            native += f" (installed from source {f['native_installed']}, checkout is {f['native_source']})"
        lines.append(f"   native extension (mxref_native): {native}")
        caps = f.get("capabilities", {})
        lines.append("   " + "  ".join(f"{c}: {_yes(caps.get(c))}" for c in CAPABILITIES))
        lines.append(f"   GPUs: {f.get('gpus', 0)}; RDMA devices: {', '.join(f.get('rdma_devices') or []) or 'none'}")
        if place.clock:
            lines.append(f"   clock offset: {place.clock.get('offset_s', 0.0):+.6f}s (+/- {place.clock.get('error_s', 0.0):.6f}s)")
    if scenarios:
        lines.append("")
        lines.append("what can run where (ok: runs; SKIP: lacks a capability; BLOCKED: would fail before its first step;"
                     " an inventory host: whether it can play its roles, its fault levers are probed per run)")
        width = max(len(sc.name) for sc in scenarios)
        for sc in scenarios:
            needs = scenario_needs(sc)
            cells = []
            for place in places:
                lack = place.lacks(needs if place.kind != "host" else {k: v for k, v in needs.items() if k in BLOCKING})
                wanted.update(lack)
                bad = [n for n in lack if n in BLOCKING]
                cells.append(f"{place.name}: " + ("BLOCKED (" + ", ".join(bad) + ")" if bad else
                                                  "SKIP (" + ", ".join(lack) + ")" if lack else "ok"))
            lines.append(f"  {sc.name:<{width}}  " + " | ".join(cells))
    else:
        for place in places:
            wanted.update(n for n in place.lacks(["nixl", NATIVE, *CAPABILITIES]) if n not in ("cuda", "rdma"))
    if wanted:
        lines.append("")
        lines.append("to fix:")
        lines += [f"  {need}: {FIXES[need]}" for need in sorted(wanted) if need in FIXES]
    return "\n".join(lines)


# ------------------------------------------------------------------ the command and the preflight


def places_for(*, nixl: Sequence[str] = (), subjects: Sequence[str] = (), inventory: Path | Inventory | None = None,
               capabilities: Sequence[str] = CAPABILITIES, log: Callable[[str], None] = lambda _m: None,
               here: bool = True) -> list[ProbeSite]:
    places = []
    if here:
        places.append(ProbeSite("here", "here", probe(capabilities)))
    for version in nixl:
        env = ensure_env(version, REPO, log=log)
        if env.error and not env.error.startswith("native extension:"):  # NIXL V cannot be installed: the
            places.append(ProbeSite(f"nixl-{version}", "unavailable", error=env.error))  # matrix's unavailable column
            continue
        place = probe_env(f"nixl-{version}", "env", env.python, capabilities)
        if env.error and not place.error and place.facts.get("native_import") is None:
            place.error = env.error
        places.append(place)
    for subject in subjects:
        spec = subject_spec(subject)
        if not spec.needs_env:
            continue
        path = subject_env_dir(spec)
        if env_ready(subject):  # built for these inputs: its native extension is topped up (never a rebuild here)
            ensure_subject_env(spec, REPO, log=log)
        if (path / "bin" / "python").exists():
            places.append(probe_env(f"subject-{subject}", "subject", path / "bin" / "python", capabilities))
        else:
            places.append(ProbeSite(f"subject-{subject}", "subject", error=f"not built ({path}): {FIXES['modelexpress-env']}"))
    if inventory is not None:
        places += probe_inventory(inventory, capabilities)
    return places


def preflight(scenarios: Sequence[Any], places: Sequence[ProbeSite], what: str) -> int | None:
    """Refuse (print the doctor's words, return ``EXIT_ENV_BROKEN``) when a place would fail a
    scenario before its first step; None: go on."""
    blocked = blocking(places, scenarios)
    if not blocked:
        return None
    print(f"{what}: refused before starting anything (mxchaos doctor says):", file=sys.stderr)
    for line in blocked:
        print(f"  {line}", file=sys.stderr)
    return EXIT_ENV_BROKEN


def add_parser(sub: Any) -> None:
    p = sub.add_parser("doctor", help="what this machine, each environment and each inventory host has and lacks, "
                                      "what can run where, and the commands that fix what is missing")
    p.add_argument("paths", nargs="*", metavar="PATH", help="scenario files or folders: say where each can run")
    p.add_argument("--inventory", metavar="FILE", help="also probe each machine of this inventory over ssh")
    p.add_argument("--nixl", metavar="V1,V2", help="also each NIXL version's matrix environment (built if missing)")
    p.add_argument("--subject", metavar="S1,S2", help="also each subject's environment (when built)")
    p.add_argument("--json", action="store_true", help="print the facts as JSON")
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--capabilities", default="", help=argparse.SUPPRESS)
    p.set_defaults(fn=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    caps = [c for c in args.capabilities.split(",") if c]
    if args.probe:  # inside a place: print its facts, one JSON line
        print(json.dumps(probe(caps or CAPABILITIES)))
        return 0

    scenarios = scenarios_to_run(args.paths, None, None) if args.paths else []
    if scenarios is None:
        return 2
    wanted = sorted({c for sc in scenarios for c in scenario_requirements(sc)} | set(CAPABILITIES))
    versions = [v.strip() for v in (args.nixl or "").split(",") if v.strip()]
    subjects = [s.strip() for s in (args.subject or "").split(",") if s.strip()]
    if not set(subjects) <= set(SUBJECTS):
        print(f"--subject {args.subject!r}: give subjects from {', '.join(SUBJECTS)}", file=sys.stderr)
        return 2

    try:
        places = places_for(nixl=versions, subjects=subjects, inventory=Path(args.inventory) if args.inventory else None,
                            capabilities=wanted, log=lambda m: print(m, file=sys.stderr, flush=True))
    except SlurmUnavailable as exc:  # --inventory slurm: without an allocation to probe
        print(exc, file=sys.stderr)
        return EXIT_ENV_BROKEN
    except HarnessError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([{"name": p.name, "kind": p.kind, "facts": p.facts, "error": p.error, "clock": p.clock}
                          for p in places], indent=2))
    else:
        print(render(places, scenarios))
    broken = blocking(places, scenarios) if scenarios else [p for p in places if p.lacks(["nixl", NATIVE])]
    if not args.json:
        print(verdict_line(places, bool(broken), subjects))
    return EXIT_ENV_BROKEN if broken else 0


def _subject_state(name: str, probed: Sequence[str]) -> str:
    """One subject as the verdict line names it: where it runs and whether its environment is built."""
    from harness.subjects.envs import STAMP, SUBJECTS, subject_env_dir

    subject = SUBJECTS[name]
    if not subject.needs_env:
        return f"{name} (the project's environment)"
    label = f"{name} {subject.version}"
    if name in probed:
        return f"{label} (probed above)"
    built = (subject_env_dir(subject) / STAMP).is_file()
    return f"{label} ({'environment built' if built else 'not built: built on first use, minutes'}; --subject {name} probes it)"


def verdict_line(places: Sequence[ProbeSite], broken: bool, probed: Sequence[str]) -> str:
    """The doctor's last line: whether scenarios can run, what this machine lacks (its scenarios
    SKIP), and every subject with the state of its environment."""
    from harness.subjects.envs import SUBJECTS

    lacking = sorted({c for p in places if p.kind == "here" and not p.error
                      for c in CAPABILITIES if not p.facts.get("capabilities", {}).get(c)})
    head = "verdict: BROKEN (exit 4): see the fixes above" if broken else "verdict: OK, scenarios run here"
    lacks = f"; lacking {', '.join(lacking)} (the scenarios that need them SKIP)" if lacking else ""
    subjects = "; subjects: " + ", ".join(_subject_state(name, probed) for name in SUBJECTS)
    return head + lacks + subjects


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.commands.doctor --probe [--capabilities a,b]``: this place's facts (how every place is probed)."""
    parser = argparse.ArgumentParser(prog="python -m harness.commands.doctor")
    parser.add_argument("--probe", action="store_true", required=True)
    parser.add_argument("--capabilities", default="")
    args = parser.parse_args(argv)
    print(json.dumps(probe([c for c in args.capabilities.split(",") if c] or CAPABILITIES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
