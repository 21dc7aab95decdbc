"""Inventory files: validation (every problem named by file, line, key and rule), defaults,
relative paths, and how a scenario's hosts bind to machines."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.hosts.inventory import InventoryInvalid, bind_hosts, load_inventory, parse_inventory

GOOD = """\
defaults:
  user: root
  identity_file: keys/id_ed25519
  known_hosts: {policy: strict, file: known_hosts}
  env: {UCX_LOG_LEVEL: warn}
machines:
  h1: {address: 10.0.0.1, data: {address: 10.1.0.1, device: mxd0}, env: {UCX_RC_TIMEOUT: 1s}}
  h2: {address: node-2.example, port: 2222, known_hosts: off, venv: /opt/venv, sudo: true}
  h3: {address: 10.0.0.3, accelerator: {kind: cuda, device: 1}, transport: rdma}
bind: {ctl: h3}
"""


def _problems(text: str) -> list[str]:
    with pytest.raises(InventoryInvalid) as err:
        parse_inventory(text, "inv.yaml")
    return [issue.render("inv.yaml") for issue in err.value.issues]


def test_defaults_merge_and_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    (tmp_path / "inv.yaml").write_text(GOOD)
    inv = load_inventory(tmp_path / "inv.yaml")
    h1, h2 = inv.machines["h1"], inv.machines["h2"]
    assert h1.identity_file == tmp_path / "keys" / "id_ed25519"
    assert h1.known_hosts.file == tmp_path / "known_hosts"
    assert h1.env == {"UCX_LOG_LEVEL": "warn", "UCX_RC_TIMEOUT": "1s"}  # env maps merge
    assert (h1.data_address, h1.data.device, h1.target) == ("10.1.0.1", "mxd0", "root@10.0.0.1")
    assert (h2.port, h2.known_hosts.policy, h2.interpreter, h2.sudo) == (2222, "off", "/opt/venv/bin/python", True)
    assert h2.data_address == "node-2.example"  # no data plane: the ssh address
    assert inv.machines["h3"].accelerator.device == 1


def test_every_problem_is_named_with_line_key_and_rule() -> None:
    text = "machines:\n  h1: {address: 'bad host', port: 0, colour: red}\n  h2: {address: 10.0.0.2, work_dir: rel}\n"
    problems = _problems(text)
    assert len(problems) == 4
    assert any("inv.yaml:2: machines.h1.colour: unknown key" in p for p in problems)
    assert any("machines.h1.port:" in p and "greater than or equal to 1" in p for p in problems)
    assert any("machines.h1.address: an address must be an IP address or a host name" in p for p in problems)
    assert any("inv.yaml:3: machines.h2.work_dir: a work dir is absolute (start with /) or under the login" in p for p in problems)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("machines: {}", "machines: Dictionary should have at least 1 item"),
        ("foo: 1\nmachines: {h1: {address: 1.1.1.1}}", "inv.yaml:1: foo: unknown key"),
        ("machines: {h1: {address: 1.1.1.1}}\nbind: {a: zz}", "inv.yaml:2: bind.a: no machine named 'zz'"),
        ("defaults: {address: 1.1.1.1}\nmachines: {h1: {address: 1.1.1.1}}", "defaults.address: every machine has its own"),
        ("defaults: {port: x}\nmachines: {h1: {address: 1.1.1.1}}", "defaults.port:"),
        ("machines: {h1: {address: 1.1.1.1, python: /p, venv: /v}}", "give python or venv, not both"),
        ("machines: {h1: {address: 1.1.1.1, accelerator: {kind: cpu, device: 0}}}", "a device id is for kind cuda only"),
        ("machines: {h1: {address: 1.1.1.1, data: {device: a-very-long-device-name}}}", "machines.h1.data.device:"),
        ("machines: {h1: {address: 1.1.1.1, env: {1X: y}}}", "is not an environment variable name"),
        ("machines: {h1: {address: 1.1.1.1, known_hosts: {policy: off, file: k}}}", "policy off checks no file"),
        ("machines: {h1: {address: 1.1.1.1}}\nmachines: {}", "duplicate"),
        ("machines: [a", "not valid YAML"),
        ("- a", "an inventory is a mapping"),
    ],
)
def test_bad_input_is_refused_naming_the_key_and_rule(text: str, expected: str) -> None:
    assert any(expected in p for p in _problems(text)), _problems(text)


def test_an_unreadable_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(InventoryInvalid, match=r"nope\.yaml.*cannot read the file"):
        load_inventory(tmp_path / "nope.yaml")


def test_binding_bind_then_same_name_then_the_next_free_machine_in_order() -> None:
    inv = parse_inventory(GOOD)
    got = bind_hosts(["ctl", "a", "h1"], inv)
    assert got == {"ctl": "h3", "h1": "h1", "a": "h2"}
    assert bind_hosts(["local"], inv) == {"local": "h1"}


def test_too_many_hosts_is_an_error_naming_the_host() -> None:
    inv = parse_inventory("machines: {h1: {address: 1.1.1.1}, h2: {address: 1.1.1.2}}")
    with pytest.raises(HarnessError, match=r"partition_mid_read: host 'c' cannot be bound"):
        bind_hosts(["a", "b", "c"], inv, scenario="partition_mid_read")


def test_explicit_bind_may_share_a_machine() -> None:
    inv = parse_inventory("machines: {h1: {address: 1.1.1.1}}\nbind: {a: h1, b: h1}")
    assert bind_hosts(["a", "b"], inv) == {"a": "h1", "b": "h1"}


class _Config:
    """What ``harness.cli.pytest_plugin._inventory`` reads of a pytest config."""

    def __init__(self, path: Path | None) -> None:
        self.stash = pytest.Stash()
        self._path = path

    def getoption(self, name: str) -> object:
        assert name == "mxchaos_inventory"
        return None if self._path is None else str(self._path)


def test_the_pytest_option_loads_the_inventory_once_and_refuses_a_bad_one(tmp_path: Path) -> None:
    from harness.cli.pytest_plugin import _inventory

    assert _inventory(_Config(None)) is None  # type: ignore[arg-type]
    good = tmp_path / "inv.yaml"
    good.write_text(GOOD)
    config = _Config(good)
    first = _inventory(config)  # type: ignore[arg-type]
    assert first is _inventory(config) and set(first.machines) == {"h1", "h2", "h3"}  # type: ignore[arg-type]
    bad = tmp_path / "bad.yaml"
    bad.write_text("machines: {h1: {address: 1.1.1.1, port: 0}}\n")
    with pytest.raises(pytest.UsageError, match=r"bad\.yaml:1: machines\.h1\.port"):
        _inventory(_Config(bad))  # type: ignore[arg-type]


def test_only_a_live_run_that_may_use_a_machine_keeps_the_sweep_off_its_qdisc(tmp_path: Path) -> None:
    from harness.hosts.ssh_sweep import may_use

    (tmp_path / "inv.yaml").write_text(GOOD)
    inv = load_inventory(tmp_path / "inv.yaml")
    h1, h2 = inv.machines["h1"], inv.machines["h2"]
    on_h2 = {"ssh": True, "hosts": {"a": {"ssh": "root@node-2.example:2222"}}}
    assert may_use(on_h2, h2) and not may_use(on_h2, h1)
    assert may_use({"ssh": True}, h1)  # over ssh, its hosts not opened yet: maybe
    # a run on this machine alone (netns or local hosts; another pytest worker's): never
    assert not may_use({"ssh": False}, h1) and not may_use({"ssh": False, "network": {}}, h1)
    assert may_use({}, h1) and not may_use({"network": {}}, h1)  # an older harness's entry


def _alias_bomb(depth: int) -> str:
    """Ten lines whose aliases expand ninefold per level: 9**depth nodes under ``junk:``."""
    text = "l0: &l0 [x, x, x, x, x, x, x, x, x]\n"
    for level in range(1, depth + 1):
        text += f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]\n"
    return "machines: {h1: {address: 10.0.0.1}}\n" + text


def test_an_alias_bomb_inventory_is_refused_at_once_naming_the_file(tmp_path: Path) -> None:
    """Issue 36 item 8: a ten-line inventory at depth 8 took 19.6 s (about 9x per level) in
    ``duplicate_keys`` and validation walking the expanded tree; the scenario loader's expansion
    guard now refuses it before anything walks it (measured: a few milliseconds)."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(8))
    t0 = time.monotonic()
    with pytest.raises(InventoryInvalid) as err:
        load_inventory(path)
    elapsed = time.monotonic() - t0
    text = str(err.value)
    assert str(path) in text and "YAML aliases expand the document past 100000 nodes" in text, text
    assert elapsed < 1.0, f"the depth-8 bomb took {elapsed:.2f} s to refuse"


def test_a_self_referring_alias_inventory_is_refused() -> None:
    assert _problems("machines: {h1: {address: 10.0.0.1}}\nx: &a [1, *a]\n") == [
        "inv.yaml:2: a YAML alias refers to the node that contains it"
    ]


def test_the_default_work_dir_is_under_the_logins_home_never_a_shared_temp_dir() -> None:
    from harness.hosts.ssh_remote import shell_path

    inv = parse_inventory("machines: {h1: {address: 10.0.0.1}}\n")
    assert inv.machines["h1"].work_dir == "~/.cache/mxchaos/work"
    assert shell_path(inv.machines["h1"].work_dir) == '"$HOME"/.cache/mxchaos/work'
    assert shell_path("/srv/a b") == "'/srv/a b'"
