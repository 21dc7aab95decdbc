"""``mxchaos lab up --inventory-out FILE``: the inventory it writes (issue 36, the smaller holes)."""

from __future__ import annotations

import stat
from pathlib import Path

from harness.hosts import lab
from harness.hosts.inventory import load_inventory

INFO = {"state": "/nonexistent/lab", "hosts": {"h1": {"mgmt_address": "10.214.1.10", "work_dir": "/nonexistent/lab/h1/work",
                                                       "data_address": "10.214.2.10", "data_device": "cable0"}}}


def test_a_symlink_at_the_inventory_path_is_replaced_never_followed(tmp_path: Path) -> None:
    """On the parent commit the inventory was written through a link planted at ``--inventory-out``
    (into whatever file it named, e.g. one root owns elsewhere)."""
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / "inv.yaml"
    out.symlink_to(victim)
    lab.write_inventory(INFO, out)
    assert victim.read_text() == "keep me\n"
    assert stat.S_ISREG(out.lstat().st_mode)
    inv = load_inventory(out)
    assert inv.machines["h1"].work_dir == "/nonexistent/lab/h1/work"
    assert inv.machines["h1"].repo == str(Path(__file__).resolve().parents[4])  # the checkout (was harness/)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv.yaml", "victim"]  # no temporary left
