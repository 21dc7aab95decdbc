"""Every fault proves it landed (issue 35), for the toxics a probe of a few bytes does not show:
``bandwidth``, ``slicer`` and ``limit_data``. Their witness is the harness's own probe carrying a
load on the toxic's stream (``harness.faults._toxic_effect``), timed straight to the proxy's
upstream and through the run's real toxiproxy server, and the traffic of the proxy's clients while
the toxic held. Each lands on a proxy a live source heartbeats through (effect seen at inject and
at heal: the run passes) and is aimed at nothing: a proxy no client uses (NOT EXERCISED by the heal's
witness), a toxic of toxicity 0 (NOT EXERCISED by the read back) and a slicer put on the other
stream than the scenario's (NOT EXERCISED by the probe itself). The
upstream is real mxref's metadata server (a gRPC server answers the probe)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fixtures.witness_runs import run_witnessed as run
from fixtures.witness_runs import toxic_on, witnessed

from harness.record.witness import Witness
from harness.scenario import capabilities
from harness.toxiproxy import ToxiproxyAPI

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240),
              pytest.mark.skipif(bool(capabilities.missing(["toxiproxy"])), reason="this machine lacks toxiproxy")]

TOXICS = {
    # 6000 bytes back (667 acknowledged SETTINGS) at 20 KB/s: the probe takes 300 ms more
    "bandwidth": "type: bandwidth, stream: downstream, attributes: {rate: 20}",
    # 150 slices of at most 1024 bytes on the way in, 2 ms after each: 300 ms more
    "slicer": "type: slicer, stream: upstream, attributes: {average_size: 1000, size_variation: 24, delay: 2000}",
    # the connection is closed after 2000 bytes back: the probe asks for 6096
    "limit_data": "type: limit_data, stream: downstream, attributes: {bytes: 2000}",
}


def windows(result: Any) -> tuple[Witness, Witness]:
    (inject, heal) = next(w for w in result.history.fault_windows() if w.name == "t").witnesses
    return inject, heal


@pytest.mark.parametrize("kind", list(TOXICS))
def test_a_load_toxic_is_seen_by_a_loaded_probe_and_not_exercised_where_it_touches_no_client(
        tmp_path: Path, kind: str) -> None:
    landed = run(tmp_path / "landed", toxic_on("mds", f"toxicity: 1, {TOXICS[kind]}", heartbeat="200ms"), fake=False)
    inject, heal = windows(landed)
    assert (landed.verdict, inject.effect, heal.effect) == ("pass", "seen", "seen"), (landed.not_exercised, inject, heal)
    figures = dict(inject.figures)
    assert figures["listed_toxicity"] == 1 and figures["direct_code"] == "ACK" and figures["load_bytes"] > 0
    if kind == "limit_data":
        assert figures["through_code"] in ("CLOSED", "RESET"), figures  # cut before its last acknowledgement
    else:
        assert figures["through_code"] == "ACK" and figures["added_ms"] >= figures["expected_ms"] / 2 == 150, figures

    # on a proxy no client uses: the probe's own connection is not its clients' traffic
    idle = run(tmp_path / "idle", toxic_on("idle", f"toxicity: 1, {TOXICS[kind]}", heartbeat="200ms"), fake=False)
    inject, heal = windows(idle)
    assert (idle.verdict, inject.effect, heal.effect) == ("not_exercised", "seen", "none"), (kind, inject, heal)
    assert heal.figures["closed_bytes"] == 0 and "no connection through proxy idle" in idle.not_exercised[0]

    # applied to no connection: the read back says so, whatever went through
    spared = run(tmp_path / "spared", toxic_on("mds", f"toxicity: 0, {TOXICS[kind]}", heartbeat="200ms"), fake=False)
    assert (spared.verdict, witnessed(spared)["t"][0]) == ("not_exercised", "none")
    assert "with toxicity 0" in spared.not_exercised[0]


def test_a_slicer_added_on_the_other_stream_is_not_exercised_by_the_probe(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted regression: the toxic goes in on the stream the scenario did not name. toxiproxy lists
    it with toxicity 1 and the source's traffic crosses it, but the probe's load (upstream) is not
    sliced: only the probe shows that the toxic is not where the scenario put it."""
    add = ToxiproxyAPI.add_toxic
    monkeypatch.setattr(ToxiproxyAPI, "add_toxic", lambda self, proxy, body: add(self, proxy, {**body, "stream": "downstream"}))
    missed = run(tmp_path, toxic_on("mds", f"toxicity: 1, {TOXICS['slicer']}", heartbeat="200ms"), fake=False)
    inject, heal = windows(missed)
    assert (missed.verdict, inject.effect, heal.effect) == ("not_exercised", "none", "seen"), (inject, heal)
    assert inject.figures["through_code"] == "ACK" and inject.figures["added_ms"] < 150, inject
    assert "for the 300 ms a slicer toxic adds" in missed.not_exercised[0]
