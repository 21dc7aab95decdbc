"""SLURM's client output as the harness reads it (``harness.hosts.slurm``) and inventories built from an
allocation (``harness.hosts.allocation``), against a fake ``scontrol`` on PATH that prints what SLURM
22.05 printed in the lab: ``scontrol -o`` records (a value with spaces included), node lists, hostile
node names and addresses refused before they reach ssh, a controller that does not answer named with
its address, a job that is no allocation."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.hosts import allocation, slurm
from harness.hosts.inventory import InventoryInvalid

# what `scontrol -o show node h1` printed on the lab (SLURM 22.05.8), OS= with spaces in it
NODE_LINE = ("NodeName=h1 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=2.28 "
             "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.214.0.11 NodeHostName=h1 "
             "Version=22.05.8 OS=Linux 6.18.44-fc-v1252 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 "
             "State=MIXED ThreadsPerCore=1 Partitions=lab")
CONF = """\
# a comment
ClusterName=mxchaoslab
SlurmctldHost=vm(10.214.0.1)   # trailing comment
SlurmctldPort=45365
NodeName=h1 NodeAddr=10.214.0.11 CPUs=2
PartitionName=lab Nodes=h1 Default=YES
"""


def test_a_record_keeps_a_value_with_spaces() -> None:
    record = slurm.parse_record(NODE_LINE)
    assert record["NodeAddr"] == "10.214.0.11" and record["NodeHostName"] == "h1"
    assert record["OS"] == "Linux 6.18.44-fc-v1252 #1 SMP PREEMPT_DYNAMIC @0"
    assert record["Partitions"] == "lab"


_KEYS = st.from_regex(r"\A[A-Z][A-Za-z]{0,12}\Z")
_WORD = st.from_regex(r"\A[A-Za-z0-9()@#.,:/_\[\]-]{1,12}\Z")


@given(st.dictionaries(_KEYS, st.lists(_WORD, min_size=1, max_size=4), min_size=1, max_size=8))
def test_records_read_back_what_was_written(fields: dict[str, list[str]]) -> None:
    line = "  ".join(f"{key}={' '.join(words)}" for key, words in fields.items())
    assert slurm.parse_record(line) == {key: " ".join(words) for key, words in fields.items()}


def test_a_conf_names_its_controller(tmp_path: Path) -> None:
    keys = slurm.read_conf(CONF)
    assert keys["slurmctldhost"] == "vm(10.214.0.1)" and "nodename" not in keys
    (tmp_path / "slurm.conf").write_text(CONF)
    assert slurm.controller(tmp_path / "slurm.conf") == "vm(10.214.0.1):45365"
    (tmp_path / "old.conf").write_text("ControlMachine=ctl\nControlAddr=10.0.0.1\n")
    assert slurm.controller(tmp_path / "old.conf") == "ctl(10.0.0.1):6817"
    assert "unreadable" in slurm.controller(tmp_path / "none.conf")


@given(st.integers(0, 10**10 - 1), st.one_of(st.none(), st.integers(0, 10**6)))
def test_job_ids_as_slurm_writes_them(job: int, task: int | None) -> None:
    text = f"{job}" if task is None else f"{job}_{task}"
    assert slurm.valid_job_id(text) == text


@pytest.mark.parametrize("bad", ["", "abc", "-1", "1;id", "1 2", "12_", "_3", "1\n2", "$(id)"])
def test_what_is_no_job_id_is_refused(bad: str) -> None:
    with pytest.raises(slurm.SlurmError, match="not a job id"):
        slurm.valid_job_id(bad)


@pytest.mark.parametrize("bad", ["-oProxyCommand=id", "a..b", "a b", "$(id)", "a;b", "", "x" * 64, ".h1", "h1/x"])
def test_hostile_node_names_are_refused(bad: str) -> None:
    with pytest.raises(slurm.SlurmError, match="not a host name"):
        slurm.valid_node(bad)


@given(st.from_regex(r"\A[a-z][a-z0-9-]{0,20}[0-9]{1,4}\Z"))
def test_node_names_as_sites_write_them_pass(name: str) -> None:
    assert slurm.valid_node(name) == name


def test_spec_spellings() -> None:
    assert allocation.parse_spec("slurm:") is None
    assert allocation.parse_spec("slurm:1234") == "1234"
    assert allocation.parse_spec("slurm:77_3") == "77_3"
    with pytest.raises(InventoryInvalid, match="not a job id"):
        allocation.parse_spec("slurm:nope")
    assert allocation.parse_spec("slurm+srun:") is None and allocation.parse_spec("slurm+srun:1234") == "1234"
    with pytest.raises(InventoryInvalid, match="not a job id"):
        allocation.parse_spec("slurm+srun:1234;rm")
    assert [allocation.spec_reach(s) for s in ("slurm:", "slurm+srun:9", "inv.yaml", Path("slurm.yaml"))] == [
        "ssh", "srun", None, None]


@pytest.fixture(scope="module")
def minimal_conf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("conf") / "slurm.conf"
    path.write_text("ClusterName=x\nSlurmctldHost=localhost\n")
    return path


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="needs scontrol (slurm-client)")
@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"\A[a-z]{1,4}\Z"), st.integers(0, 40), st.integers(0, 3), st.integers(1, 2)),
                min_size=1, max_size=3, unique_by=lambda t: t[0]))
def test_node_lists_expand_by_slurms_own_rule(minimal_conf: Path, groups: list[tuple[str, int, int, int]]) -> None:
    """``h[01-03],gpu7`` as SLURM expands it (the real ``scontrol show hostnames``, no controller needed)."""
    parts, expected = [], []
    for prefix, low, span, width in groups:
        names = [f"{prefix}{n:0{width}d}" for n in range(low, low + span + 1)]
        expected += names
        parts.append(f"{prefix}[{low:0{width}d}-{low + span:0{width}d}]")
    assert slurm.hostnames(",".join(parts), minimal_conf) == tuple(expected)


# ---------------------------------------------------------------------------- a fake scontrol


FAKE = """#!/bin/sh
d="$FAKE_SCONTROL"
case "$*" in
  ping) cat "$d/ping"; exit "$(cat "$d/ping.rc")";;
  "-o show job "*) cat "$d/job"; exit "$(cat "$d/job.rc")";;
  "show hostnames "*) cat "$d/hostnames";;
  "-o show node "*) cat "$d/node";;
  *) echo "unexpected: $*" >&2; exit 9;;
esac
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "fake"
    (folder / "bin").mkdir(parents=True)
    script = folder / "bin" / "scontrol"
    script.write_text(FAKE)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    answers = {"ping": "Slurmctld(primary) at vm is UP\n", "ping.rc": "0", "job.rc": "0",
               "job": f"JobId=7 JobName=x UserId=root({os.geteuid()}) JobState=RUNNING NodeList=n[2-3]\n",
               "hostnames": "n3\nn2\n",
               "node": "NodeName=n2 NodeAddr=10.9.0.2 NodeHostName=n2\nNodeName=n3 NodeAddr=(null) NodeHostName=node-3.site\n"}
    for name, text in answers.items():
        (folder / name).write_text(text)
    (tmp_path / "slurm.conf").write_text(CONF)
    monkeypatch.setenv("PATH", f"{folder / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SCONTROL", str(folder))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    return folder


def test_the_jobs_nodes_are_the_machines_in_slurms_order(fake: Path, tmp_path: Path) -> None:
    inv = allocation.open_inventory("slurm:")
    assert list(inv.machines) == ["n3", "n2"]
    assert inv.machines["n2"].address == "10.9.0.2"
    assert inv.machines["n3"].address == "node-3.site"  # no NodeAddr: its host name
    assert inv.machines["n2"].repo == str(allocation.REPO)  # slurm: alone: this checkout on a shared file system
    assert {m.reach for m in inv.machines.values()} == {"ssh"} and not any(m.srun for m in inv.machines.values())


def test_slurm_srun_spec_reaches_every_node_of_the_job_through_srun(fake: Path, tmp_path: Path) -> None:
    """``slurm+srun:JOB``: the same machines as ``slurm:JOB``, each a step place of that job on its node."""
    inv = allocation.open_inventory("slurm+srun:7")
    assert list(inv.machines) == ["n3", "n2"]
    assert {name: (m.reach, m.srun.job if m.srun else None, m.srun.node if m.srun else None)
            for name, m in inv.machines.items()} == {"n3": ("srun", "7", "n3"), "n2": ("srun", "7", "n2")}
    assert inv.machines["n2"].address == "10.9.0.2"


def test_a_file_gives_defaults_per_node_fields_and_bind(fake: Path, tmp_path: Path) -> None:
    (tmp_path / "alloc.yaml").write_text(
        "defaults: {user: root, identity_file: id_key, work_dir: /var/tmp/mx}\n"
        f"slurm: {{job: 7, conf: {tmp_path / 'slurm.conf'}, nodes: {{n2: {{data: {{address: 10.8.0.2, device: eth1}}}}, "
        "other: {sudo: true}}}\n"
        "bind: {ctl: n2}\n")
    inv = allocation.open_inventory(tmp_path / "alloc.yaml")
    n2 = inv.machines["n2"]
    assert (n2.address, n2.data_address, n2.data.device, n2.work_dir) == ("10.9.0.2", "10.8.0.2", "eth1", "/var/tmp/mx")
    assert n2.identity_file == tmp_path / "id_key"  # relative to the file
    assert inv.bind == {"ctl": "n2"}


def test_a_controller_that_does_not_answer_is_named(fake: Path) -> None:
    (fake / "ping").write_text("Slurmctld(primary) at vm is DOWN\n")
    (fake / "ping.rc").write_text("1")
    with pytest.raises(slurm.SlurmUnavailable, match=r"controller vm\(10\.214\.0\.1\):45365 does not answer"):
        allocation.open_inventory("slurm:")


@pytest.mark.parametrize(("job", "match"), [
    ("JobId=7 UserId=root(0) JobState=PENDING NodeList=(null)", "is PENDING, not RUNNING"),
    ("JobId=7 UserId=someone(4242) JobState=RUNNING NodeList=n[2-3]", "not ours"),
])
def test_a_job_that_is_no_allocation_of_ours_is_refused(fake: Path, job: str, match: str) -> None:
    if os.geteuid() == 4242 and "4242" in job:
        pytest.skip("this test's stranger is us")
    (fake / "job").write_text(job + "\n")
    with pytest.raises(slurm.SlurmUnavailable, match=match):
        allocation.open_inventory("slurm:")


def test_no_such_job_and_no_allocation_are_invalid_input(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (fake / "job").write_text("slurm_load_jobs error: Invalid job id specified\n")
    (fake / "job.rc").write_text("1")
    with pytest.raises(InventoryInvalid, match="no job 99"):
        allocation.open_inventory("slurm:99")
    monkeypatch.delenv("SLURM_JOB_ID")
    with pytest.raises(InventoryInvalid, match="not inside a SLURM allocation"):
        allocation.open_inventory("slurm:")


@pytest.mark.parametrize("node", ["NodeName=n2 NodeAddr=-oProxyCommand=id", "NodeName=n2 NodeAddr=a;b"])
def test_a_hostile_node_address_never_reaches_ssh(fake: Path, node: str) -> None:
    (fake / "hostnames").write_text("n2\n")
    (fake / "node").write_text(node + "\n")
    with pytest.raises(slurm.SlurmError, match="the address of node n2"):
        allocation.open_inventory("slurm:")


def test_a_file_with_machines_and_slurm_is_invalid(fake: Path, tmp_path: Path) -> None:
    (tmp_path / "both.yaml").write_text("machines: {a: {address: 10.0.0.1}}\nslurm: {jobs: 3, nodes: {n2: {address: x}}}\n")
    with pytest.raises(InventoryInvalid) as err:
        allocation.open_inventory(tmp_path / "both.yaml")
    text = str(err.value)
    assert "machines: or slurm:" in text and "slurm.jobs: unknown key" in text and "not address" in text


def test_a_plain_inventory_file_is_read_as_before(tmp_path: Path) -> None:
    (tmp_path / "inv.yaml").write_text("machines: {a: {address: 10.0.0.1}}\n")
    assert list(allocation.open_inventory(tmp_path / "inv.yaml").machines) == ["a"]


def test_no_scontrol_or_no_conf_is_an_unavailable_slurm(fake: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(slurm.SlurmUnavailable, match="no configuration at"):  # scontrol would retry for 60 s
        slurm.ping(tmp_path / "none.conf")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(slurm.SlurmUnavailable, match="no `scontrol`"):
        slurm.ping(tmp_path / "slurm.conf")


def test_the_fake_is_what_is_asked(fake: Path) -> None:
    """The fake answers only the questions the module asks (a new question fails here first)."""
    done = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=False)
    assert done.returncode == 9
