"""The harness's own expected content: the same model mxref generates (held to the generator
here, so the two cannot drift), the model file read with safetensors, and the tampered
checkpoint copy a ``tamper_checkpoint`` reader falls back to."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xxhash
from safetensors import safe_open

import mxref.model
from harness.errors import HarnessError, ScenarioInvalid
from harness.judge import content
from harness.record.timeline import Timeline
from harness.scenario import parse_scenario
from harness.scenario.models import TamperCheckpoint

SCENARIO = """\
name: demo
seed: 7
model: {tensors: 3, tensor_mib: 0.01, dtype: float16}
processes:
  server: {role: server}
  source-1: {role: source, options: {data_seed: 8, debug_hooks: true}}
  reader-1: {role: reader, options: {settle_s: 1s}}
steps:
  - start: [server, source-1]
"""


def test_the_expected_model_is_what_mxrefs_generator_makes_from_the_scenario_flags() -> None:
    sc = parse_scenario(SCENARIO, "x.yaml")
    model = content.expected_model(sc)
    # 0.01 MiB = 10485.76 B -> 10485 -> 10484 (a multiple of float16's 2 bytes), as mxref's command line makes it
    spec = mxref.model.ModelSpec(name="mxref/synthetic", tensors=3, tensor_bytes=10484, dtype="float16", seed=7)
    assert model.checksums() == mxref.model.expected_checksums(spec)
    assert [(t.name, t.dtype, t.shape) for t in model.tensors] == [
        (t.name, t.dtype, t.shape) for t in spec.tensor_specs()
    ]
    assert model.origin == "generator: 3 x 10484 B float16, seed 7"
    # another seed is another model: the oracle is not blind to the bytes
    other = mxref.model.expected_checksums(mxref.model.ModelSpec(tensors=3, tensor_bytes=10484, seed=8))
    assert set(model.checksums().values()).isdisjoint(other.values())


def test_the_oracle_draws_a_tensor_of_many_slices_as_one_draw() -> None:
    """Drawn and hashed in slices, a tensor of two slices and 6 bytes is the generator's one
    draw (``Generator.bytes`` of the same PCG64 here), and mxref's generator agrees."""
    nbytes = 2 * content.GENERATED_SLICE_BYTES + 6
    whole = np.random.Generator(np.random.PCG64([9, 1])).bytes(nbytes)
    assert content.tensor_checksum(9, 1, nbytes) == xxhash.xxh3_64_hexdigest(whole)
    spec = mxref.model.ModelSpec(tensors=2, tensor_bytes=nbytes, dtype="float16", seed=9)
    assert list(mxref.model.expected_checksums(spec).values())[1] == xxhash.xxh3_64_hexdigest(whole)


def test_the_digest_is_sha256_of_canonical_json_rows() -> None:
    tensors = (content.ExpectedTensor("a", "float16", (2, 3), "00ff"),)
    import hashlib

    blob = b'[["a","float16",[2,3],"00ff"]]'
    assert content.digest_of(tensors) == "sha256:" + hashlib.sha256(blob).hexdigest()


def test_lazy_expected_computes_once(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = parse_scenario(SCENARIO, "x.yaml")
    calls: list[int] = []
    real = content.expected_model

    def counting(s: object) -> content.ExpectedModel:
        calls.append(1)
        return real(sc)

    monkeypatch.setattr(content, "expected_model", counting)
    lazy = content.lazy_expected(sc)
    assert calls == []
    assert lazy() is lazy()
    assert calls == [1]


def _checkpoint(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    spec = mxref.model.ModelSpec(tensors=3, tensor_bytes=4096, dtype="float16", seed=5)
    arena = mxref.model.generate(spec)
    path = tmp_path / "model.safetensors"
    mxref.model.save_checkpoint(arena, path, spec)
    return path, mxref.model.expected_checksums(spec)


def test_a_model_file_is_read_with_safetensors_and_hashed_by_the_harness(tmp_path: Path) -> None:
    path, sums = _checkpoint(tmp_path)
    (tmp_path / "s.yaml").write_text(SCENARIO.replace("{tensors: 3, tensor_mib: 0.01, dtype: float16}", "{file: model.safetensors}"))
    from harness.scenario import load_scenario

    model = content.expected_model(load_scenario(tmp_path / "s.yaml"))
    assert model.checksums() == sums
    assert model.origin == f"file: {path}"
    path.unlink()
    with pytest.raises(HarnessError, match=r"model.file .*model.safetensors: no such file"):
        content.expected_model(load_scenario(tmp_path / "s.yaml"))


def _recorded(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="numpy") as f:
        return dict(json.loads((f.metadata() or {})["mxref_checksums"]))


def _actual(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="numpy") as f:
        return {n: xxhash.xxh3_64_hexdigest(np.ascontiguousarray(f.get_tensor(n)).view(np.uint8).data) for n in f.keys()}  # noqa: SIM118 - safe_open is not a dict


def test_tamper_copy_flips_one_byte_and_lies_consistently_or_not(tmp_path: Path) -> None:
    src, sums = _checkpoint(tmp_path)
    dst = tmp_path / "run" / "t.safetensors"
    record = content.tamper_copy(src, dst, TamperCheckpoint(tensor=1, byte=3))
    assert _actual(src) == sums  # the original is untouched
    actual = _actual(dst)
    assert [n for n in sums if actual[n] != sums[n]] == ["model.layers.1.weight"]
    assert _recorded(dst) == actual  # consistent: its own checksums vouch for the tampered bytes
    assert record["tensor"] == "model.layers.1.weight" and record["checksum_after"] == actual["model.layers.1.weight"]
    honest = content.tamper_copy(src, tmp_path / "h.safetensors", TamperCheckpoint(consistent=False))
    assert _recorded(tmp_path / "h.safetensors") == sums and honest["tensor"] == "model.layers.0.weight"
    with pytest.raises(HarnessError, match=r"tamper_checkpoint.tensor: 3 is not a tensor index of .* \(it holds 3 tensors: 0..2\)"):
        content.tamper_copy(src, dst, TamperCheckpoint(tensor=3))
    with pytest.raises(HarnessError, match=r"tamper_checkpoint\.byte: 4096 is past the end of tensor 'model\.layers\.0\.weight'"):
        content.tamper_copy(src, dst, TamperCheckpoint(byte=4096))


def test_reader_checkpoint_is_a_tampered_copy_in_the_run_folder_only_for_that_reader(tmp_path: Path) -> None:
    src, sums = _checkpoint(tmp_path)
    text = SCENARIO.replace("reader-1: {role: reader, options: {settle_s: 1s}}", textwrap.dedent("""\
        reader-1: {role: reader, tamper_checkpoint: {tensor: 2}}
          reader-2: {role: reader}"""))
    sc = parse_scenario(text, "x.yaml")
    timeline = Timeline()
    run_dir = tmp_path / "run"
    assert content.reader_checkpoint(sc, "reader-2", src, run_dir, timeline) == src
    got = content.reader_checkpoint(sc, "reader-1", src, run_dir, timeline)
    assert got == run_dir / "checkpoints" / "reader-1.tampered.safetensors"
    assert _actual(got)["model.layers.2.weight"] != sums["model.layers.2.weight"]
    assert content.reader_checkpoint(sc, "reader-1", src, run_dir, timeline) == got  # written once
    entries = timeline.snapshot().select(actor="harness", f="tamper_checkpoint")
    assert len(entries) == 1 and entries[0].value["reader"] == "reader-1"


def test_tamper_checkpoint_with_a_checkpoint_of_its_own_is_a_clear_error() -> None:
    text = SCENARIO.replace(
        "reader-1: {role: reader, options: {settle_s: 1s}}",
        "reader-1: {role: reader, options: {checkpoint: x.safetensors}, tamper_checkpoint: {}}",
    )
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(text, "x.yaml")
    rendered = [issue.render("x.yaml") for issue in info.value.issues]
    assert len(rendered) == 1 and "processes.reader-1" in rendered[0], rendered
    assert "tamper_checkpoint tampers a copy of the run's prepared checkpoint" in rendered[0]
    assert "cannot be combined with options.checkpoint" in rendered[0]


def test_the_grown_generation_is_the_same_seeds_model_with_more_tensors() -> None:
    """A source's ``grow_tensors`` adds the generator's next tensors: the harness's grown generation is
    the scenario's model with that many more tensors of its size, and mxref's generator agrees."""
    sc = parse_scenario(SCENARIO, "x.yaml")
    grown = content.grown_model(sc, 2)
    bigger = parse_scenario(SCENARIO.replace("tensors: 3", "tensors: 5"), "x.yaml")
    assert grown.tensors == content.expected_model(bigger).tensors
    assert grown.tensors[:3] == content.expected_model(sc).tensors
    spec = mxref.model.ModelSpec(name="mxref/synthetic", tensors=5, tensor_bytes=10484, dtype="float16", seed=7)
    assert grown.checksums() == mxref.model.expected_checksums(spec)
    assert content.lazy_grown(sc)(2) == grown


def test_a_model_file_cannot_grow(tmp_path: Path) -> None:
    sc = parse_scenario(SCENARIO.replace("model: {tensors: 3, tensor_mib: 0.01, dtype: float16}",
                                         "model: {file: m.safetensors}"), "x.yaml")
    with pytest.raises(HarnessError, match="cannot grow"):
        content.grown_model(sc, 2)
