"""An events file read while its process may still write (``harness.eventsfile``): whole lines only
(a last line without its newline waits for the next read), a missing file is no events yet, a whole
line that is not a JSON object is an error naming the file and the line, and the filters."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import eventsfile


def test_whole_lines_are_read_and_a_line_being_written_waits(tmp_path: Path) -> None:
    path = tmp_path / "p.events.jsonl"
    assert eventsfile.read(path) == []
    path.write_bytes(b'{"event":"started","ts":1}\n\n{"event":"listening","what":"grpc","port":5}\n{"event":"stat')
    assert [e["event"] for e in eventsfile.read(path)] == ["started", "listening"]
    with open(path, "ab") as out:
        out.write(b'us_change","status":"READY"}\n')
    assert eventsfile.read(path, "status_change") == [{"event": "status_change", "status": "READY"}]
    assert eventsfile.read(path, "listening", lambda e: e.get("what") == "metrics") == []


@pytest.mark.parametrize("line", [b"not json\n", b"[1, 2]\n"])
def test_a_whole_line_that_is_no_json_object_is_an_error_naming_file_and_line(tmp_path: Path, line: bytes) -> None:
    path = tmp_path / "p.events.jsonl"
    path.write_bytes(b'{"event":"started"}\n' + line)
    with pytest.raises(eventsfile.EventsFileError, match=rf"{path}: line 2 is not"):
        eventsfile.read(path)
