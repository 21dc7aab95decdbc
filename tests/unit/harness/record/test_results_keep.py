"""``run --keep N``: the newest N invocations under the results root stay, older ones go, and
nothing that is not an invocation of ours is ever deleted (``harness.record.results``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.record.results import invocation_folders, prune_invocations


def _invocation(root: Path, name: str, finished: bool = True) -> Path:
    folder = root / name
    (folder / "smoke" / "r1").mkdir(parents=True)
    (folder / "smoke" / "r1" / "timeline.jsonl").write_text("x" * 1000)
    if finished:
        (folder / "invocation.json").write_text("{}")
    return folder


def test_keep_deletes_only_the_oldest_finished_invocations_of_ours(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    old, older_same_second, mid, new = (_invocation(root, n) for n in
                                        ("20261201T000000Z", "20261201T000000Z-2", "20261202T000000Z", "20261203T000000Z"))
    running = _invocation(root, "20261130T000000Z", finished=False)  # still running (or cut): not counted, kept
    mine = root / "notes"  # a person's folder
    mine.mkdir()
    (mine / "invocation.json").write_text("{}")
    elsewhere = _invocation(tmp_path, "20261101T000000Z")
    (root / "20261102T000000Z").symlink_to(elsewhere)  # a link: never followed into
    (root / "latest").symlink_to(new.name)
    ten = _invocation(root, "20261201T000000Z-10")  # after -2, though it sorts before it as text

    assert invocation_folders(root) == [old, older_same_second, ten, mid, new]
    deleted = prune_invocations(root, 2, spare=new)
    assert [p for p, _ in deleted] == [old, older_same_second, ten] and all(size >= 1000 for _, size in deleted)
    assert not old.exists() and not older_same_second.exists() and not ten.exists()
    assert mid.is_dir() and new.is_dir() and running.is_dir() and mine.is_dir() and elsewhere.is_dir()
    assert (root / "latest").resolve() == new.resolve()
    assert prune_invocations(root, 2) == []  # nothing more to do


def test_keep_never_deletes_the_invocation_it_spares_and_refuses_zero(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    first, second = _invocation(root, "20261201T000000Z"), _invocation(root, "20261202T000000Z")
    assert [p for p, _ in prune_invocations(root, 1, spare=first)] == []  # the older is the one just written
    assert first.is_dir() and second.is_dir()
    with pytest.raises(ValueError, match="keep at least"):
        prune_invocations(root, 0)
    assert prune_invocations(tmp_path / "none", 3) == []
