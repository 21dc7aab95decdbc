"""Trust nothing a peer says: real processes, real NIXL (UCX over TCP on loopback).

Sources that hold other bytes under the same identity (``--data-seed``, with an honest
or a lying manifest), a source whose memory is corrupted while it serves
(``--debug-hooks`` + SIGUSR2), a tampered checkpoint, a corrupt model file, and a model
given as a safetensors file (``--model-file``) end to end. The oracle is the model's
definition: the expected checksums and digest are computed here from the bytes
(PCG64's raw outputs, xxh3-64, SHA-256 over the canonical list), never read from a process.
"""

from __future__ import annotations

import hashlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from procs import Cluster, Proc
from safetensors import safe_open
from safetensors.numpy import save_file

from mxref.roles.client import MxClient
from mxref.roles.selection import RandomSelector, Target
from mxref.roles.source import identity_for
from mxref.v1 import p2p_pb2

pytestmark = pytest.mark.integration

TENSORS, TENSOR_BYTES = 4, 1 << 20
MODEL = ("--tensors", str(TENSORS), "--tensor-mib", "1")
READER_TIMEOUT_S = 45.0


def digest_of(entries: list[tuple[str, str, list[int], str]]) -> str:
    text = json.dumps([list(e) for e in entries], separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def synthetic(seed: int = 0) -> tuple[dict[str, str], str]:
    """(checksums, digest) of the CLI's synthetic model for MODEL, from its definition."""
    sums, entries = {}, []
    for i in range(TENSORS):
        words = np.random.PCG64([seed, i]).random_raw(-(-TENSOR_BYTES // 8))  # raw outputs, little-endian
        data = words.astype("<u8").tobytes()[:TENSOR_BYTES]
        name = f"model.layers.{i}.weight"
        sums[name] = xxhash.xxh3_64_hexdigest(data)
        entries.append((name, "float16", [TENSOR_BYTES // 2], sums[name]))
    return sums, digest_of(entries)


def of_file(path: Path) -> tuple[dict[str, str], str]:
    """(checksums, digest) of a safetensors file's tensors, hashed here (natural name order)."""
    import re

    with safe_open(str(path), framework="numpy") as f:
        arrays = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118 - safe_open is not a mapping
    names = sorted(arrays, key=lambda n: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", n)])
    sums = {n: xxhash.xxh3_64_hexdigest(np.ascontiguousarray(arrays[n]).tobytes()) for n in names}
    return sums, digest_of([(n, str(arrays[n].dtype), list(arrays[n].shape), sums[n]) for n in names])


SUMS, DIGEST = synthetic()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path / "cluster") as c:
        c.start_server()
        yield c


@pytest.fixture
def still_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Heartbeats far apart (and a server that waits for them), so the server's listing order
    (newest update first) stays as it was when every source became READY."""
    with Cluster(tmp_path / "cluster") as c:
        c.start_server(heartbeat_timeout=120.0)
        yield c


def reader_args(*extra: str) -> tuple[str, ...]:
    return ("--transfer-timeout", "5", "--handshake-timeout", "5", "--settle-s", "0.2", "--settle-always", *extra)


def by_worker(reader: Proc) -> dict[str, tuple[int, str]]:
    return {e["worker_id"]: (e["index"], e["outcome"]) for e in reader.events("attempt_outcome")}


def assert_holds(reader: Proc, sums: dict[str, str], digest: str) -> None:
    """The reader reported holding exactly the expected bytes after its load, after settling and at exit."""
    reports = reader.events("memory_digest")
    assert [e["when"] for e in reports] == ["loaded", "settled", "exit"], reports
    for e in reports:
        assert e["digest"] == digest and e["checksums"] == sums, e


def prepare(cluster: Cluster, path: Path, *extra: str) -> dict[str, Any]:
    proc = cluster.start("prepare", f"prepare-{path.stem}", "--checkpoint", str(path), *extra)
    assert cluster.wait_exit(proc, 60) == 0, cluster.report()
    printed: dict[str, Any] = json.loads(proc.stdout().strip().splitlines()[-1])
    return printed


def flip_last_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # the last tensor's data
    path.write_bytes(bytes(raw))


def seed_trying_last(cluster: Cluster, last_worker_id: str, count: int) -> int:
    """A ``--selector-seed`` whose random order puts ``last_worker_id`` last among the sources
    the server lists for the model (the reader's ``candidates`` event confirms the order)."""
    assert cluster.server_address
    identity = identity_for("mxref/synthetic", "float16", revision=DIGEST)
    with MxClient(cluster.server_address, timeout_s=5) as client:
        listed = client.list_sources(identity=identity, status_filter=p2p_pb2.SOURCE_STATUS_READY)
    assert len(listed) == count, listed
    target = Target("mxref/synthetic", "-", 0)  # the random selector ignores its target
    return next(s for s in range(1000) if RandomSelector(s).order(listed, target)[-1].worker_id == last_worker_id)


# ----------------------------------------------------------------------------- wrong bytes, same identity


def test_wrong_bytes_under_the_same_identity_are_never_loaded(still_cluster: Cluster) -> None:
    cluster = still_cluster
    honest = cluster.start_source("src-honest", model=MODEL, heartbeat=60, wait_ready=False)
    seeded = cluster.start_source("src-seeded", "--data-seed", "5", model=MODEL, heartbeat=60, wait_ready=False)
    lying = cluster.start_source("src-lying", "--data-seed", "6", "--lie-manifest", model=MODEL, heartbeat=60,
                                 wait_ready=False)
    for proc in (honest, seeded, lying):
        cluster.wait_ready(proc)
    assert len({p.info["mx_source_id"] for p in (honest, seeded, lying)}) == 1, "all claim the same identity"
    seed = seed_trying_last(cluster, honest.info["worker_id"], 3)
    rd = cluster.run_reader("rd", *reader_args("--selector", "random", "--selector-seed", str(seed),
                                               "--expect-digest", DIGEST), model=MODEL, timeout=READER_TIMEOUT_S)
    assert rd.returncode == 0, cluster.report()
    assert rd.events("candidates")[0]["order"][-1] == honest.info["worker_id"], "the listing order changed"
    outcomes = by_worker(rd)
    assert outcomes[seeded.info["worker_id"]][1] == "reference_mismatch", outcomes
    assert outcomes[lying.info["worker_id"]][1] == "integrity_mismatch", outcomes
    assert outcomes[honest.info["worker_id"]] == (2, "success"), outcomes
    # the source whose manifest disagreed was never read from
    skipped = outcomes[seeded.info["worker_id"]][0]
    assert not rd.events("transfer_start", where=lambda e: e["index"] == skipped)
    assert not rd.events("handshake", where=lambda e: e["index"] == skipped)
    result = rd.result()
    assert (result["ok"], result["path"], result["integrity"]) == (True, "rdma", "verified"), result
    assert result["worker_id"] == honest.info["worker_id"]
    assert_holds(rd, SUMS, DIGEST)
    # the liars hold other bytes (computed here), whatever they say
    assert seeded.events("reference")[0]["held_digest"] == synthetic(5)[1] != DIGEST


def test_a_reader_whose_expected_digest_differs_exits_2(cluster: Cluster) -> None:
    other = synthetic(1)[1]
    rd = cluster.run_reader("rd", *reader_args("--expect-digest", other), model=MODEL, timeout=30)
    assert rd.returncode == 2, cluster.report()
    assert f"--expect-digest {other}: the model flags give {DIGEST}" in rd.log()
    assert not rd.events("candidates")


# ----------------------------------------------------------------------------- the disk fallback


@pytest.mark.parametrize("tamper", ["flipped-byte", "prepare-data-seed"])
def test_a_tampered_checkpoint_is_never_verified(cluster: Cluster, tmp_path: Path, tamper: str) -> None:
    path = tmp_path / "ck.safetensors"
    printed = prepare(cluster, path, *MODEL, *(("--data-seed", "3") if tamper == "prepare-data-seed" else ()))
    assert printed["digest"] == DIGEST  # the record claims the model...
    if tamper == "flipped-byte":
        flip_last_byte(path)
    rd = cluster.run_reader("rd", *reader_args("--checkpoint", str(path)), model=MODEL, timeout=READER_TIMEOUT_S)
    assert rd.returncode == 1, cluster.report()
    result = rd.result()
    assert result["ok"] is False and result["integrity"] == "failed", result
    assert "differ from the reference" in result["error"] and str(path) in result["error"]
    assert not rd.events("memory_digest") and not rd.events("load_done")


def test_a_checkpoint_written_by_prepare_loads_verified(cluster: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "ck.safetensors"
    prepare(cluster, path, *MODEL)
    rd = cluster.run_reader("rd", *reader_args("--checkpoint", str(path)), model=MODEL, timeout=READER_TIMEOUT_S)
    assert rd.returncode == 0, cluster.report()
    assert (rd.result()["path"], rd.result()["integrity"]) == ("disk", "verified")
    assert_holds(rd, SUMS, DIGEST)


# ----------------------------------------------------------------------------- --model-file


def _plain_file(path: Path) -> None:
    rng = np.random.default_rng(11)
    save_file({
        "encoder.layers.10.w": rng.standard_normal((64, 96)).astype(np.float32),
        "encoder.layers.2.w": rng.integers(-100, 100, size=(3, 5, 7), dtype=np.int32),
        "head.bias": rng.standard_normal(1000).astype(np.float16),
    }, str(path))


@pytest.mark.parametrize("kind", ["prepared", "plain"])
def test_a_model_file_is_served_and_loaded_end_to_end(cluster: Cluster, tmp_path: Path, kind: str) -> None:
    path = tmp_path / "model.safetensors"
    if kind == "prepared":
        prepare(cluster, path, "--tensors", "3", "--tensor-mib", "0.5", "--dtype", "float32", "--seed", "11")
    else:
        _plain_file(path)
    sums, digest = of_file(path)
    model = ("--model-file", str(path))
    src = cluster.start_source("src", model=model)
    check = src.events("content_check")[0]
    assert check["ok"] is (True if kind == "prepared" else None), check
    rd = cluster.run_reader("rd", *reader_args(), model=model, timeout=READER_TIMEOUT_S)
    assert rd.returncode == 0, cluster.report()
    result = rd.result()
    assert (result["ok"], result["path"], result["integrity"]) == (True, "rdma", "verified"), result
    assert result["tensors"] == len(sums)
    assert result["bytes"] == path.stat().st_size - 8 - int.from_bytes(path.read_bytes()[:8], "little")
    assert_holds(rd, sums, digest)
    # a reader of the default synthetic model does not match this source's identity
    other = cluster.run_reader("rd-other", *reader_args(), model=MODEL, timeout=READER_TIMEOUT_S)
    assert other.returncode == 1 and other.events("candidates")[0]["listed"] == 0


def test_a_source_refuses_a_corrupt_model_file(cluster: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    prepare(cluster, path, *MODEL)
    flip_last_byte(path)
    src = cluster.start_source("src", model=("--model-file", str(path)), wait_ready=False)
    assert cluster.wait_exit(src, 30) == 2, cluster.report()
    check = src.events("content_check")[0]
    assert check["ok"] is False and check["bad"] == [f"model.layers.{TENSORS - 1}.weight"], check
    assert "refusing to serve it" in src.log() and str(path) in src.log()
    assert not src.events("published") and src.events("exit")[-1]["code"] == 2


# ----------------------------------------------------------------------------- --debug-hooks


def test_debug_hooks_corrupt_and_restore_a_serving_source(cluster: Cluster) -> None:
    src = cluster.start_source("src", "--debug-hooks", model=MODEL, wait_ready=False)
    plain = cluster.start_source("src-plain", model=("--tensors", "1", "--tensor-mib", "0.25"), wait_ready=False)
    cluster.wait_ready(src)
    cluster.wait_ready(plain)
    cluster.signal(plain, signal.SIGUSR2)  # no --debug-hooks: SIGUSR2 keeps its default action
    assert cluster.wait_exit(plain, 10) == -signal.SIGUSR2
    assert not plain.events("debug_corrupt")

    cluster.signal(src, signal.SIGUSR2)
    event = cluster.wait_event(src, "debug_corrupt", timeout=10)
    assert (event["corrupted"], event["tensors"]) == (True, TENSORS)
    rd1 = cluster.run_reader("rd1", *reader_args(), model=MODEL, timeout=READER_TIMEOUT_S)
    assert rd1.returncode == 1, cluster.report()
    assert [o for _, o in by_worker(rd1).values()] == ["integrity_mismatch"]
    assert rd1.result()["integrity"] != "verified" and not rd1.events("memory_digest")
    assert rd1.events("integrity")[0]["bad"] == list(SUMS)

    cluster.signal(src, signal.SIGUSR2)
    cluster.wait_event(src, "debug_corrupt", where=lambda e: e["corrupted"] is False, timeout=10)
    rd2 = cluster.run_reader("rd2", *reader_args(), model=MODEL, timeout=READER_TIMEOUT_S)
    assert rd2.returncode == 0, cluster.report()
    assert rd2.result()["integrity"] == "verified"
    assert_holds(rd2, SUMS, DIGEST)
    assert src.returncode is None


def test_a_reader_turned_source_publishes_the_reference_and_reports_what_it_holds(cluster: Cluster) -> None:
    src = cluster.start_source("src", model=MODEL)
    rd = cluster.start_reader("rd", *reader_args("--serve-after-load", "--heartbeat-interval", "0.5",
                                                 "--debug-hooks"), model=MODEL)
    cluster.wait_ready(rd)
    assert rd.info["mx_source_id"] == src.info["mx_source_id"], "it claims the content it verified"
    assert [e["digest"] for e in rd.events("memory_digest")] == [DIGEST, DIGEST]  # loaded, settled
    cluster.signal(rd, signal.SIGUSR2)
    event = cluster.wait_event(rd, "debug_corrupt", timeout=10)
    assert (event["corrupted"], event["tensors"]) == (True, TENSORS)
    cluster.signal(rd, signal.SIGTERM)
    assert cluster.wait_exit(rd, 15) == 0, cluster.report()
    (last,) = rd.events("memory_digest", where=lambda e: e["when"] == "exit")
    # what it holds at exit, not what it was told: every tensor's byte 0 flipped
    flipped = {}
    for i, name in enumerate(SUMS):
        data = bytearray(np.random.Generator(np.random.PCG64([0, i])).bytes(TENSOR_BYTES))
        data[0] ^= 0xFF
        flipped[name] = xxhash.xxh3_64_hexdigest(bytes(data))
    assert last["checksums"] == flipped and last["digest"] != DIGEST
