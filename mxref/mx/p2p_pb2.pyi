from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SourceStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SOURCE_STATUS_UNKNOWN: _ClassVar[SourceStatus]
    SOURCE_STATUS_INITIALIZING: _ClassVar[SourceStatus]
    SOURCE_STATUS_READY: _ClassVar[SourceStatus]
    SOURCE_STATUS_STALE: _ClassVar[SourceStatus]

class MxSourceType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MX_SOURCE_TYPE_WEIGHTS: _ClassVar[MxSourceType]
    MX_SOURCE_TYPE_LORA: _ClassVar[MxSourceType]
    MX_SOURCE_TYPE_CUDA_GRAPH: _ClassVar[MxSourceType]
    MX_SOURCE_TYPE_TORCH_COMPILE_CACHE: _ClassVar[MxSourceType]
    MX_SOURCE_TYPE_TRITON_CACHE: _ClassVar[MxSourceType]
    MX_SOURCE_TYPE_DEEP_GEMM_CACHE: _ClassVar[MxSourceType]
    MX_SOURCE_TYPE_TILELANG_CACHE: _ClassVar[MxSourceType]
    MX_SOURCE_TYPE_CUTE_DSL_CACHE: _ClassVar[MxSourceType]
    MX_SOURCE_TYPE_FLASHINFER_CACHE: _ClassVar[MxSourceType]
    MX_SOURCE_TYPE_TVM_FFI_CACHE: _ClassVar[MxSourceType]

class BackendFramework(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKEND_FRAMEWORK_UNKNOWN: _ClassVar[BackendFramework]
    BACKEND_FRAMEWORK_VLLM: _ClassVar[BackendFramework]
    BACKEND_FRAMEWORK_SGLANG: _ClassVar[BackendFramework]
    BACKEND_FRAMEWORK_TRT_LLM: _ClassVar[BackendFramework]
SOURCE_STATUS_UNKNOWN: SourceStatus
SOURCE_STATUS_INITIALIZING: SourceStatus
SOURCE_STATUS_READY: SourceStatus
SOURCE_STATUS_STALE: SourceStatus
MX_SOURCE_TYPE_WEIGHTS: MxSourceType
MX_SOURCE_TYPE_LORA: MxSourceType
MX_SOURCE_TYPE_CUDA_GRAPH: MxSourceType
MX_SOURCE_TYPE_TORCH_COMPILE_CACHE: MxSourceType
MX_SOURCE_TYPE_TRITON_CACHE: MxSourceType
MX_SOURCE_TYPE_DEEP_GEMM_CACHE: MxSourceType
MX_SOURCE_TYPE_TILELANG_CACHE: MxSourceType
MX_SOURCE_TYPE_CUTE_DSL_CACHE: MxSourceType
MX_SOURCE_TYPE_FLASHINFER_CACHE: MxSourceType
MX_SOURCE_TYPE_TVM_FFI_CACHE: MxSourceType
BACKEND_FRAMEWORK_UNKNOWN: BackendFramework
BACKEND_FRAMEWORK_VLLM: BackendFramework
BACKEND_FRAMEWORK_SGLANG: BackendFramework
BACKEND_FRAMEWORK_TRT_LLM: BackendFramework

class SourceIdentity(_message.Message):
    __slots__ = ("mx_version", "mx_source_type", "model_name", "backend_framework", "tensor_parallel_size", "pipeline_parallel_size", "expert_parallel_size", "dtype", "quantization", "extra_parameters", "revision", "backend_framework_version", "torch_version", "cuda_version", "triton_version", "gpu_arch", "compile_config_digest")
    class ExtraParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MX_VERSION_FIELD_NUMBER: _ClassVar[int]
    MX_SOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FRAMEWORK_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXPERT_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    EXTRA_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FRAMEWORK_VERSION_FIELD_NUMBER: _ClassVar[int]
    TORCH_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRITON_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPU_ARCH_FIELD_NUMBER: _ClassVar[int]
    COMPILE_CONFIG_DIGEST_FIELD_NUMBER: _ClassVar[int]
    mx_version: str
    mx_source_type: MxSourceType
    model_name: str
    backend_framework: BackendFramework
    tensor_parallel_size: int
    pipeline_parallel_size: int
    expert_parallel_size: int
    dtype: str
    quantization: str
    extra_parameters: _containers.ScalarMap[str, str]
    revision: str
    backend_framework_version: str
    torch_version: str
    cuda_version: str
    triton_version: str
    gpu_arch: str
    compile_config_digest: str
    def __init__(self, mx_version: _Optional[str] = ..., mx_source_type: _Optional[_Union[MxSourceType, str]] = ..., model_name: _Optional[str] = ..., backend_framework: _Optional[_Union[BackendFramework, str]] = ..., tensor_parallel_size: _Optional[int] = ..., pipeline_parallel_size: _Optional[int] = ..., expert_parallel_size: _Optional[int] = ..., dtype: _Optional[str] = ..., quantization: _Optional[str] = ..., extra_parameters: _Optional[_Mapping[str, str]] = ..., revision: _Optional[str] = ..., backend_framework_version: _Optional[str] = ..., torch_version: _Optional[str] = ..., cuda_version: _Optional[str] = ..., triton_version: _Optional[str] = ..., gpu_arch: _Optional[str] = ..., compile_config_digest: _Optional[str] = ...) -> None: ...

class TensorDescriptor(_message.Message):
    __slots__ = ("name", "addr", "size", "device_id", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    addr: int
    size: int
    device_id: int
    dtype: str
    def __init__(self, name: _Optional[str] = ..., addr: _Optional[int] = ..., size: _Optional[int] = ..., device_id: _Optional[int] = ..., dtype: _Optional[str] = ...) -> None: ...

class TensorSourceMetadata(_message.Message):
    __slots__ = ("tensors",)
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorDescriptor]
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorDescriptor, _Mapping]]] = ...) -> None: ...

class ArtifactSourceMetadata(_message.Message):
    __slots__ = ("artifact_id", "total_size", "file_count", "chunk_count", "node_rank")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    FILE_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    total_size: int
    file_count: int
    chunk_count: int
    node_rank: int
    def __init__(self, artifact_id: _Optional[str] = ..., total_size: _Optional[int] = ..., file_count: _Optional[int] = ..., chunk_count: _Optional[int] = ..., node_rank: _Optional[int] = ...) -> None: ...

class WorkerMetadata(_message.Message):
    __slots__ = ("worker_rank", "nixl_metadata", "transfer_engine_session_id", "tensors", "status", "updated_at", "metadata_endpoint", "agent_name", "worker_grpc_endpoint", "accelerator", "topology", "tensor_source", "artifact_source")
    class TopologyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKER_RANK_FIELD_NUMBER: _ClassVar[int]
    NIXL_METADATA_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ENGINE_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    METADATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_GRPC_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    TENSOR_SOURCE_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    worker_rank: int
    nixl_metadata: bytes
    transfer_engine_session_id: str
    tensors: _containers.RepeatedCompositeFieldContainer[TensorDescriptor]
    status: SourceStatus
    updated_at: int
    metadata_endpoint: str
    agent_name: str
    worker_grpc_endpoint: str
    accelerator: str
    topology: _containers.ScalarMap[str, str]
    tensor_source: TensorSourceMetadata
    artifact_source: ArtifactSourceMetadata
    def __init__(self, worker_rank: _Optional[int] = ..., nixl_metadata: _Optional[bytes] = ..., transfer_engine_session_id: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[TensorDescriptor, _Mapping]]] = ..., status: _Optional[_Union[SourceStatus, str]] = ..., updated_at: _Optional[int] = ..., metadata_endpoint: _Optional[str] = ..., agent_name: _Optional[str] = ..., worker_grpc_endpoint: _Optional[str] = ..., accelerator: _Optional[str] = ..., topology: _Optional[_Mapping[str, str]] = ..., tensor_source: _Optional[_Union[TensorSourceMetadata, _Mapping]] = ..., artifact_source: _Optional[_Union[ArtifactSourceMetadata, _Mapping]] = ...) -> None: ...

class PublishMetadataRequest(_message.Message):
    __slots__ = ("identity", "worker", "worker_id", "pod_name", "pod_uid", "pod_namespace")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    identity: SourceIdentity
    worker: WorkerMetadata
    worker_id: str
    pod_name: str
    pod_uid: str
    pod_namespace: str
    def __init__(self, identity: _Optional[_Union[SourceIdentity, _Mapping]] = ..., worker: _Optional[_Union[WorkerMetadata, _Mapping]] = ..., worker_id: _Optional[str] = ..., pod_name: _Optional[str] = ..., pod_uid: _Optional[str] = ..., pod_namespace: _Optional[str] = ...) -> None: ...

class PublishMetadataResponse(_message.Message):
    __slots__ = ("success", "message", "mx_source_id", "worker_id")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    mx_source_id: str
    worker_id: str
    def __init__(self, success: bool = ..., message: _Optional[str] = ..., mx_source_id: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class ListSourcesRequest(_message.Message):
    __slots__ = ("identity", "status_filter", "model_name_filter", "worker_rank_filter", "min_training_step", "min_updated_at", "limit")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FILTER_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FILTER_FIELD_NUMBER: _ClassVar[int]
    WORKER_RANK_FILTER_FIELD_NUMBER: _ClassVar[int]
    MIN_TRAINING_STEP_FIELD_NUMBER: _ClassVar[int]
    MIN_UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    identity: SourceIdentity
    status_filter: SourceStatus
    model_name_filter: str
    worker_rank_filter: int
    min_training_step: int
    min_updated_at: int
    limit: int
    def __init__(self, identity: _Optional[_Union[SourceIdentity, _Mapping]] = ..., status_filter: _Optional[_Union[SourceStatus, str]] = ..., model_name_filter: _Optional[str] = ..., worker_rank_filter: _Optional[int] = ..., min_training_step: _Optional[int] = ..., min_updated_at: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class SourceInstanceRef(_message.Message):
    __slots__ = ("mx_source_id", "worker_id", "model_name", "worker_rank", "accelerator", "updated_at", "training_step", "layout_signature", "topology", "source_load")
    class TopologyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_RANK_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    TRAINING_STEP_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LOAD_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    worker_id: str
    model_name: str
    worker_rank: int
    accelerator: str
    updated_at: int
    training_step: int
    layout_signature: str
    topology: _containers.ScalarMap[str, str]
    source_load: float
    def __init__(self, mx_source_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., model_name: _Optional[str] = ..., worker_rank: _Optional[int] = ..., accelerator: _Optional[str] = ..., updated_at: _Optional[int] = ..., training_step: _Optional[int] = ..., layout_signature: _Optional[str] = ..., topology: _Optional[_Mapping[str, str]] = ..., source_load: _Optional[float] = ...) -> None: ...

class ListSourcesResponse(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[SourceInstanceRef]
    def __init__(self, instances: _Optional[_Iterable[_Union[SourceInstanceRef, _Mapping]]] = ...) -> None: ...

class GetMetadataRequest(_message.Message):
    __slots__ = ("mx_source_id", "worker_id")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    worker_id: str
    def __init__(self, mx_source_id: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class GetMetadataResponse(_message.Message):
    __slots__ = ("found", "worker", "mx_source_id", "worker_id", "identity")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    found: bool
    worker: WorkerMetadata
    mx_source_id: str
    worker_id: str
    identity: SourceIdentity
    def __init__(self, found: bool = ..., worker: _Optional[_Union[WorkerMetadata, _Mapping]] = ..., mx_source_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., identity: _Optional[_Union[SourceIdentity, _Mapping]] = ...) -> None: ...

class UpdateStatusRequest(_message.Message):
    __slots__ = ("mx_source_id", "worker_rank", "status", "worker_id", "source_load")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_RANK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LOAD_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    worker_rank: int
    status: SourceStatus
    worker_id: str
    source_load: float
    def __init__(self, mx_source_id: _Optional[str] = ..., worker_rank: _Optional[int] = ..., status: _Optional[_Union[SourceStatus, str]] = ..., worker_id: _Optional[str] = ..., source_load: _Optional[float] = ...) -> None: ...

class UpdateStatusResponse(_message.Message):
    __slots__ = ("success", "message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    def __init__(self, success: bool = ..., message: _Optional[str] = ...) -> None: ...

class GetTensorManifestRequest(_message.Message):
    __slots__ = ("mx_source_id", "worker_id")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    worker_id: str
    def __init__(self, mx_source_id: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class GetTensorManifestResponse(_message.Message):
    __slots__ = ("tensors", "mx_source_id", "metadata_endpoint", "agent_name", "worker_rank", "accelerator", "worker_id")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_RANK_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorDescriptor]
    mx_source_id: str
    metadata_endpoint: str
    agent_name: str
    worker_rank: int
    accelerator: str
    worker_id: str
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorDescriptor, _Mapping]]] = ..., mx_source_id: _Optional[str] = ..., metadata_endpoint: _Optional[str] = ..., agent_name: _Optional[str] = ..., worker_rank: _Optional[int] = ..., accelerator: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class PrepareTensorReadRequest(_message.Message):
    __slots__ = ("mx_source_id", "worker_id")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    worker_id: str
    def __init__(self, mx_source_id: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class PrepareTensorReadResponse(_message.Message):
    __slots__ = ("lease_id", "manifest")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    manifest: GetTensorManifestResponse
    def __init__(self, lease_id: _Optional[str] = ..., manifest: _Optional[_Union[GetTensorManifestResponse, _Mapping]] = ...) -> None: ...

class ReleaseTensorReadRequest(_message.Message):
    __slots__ = ("mx_source_id", "worker_id", "lease_id")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    worker_id: str
    lease_id: str
    def __init__(self, mx_source_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., lease_id: _Optional[str] = ...) -> None: ...

class ReleaseTensorReadResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ArtifactManifestFile(_message.Message):
    __slots__ = ("file_index", "path", "size", "checksum")
    FILE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    file_index: int
    path: str
    size: int
    checksum: str
    def __init__(self, file_index: _Optional[int] = ..., path: _Optional[str] = ..., size: _Optional[int] = ..., checksum: _Optional[str] = ...) -> None: ...

class ArtifactManifestChunk(_message.Message):
    __slots__ = ("chunk_index", "file_index", "file_offset", "length", "checksum")
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    FILE_INDEX_FIELD_NUMBER: _ClassVar[int]
    FILE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    chunk_index: int
    file_index: int
    file_offset: int
    length: int
    checksum: str
    def __init__(self, chunk_index: _Optional[int] = ..., file_index: _Optional[int] = ..., file_offset: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[str] = ...) -> None: ...

class ArtifactManifest(_message.Message):
    __slots__ = ("manifest_version", "mx_source_type", "chunk_size", "files", "chunks")
    MANIFEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    MX_SOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    manifest_version: int
    mx_source_type: MxSourceType
    chunk_size: int
    files: _containers.RepeatedCompositeFieldContainer[ArtifactManifestFile]
    chunks: _containers.RepeatedCompositeFieldContainer[ArtifactManifestChunk]
    def __init__(self, manifest_version: _Optional[int] = ..., mx_source_type: _Optional[_Union[MxSourceType, str]] = ..., chunk_size: _Optional[int] = ..., files: _Optional[_Iterable[_Union[ArtifactManifestFile, _Mapping]]] = ..., chunks: _Optional[_Iterable[_Union[ArtifactManifestChunk, _Mapping]]] = ...) -> None: ...

class ArtifactChunkTransferDescriptor(_message.Message):
    __slots__ = ("addr", "length", "device_id")
    ADDR_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    addr: int
    length: int
    device_id: int
    def __init__(self, addr: _Optional[int] = ..., length: _Optional[int] = ..., device_id: _Optional[int] = ...) -> None: ...

class GetArtifactManifestHeaderRequest(_message.Message):
    __slots__ = ("mx_source_id", "artifact_id")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    artifact_id: str
    def __init__(self, mx_source_id: _Optional[str] = ..., artifact_id: _Optional[str] = ...) -> None: ...

class GetArtifactManifestHeaderResponse(_message.Message):
    __slots__ = ("mx_source_id", "artifact_id", "manifest_version", "mx_source_type", "total_size", "file_count", "chunk_count", "chunk_size", "metadata_endpoint", "agent_name", "worker_rank", "files")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    MX_SOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    FILE_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    METADATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_RANK_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    artifact_id: str
    manifest_version: int
    mx_source_type: MxSourceType
    total_size: int
    file_count: int
    chunk_count: int
    chunk_size: int
    metadata_endpoint: str
    agent_name: str
    worker_rank: int
    files: _containers.RepeatedCompositeFieldContainer[ArtifactManifestFile]
    def __init__(self, mx_source_id: _Optional[str] = ..., artifact_id: _Optional[str] = ..., manifest_version: _Optional[int] = ..., mx_source_type: _Optional[_Union[MxSourceType, str]] = ..., total_size: _Optional[int] = ..., file_count: _Optional[int] = ..., chunk_count: _Optional[int] = ..., chunk_size: _Optional[int] = ..., metadata_endpoint: _Optional[str] = ..., agent_name: _Optional[str] = ..., worker_rank: _Optional[int] = ..., files: _Optional[_Iterable[_Union[ArtifactManifestFile, _Mapping]]] = ...) -> None: ...

class GetArtifactManifestChunksRequest(_message.Message):
    __slots__ = ("mx_source_id", "artifact_id", "start_chunk_index", "max_chunks")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    START_CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    artifact_id: str
    start_chunk_index: int
    max_chunks: int
    def __init__(self, mx_source_id: _Optional[str] = ..., artifact_id: _Optional[str] = ..., start_chunk_index: _Optional[int] = ..., max_chunks: _Optional[int] = ...) -> None: ...

class GetArtifactManifestChunksResponse(_message.Message):
    __slots__ = ("mx_source_id", "artifact_id", "start_chunk_index", "chunks", "next_page_token")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    START_CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    artifact_id: str
    start_chunk_index: int
    chunks: _containers.RepeatedCompositeFieldContainer[ArtifactManifestChunk]
    next_page_token: str
    def __init__(self, mx_source_id: _Optional[str] = ..., artifact_id: _Optional[str] = ..., start_chunk_index: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[ArtifactManifestChunk, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PrepareArtifactChunkRequest(_message.Message):
    __slots__ = ("mx_source_id", "artifact_id", "chunk_index")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    artifact_id: str
    chunk_index: int
    def __init__(self, mx_source_id: _Optional[str] = ..., artifact_id: _Optional[str] = ..., chunk_index: _Optional[int] = ...) -> None: ...

class PrepareArtifactChunkResponse(_message.Message):
    __slots__ = ("mx_source_id", "artifact_id", "lease_id", "chunk", "source", "source_metadata")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_METADATA_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    artifact_id: str
    lease_id: str
    chunk: ArtifactManifestChunk
    source: ArtifactChunkTransferDescriptor
    source_metadata: bytes
    def __init__(self, mx_source_id: _Optional[str] = ..., artifact_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., chunk: _Optional[_Union[ArtifactManifestChunk, _Mapping]] = ..., source: _Optional[_Union[ArtifactChunkTransferDescriptor, _Mapping]] = ..., source_metadata: _Optional[bytes] = ...) -> None: ...

class ReleaseArtifactChunkRequest(_message.Message):
    __slots__ = ("mx_source_id", "artifact_id", "lease_id")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    artifact_id: str
    lease_id: str
    def __init__(self, mx_source_id: _Optional[str] = ..., artifact_id: _Optional[str] = ..., lease_id: _Optional[str] = ...) -> None: ...

class ReleaseArtifactChunkResponse(_message.Message):
    __slots__ = ("mx_source_id", "artifact_id", "chunk")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    artifact_id: str
    chunk: ArtifactManifestChunk
    def __init__(self, mx_source_id: _Optional[str] = ..., artifact_id: _Optional[str] = ..., chunk: _Optional[_Union[ArtifactManifestChunk, _Mapping]] = ...) -> None: ...
