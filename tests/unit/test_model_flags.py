"""The model flags of ``python -m mxref``: where a process's content reference comes from
(``--model-file`` record, else its hashes, else the synthetic spec; ``--expect-digest``
pins it), a source refusing a model file that differs from what it records, and
``prepare`` recording the reference (or, with its ``--data-seed`` debug hook, a
tampered checkpoint). In-process; nothing here starts NIXL or a server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from safetensors.numpy import save_file

from mxref.__main__ import BadInput, build_parser, main, model_from_args, model_reference, parse_argv
from mxref.model import ModelSpec, Reference, generate, load_checkpoint, save_checkpoint
from mxref.options import SourceFlags

SPEC = ModelSpec(name="mxref/synthetic", tensors=3, tensor_bytes=1 << 16, dtype="float16", seed=5)
MODEL = ["--tensors", "3", "--tensor-mib", str((1 << 16) / (1 << 20)), "--seed", "5"]


def parse(*argv: str) -> SourceFlags:
    args = parse_argv(["source", *argv])
    assert isinstance(args, SourceFlags)
    return args


class Events:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.seen.append({"event": event, **fields})


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_checkpoint(generate(SPEC), path, SPEC)
    return path


def flip_last_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # the last tensor's data
    path.write_bytes(bytes(raw))


def test_the_spec_is_the_reference_without_a_file() -> None:
    ref = model_reference(parse(*MODEL))
    assert ref.digest == Reference.from_spec(SPEC).digest and ref.origin == "spec"
    ref2, arena = model_from_args(parse(*MODEL), Events())
    assert ref2.digest == ref.digest and Reference.from_arena(arena).digest == ref.digest


def test_a_file_that_records_its_reference_gives_that_record(prepared: Path) -> None:
    flip_last_byte(prepared)  # a reader reads only the header: the record is the reference
    ref = model_reference(parse("--model-file", str(prepared)))
    assert ref.origin == "recorded" and ref.digest == Reference.from_spec(SPEC).digest


def test_a_file_without_a_record_gives_the_hashes_of_its_tensors(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    save_file({"w": w}, str(path))
    ref = model_reference(parse("--model-file", str(path)))
    assert ref.origin == "hashed" and ref.checksums == {"w": xxhash.xxh3_64_hexdigest(w.tobytes())}
    events = Events()
    ref2, _arena = model_from_args(parse("--model-file", str(path)), events)
    assert ref2.digest == ref.digest
    assert events.seen == [{"event": "content_check", "path": str(path), "ok": None, "tensors": 1, "bad": [],
                            "error": "no recorded reference: serving the hashes of its tensors"}]


def test_a_source_verifies_its_file_before_serving_it(prepared: Path) -> None:
    events = Events()
    ref, _arena = model_from_args(parse("--model-file", str(prepared)), events)
    assert ref.origin == "recorded"
    assert events.seen[-1]["ok"] is True and events.seen[-1]["bad"] == []


def test_a_source_refuses_a_file_that_differs_from_its_record(prepared: Path) -> None:
    flip_last_byte(prepared)
    events = Events()
    with pytest.raises(BadInput) as info:
        model_from_args(parse("--model-file", str(prepared)), events)
    message = str(info.value)
    assert str(prepared) in message and "1 of 3 tensors differ" in message and "refusing to serve it" in message
    assert "model.layers.2.weight" in message
    assert events.seen[-1]["ok"] is False and events.seen[-1]["bad"] == ["model.layers.2.weight"]


def test_a_source_refuses_a_file_whose_record_is_inconsistent(tmp_path: Path) -> None:
    path = tmp_path / "bad-record.safetensors"
    arena = generate(SPEC)
    meta = {**Reference.from_spec(SPEC).metadata(), "mxref_digest": "sha256:" + "1" * 64}
    save_file({n: np.ascontiguousarray(t) for n, t in arena.tensors().items()}, str(path), metadata=meta)
    events = Events()
    with pytest.raises(BadInput, match="mxref_digest"):
        model_from_args(parse("--model-file", str(path)), events)
    assert events.seen[-1]["ok"] is False and "mxref_digest" in events.seen[-1]["error"]


def test_expect_digest_pins_the_reference(prepared: Path) -> None:
    digest = Reference.from_spec(SPEC).digest
    assert model_reference(parse(*MODEL, "--expect-digest", digest.upper().replace("SHA256", "sha256"))).digest == digest
    other = Reference.from_spec(ModelSpec(name=SPEC.name, tensors=3, tensor_bytes=1 << 16, seed=6)).digest
    with pytest.raises(BadInput, match=f"--expect-digest {other}: the model flags give {digest}"):
        model_reference(parse(*MODEL, "--expect-digest", other))
    with pytest.raises(BadInput, match=rf"--expect-digest {other}: --model-file {prepared} give {digest}"):
        model_from_args(parse("--model-file", str(prepared), "--expect-digest", other), Events())
    with pytest.raises(BadInput, match="is not a model digest"):
        model_reference(parse(*MODEL, "--expect-digest", "deadbeef"))


def test_a_missing_model_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"missing\.safetensors"):
        model_reference(parse("--model-file", str(tmp_path / "missing.safetensors")))


def test_prepare_records_the_reference_and_prints_its_digest(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ck.safetensors"
    assert main(["prepare", "--checkpoint", str(path), *MODEL]) == 0
    printed = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    want = Reference.from_spec(SPEC)
    assert printed["digest"] == want.digest
    recorded = Reference.recorded(path)
    assert recorded is not None and recorded.digest == want.digest
    assert Reference.from_file(path).digest == want.digest


def test_prepare_data_seed_writes_a_tampered_checkpoint(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ck.safetensors"
    assert main(["prepare", "--checkpoint", str(path), *MODEL, "--data-seed", "9"]) == 0
    want = Reference.from_spec(SPEC)
    recorded = Reference.recorded(path)
    assert recorded is not None and recorded.digest == want.digest  # it claims the model...
    held = Reference.from_arena(load_checkpoint(path))
    assert len(want.mismatches(held.checksums)) == 3  # ...and holds other bytes


def test_lie_manifest_needs_data_seed(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["source", "--server", "127.0.0.1:1", *MODEL, "--lie-manifest"]) == 2
    assert "--lie-manifest needs --data-seed" in capfd.readouterr().err


def test_the_debug_hooks_are_labelled_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["source", "--help"])
    text = capsys.readouterr().out
    for flag in ("--debug-hooks", "--data-seed", "--lie-manifest"):
        assert flag in text
    assert text.count("DEBUG HOOK") >= 3
