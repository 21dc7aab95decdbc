"""mx_source_id must hash exactly as ModelExpress does, or mixed fleets never pair.

The three vectors are the ones ModelExpress pins in both its Python and Rust tests.
"""

from __future__ import annotations

import pytest

from mxref.identity import canonical_json, mx_source_id
from mxref.v1 import p2p_pb2


def base_identity(**changes: object) -> p2p_pb2.SourceIdentity:
    identity = p2p_pb2.SourceIdentity(
        mx_version="0.5.0",
        mx_source_type=p2p_pb2.WEIGHTS,
        model_name="deepseek-ai/DeepSeek-V3",
        backend_framework=p2p_pb2.VLLM,
        tensor_parallel_size=8,
        pipeline_parallel_size=1,
        expert_parallel_size=0,
        dtype="bfloat16",
    )
    for name, value in changes.items():
        if name == "extra_parameters":
            identity.extra_parameters.update(value)
        else:
            setattr(identity, name, value)
    return identity


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, "5a5f555570065064"),
        ({"revision": "abc123def4567890"}, "d0c184b2a9a34c82"),
        ({"extra_parameters": {"Foo": "a", "foo": "b"}}, "bf71fb9340cd940a"),
    ],
    ids=["base", "revision", "extra-case-collision"],
)
def test_modelexpress_vectors(changes: dict[str, object], expected: str) -> None:
    assert mx_source_id(base_identity(**changes)) == expected


def test_string_fields_are_case_insensitive() -> None:
    shouted = base_identity(model_name="DEEPSEEK-AI/DEEPSEEK-V3", dtype="BFloat16", mx_version="0.5.0")
    assert mx_source_id(shouted) == mx_source_id(base_identity())


def test_extra_parameters_ignore_insertion_order_and_key_case() -> None:
    one = base_identity(extra_parameters={"alpha": "1", "beta": "2"})
    two = base_identity()
    two.extra_parameters["BETA"] = "2"
    two.extra_parameters["Alpha"] = "1"
    assert mx_source_id(one) == mx_source_id(two)


def test_case_collision_keeps_the_first_key_in_byte_order() -> None:
    """'Foo' sorts before 'foo' (uppercase first in byte order), so its value wins."""
    identity = base_identity(extra_parameters={"foo": "b", "Foo": "a"})
    assert '"extra_parameters":{"foo":"a"}' in canonical_json(identity)


def test_optional_fields_only_count_when_set() -> None:
    assert "torch_version" not in canonical_json(base_identity())
    assert mx_source_id(base_identity(torch_version="2.5.1")) != mx_source_id(base_identity())


def test_different_content_gives_a_different_id() -> None:
    assert mx_source_id(base_identity(tensor_parallel_size=4)) != mx_source_id(base_identity())


def test_a_rolling_upgrades_versions_never_share_a_source_id() -> None:
    """``mxref source/reader --mx-version``: the identity's version is part of the id, as
    ModelExpress hashes its client version into it (scenarios/incidents/mx_version_skew_rolling_upgrade.yaml)."""
    from mxref import __version__
    from mxref.identity import mx_source_id
    from mxref.roles.source import identity_for

    old, new = identity_for("m", "float16", mx_version="0.7.0"), identity_for("m", "float16", mx_version="0.8.0.dev20261026")
    assert old.mx_version == "0.7.0" and mx_source_id(old) != mx_source_id(new)
    assert identity_for("m", "float16").mx_version == __version__  # unset: this mxref's version
    assert mx_source_id(identity_for("m", "float16", mx_version="0.7.0")) == mx_source_id(old)
