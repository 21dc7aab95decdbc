"""Our ``model_express.p2p`` matches the published ModelExpress client (0.7.0) on the wire.

The client's descriptor is read from the real ``modelexpress==0.7.0`` wheel (cached by
``.ci/bootstrap`` under ``<cache>/wheels``, else fetched with ``pip download --no-deps``;
skipped, saying so, only when the registry cannot be reached). Nothing of the package is
imported: the descriptor is taken from ``p2p_pb2.py`` as text. The comparison covers the
package, every service and method (input, output, streaming), every message's fields (number,
name, type, type name, label, oneof, proto3 optional, deprecated), map entries and enums; the
comparator itself is shown to catch each kind of drift.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.subjects import wire

VERSION = "0.7.0"


@pytest.fixture(scope="module")
def client_fdp() -> Any:
    wheel, how = wire.client_wheel(VERSION)
    if wheel is None:
        pytest.skip(f"the modelexpress=={VERSION} wheel is not available: {how}")
    return wire.client_descriptor(wheel)


def test_our_descriptors_match_the_published_client(client_fdp: Any) -> None:
    problems = wire.differences(wire.describe(wire.our_descriptor()), wire.describe(client_fdp))
    assert problems == [], "proto/mxref/mx/p2p.proto differs from modelexpress 0.7.0:\n" + "\n".join(problems)


def test_the_client_calls_what_we_serve(client_fdp: Any) -> None:
    """The comparison is not vacuous: the client's file has the services and leases we serve."""
    services = wire.describe(client_fdp)["services"]
    assert set(services[".model_express.p2p.P2pService"]) == {"PublishMetadata", "ListSources", "GetMetadata", "UpdateStatus"}
    assert {"GetTensorManifest", "PrepareTensorRead", "ReleaseTensorRead"} <= set(services[".model_express.p2p.WorkerService"])
    ref = wire.describe(client_fdp)["types"][".model_express.p2p.SourceInstanceRef"]["fields"]
    assert ref[7]["name"] == "training_step" and ref[10] == {
        "name": "source_load", "type": "float", "type_name": "", "label": "optional", "oneof": "_source_load",
        "proto3_optional": True, "deprecated": False,
    }


def _mutated(change: Callable[[Any], None]) -> list[str]:
    ours = wire.our_descriptor()
    theirs = wire.our_descriptor()
    change(theirs)
    return wire.differences(wire.describe(ours), wire.describe(theirs))


def _message(fdp: Any, name: str) -> Any:
    return next(m for m in fdp.message_type if m.name == name)


def _field(fdp: Any, message: str, name: str) -> Any:
    return next(f for f in _message(fdp, message).field if f.name == name)


def _set_limit_number(fdp: Any) -> None:
    _field(fdp, "ListSourcesRequest", "limit").number = 8


def _rename_field(fdp: Any) -> None:
    _field(fdp, "UpdateStatusRequest", "worker_id").name = "worker"


def _change_type(fdp: Any) -> None:
    _field(fdp, "TensorDescriptor", "device_id").type = 4  # TYPE_UINT64


def _repeat(fdp: Any) -> None:
    _field(fdp, "GetMetadataRequest", "worker_id").label = 3  # LABEL_REPEATED


def _leave_oneof(fdp: Any) -> None:
    _field(fdp, "WorkerMetadata", "transfer_engine_session_id").ClearField("oneof_index")


def _renumber_enum(fdp: Any) -> None:
    next(e for e in fdp.enum_type if e.name == "SourceStatus").value[3].number = 4


def _retype_method(fdp: Any) -> None:
    worker = next(s for s in fdp.service if s.name == "WorkerService")
    next(m for m in worker.method if m.name == "PrepareTensorRead").output_type = ".model_express.p2p.GetTensorManifestResponse"


def _drop_method(fdp: Any) -> None:
    p2p = next(s for s in fdp.service if s.name == "P2pService")
    del p2p.method[1]


def _stream(fdp: Any) -> None:
    next(s for s in fdp.service if s.name == "P2pService").method[0].server_streaming = True


def _deprecate(fdp: Any) -> None:
    _field(fdp, "WorkerMetadata", "tensors").options.deprecated = False


def _drop_optional(fdp: Any) -> None:
    _field(fdp, "UpdateStatusRequest", "source_load").proto3_optional = False


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (_set_limit_number, "ListSourcesRequest.fields"),
        (_rename_field, "UpdateStatusRequest.fields.4.name"),
        (_change_type, "TensorDescriptor.fields.4.type"),
        (_repeat, "GetMetadataRequest.fields.2.label"),
        (_leave_oneof, "WorkerMetadata.fields.10.oneof"),
        (_renumber_enum, "SourceStatus.enum.SOURCE_STATUS_STALE"),
        (_retype_method, "WorkerService.PrepareTensorRead.output"),
        (_drop_method, "P2pService.ListSources"),
        (_stream, "P2pService.PublishMetadata.server_streaming"),
        (_deprecate, "WorkerMetadata.fields.3.deprecated"),
        (_drop_optional, "UpdateStatusRequest.fields.5.proto3_optional"),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_the_comparison_catches_each_kind_of_drift(change: Callable[[Any], None], where: str) -> None:
    problems = _mutated(change)
    assert problems, "a changed descriptor compared equal"
    assert any(where in line for line in problems), problems


def test_a_wheel_without_the_module_is_named(tmp_path: Path) -> None:
    wheel = tmp_path / "modelexpress-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("modelexpress/__init__.py", "")
    with pytest.raises(ValueError, match=r"modelexpress-0\.0\.0-py3-none-any\.whl: no modelexpress/p2p_pb2\.py"):
        wire.client_descriptor(wheel)


def test_a_module_without_a_serialized_descriptor_is_named(tmp_path: Path) -> None:
    wheel = tmp_path / "modelexpress-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("modelexpress/p2p_pb2.py", "DESCRIPTOR = None\n")
    with pytest.raises(ValueError, match="no AddSerializedFile"):
        wire.client_descriptor(wheel)


def test_client_classes_live_beside_ours(client_fdp: Any) -> None:
    """The client's classes, built in a pool of their own, read our bytes (and the reverse)."""
    from mxref.mx import p2p_pb2 as ours

    theirs = wire.message_classes(client_fdp)
    ref = ours.SourceInstanceRef(mx_source_id="abc", worker_rank=3, training_step=7, source_load=0.5)
    back = theirs["SourceInstanceRef"].FromString(ref.SerializeToString())
    assert (back.mx_source_id, back.worker_rank, back.training_step, back.source_load) == ("abc", 3, 7, 0.5)
    assert type(back) is not ours.SourceInstanceRef
