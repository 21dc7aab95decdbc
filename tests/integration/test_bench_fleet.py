"""``python -m mxref.bench.fleet`` at a small size: a real gRPC server on loopback, heartbeats
from this process and from client processes, the reaper acting mid-run, the JSON it prints."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mxref.metadata.transport import DEFAULT_GRPC_IMPL

SMALL = ["--sources", "40", "--ranks", "4", "--identities", "2", "--silent", "4", "--idle-calls", "5",
         "--seconds", "1.5", "--clients", "2", "--window", "2"]


def run_bench(*extra: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "mxref.bench.fleet", *SMALL, *extra], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(("processes", "flags"), [
    ("0", []),
    ("2", []),
    ("0", ["--native-clients", "--grpc-impl", "grpcio"]),
    ("0", ["--native-clients", "--grpc-impl", "native", "--rate", "200", "--list-interval", "0.05"]),
], ids=["python-clients", "client-processes", "native-clients", "native-server-paced"])
def test_the_fleet_bench_serves_heartbeats_and_lists(processes: str, flags: list[str]) -> None:
    result = run_bench("--client-processes", processes, *flags)
    beats = result["heartbeats_grpc"]
    assert isinstance(beats, dict) and beats["ok"] > 0 and beats["rejected"] == 0
    assert beats.get("processes", 0) == int(processes)
    assert result["grpc_impl"] == (flags[flags.index("--grpc-impl") + 1] if flags else DEFAULT_GRPC_IMPL)
    if "--rate" in flags:  # paced: about the rate asked for, not the server's ceiling (1.5 s at 200/s)
        assert 150 <= beats["ok"] <= 320, beats
    assert result["records"] == 160
    sizes = result["list_sizes"]
    # identity 0: 20 sources x 4 ranks, and the silent READY workers (rank 0) until the reaper acts
    assert isinstance(sizes, dict) and 80 <= sizes["identity"] <= 82 and sizes["identity+rank"] == 20
    idle = result["list_idle"]
    assert isinstance(idle, dict) and idle["identity"]["n"] == 5


@pytest.mark.parametrize(("flags", "message"), [
    (["--clients", "0"], "--clients 0: must be >= 1"),
    (["--native-clients", "--client-processes", "2"], "no --client-processes"),
    (["--rate", "-1"], "must be >= 0"),
])
def test_bad_flags_name_the_flag(flags: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "mxref.bench.fleet", *flags], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and message in done.stderr
