from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SourceType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHTS: _ClassVar[SourceType]
    LORA: _ClassVar[SourceType]

class BackendFramework(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKEND_FRAMEWORK_UNKNOWN: _ClassVar[BackendFramework]
    VLLM: _ClassVar[BackendFramework]
    SGLANG: _ClassVar[BackendFramework]
    TRT_LLM: _ClassVar[BackendFramework]

class SourceStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SOURCE_STATUS_UNKNOWN: _ClassVar[SourceStatus]
    SOURCE_STATUS_INITIALIZING: _ClassVar[SourceStatus]
    SOURCE_STATUS_READY: _ClassVar[SourceStatus]
    SOURCE_STATUS_STALE: _ClassVar[SourceStatus]
WEIGHTS: SourceType
LORA: SourceType
BACKEND_FRAMEWORK_UNKNOWN: BackendFramework
VLLM: BackendFramework
SGLANG: BackendFramework
TRT_LLM: BackendFramework
SOURCE_STATUS_UNKNOWN: SourceStatus
SOURCE_STATUS_INITIALIZING: SourceStatus
SOURCE_STATUS_READY: SourceStatus
SOURCE_STATUS_STALE: SourceStatus

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
    mx_source_type: SourceType
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
    def __init__(self, mx_version: _Optional[str] = ..., mx_source_type: _Optional[_Union[SourceType, str]] = ..., model_name: _Optional[str] = ..., backend_framework: _Optional[_Union[BackendFramework, str]] = ..., tensor_parallel_size: _Optional[int] = ..., pipeline_parallel_size: _Optional[int] = ..., expert_parallel_size: _Optional[int] = ..., dtype: _Optional[str] = ..., quantization: _Optional[str] = ..., extra_parameters: _Optional[_Mapping[str, str]] = ..., revision: _Optional[str] = ..., backend_framework_version: _Optional[str] = ..., torch_version: _Optional[str] = ..., cuda_version: _Optional[str] = ..., triton_version: _Optional[str] = ..., gpu_arch: _Optional[str] = ..., compile_config_digest: _Optional[str] = ...) -> None: ...

class TensorDescriptor(_message.Message):
    __slots__ = ("name", "addr", "size", "device_id", "dtype", "checksum", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    addr: int
    size: int
    device_id: int
    dtype: str
    checksum: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., addr: _Optional[int] = ..., size: _Optional[int] = ..., device_id: _Optional[int] = ..., dtype: _Optional[str] = ..., checksum: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class TensorSourceMetadata(_message.Message):
    __slots__ = ("tensors",)
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorDescriptor]
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorDescriptor, _Mapping]]] = ...) -> None: ...

class WorkerMetadata(_message.Message):
    __slots__ = ("worker_rank", "nixl_metadata", "tensors", "status", "updated_at", "metadata_endpoint", "agent_name", "worker_grpc_endpoint", "accelerator", "tensor_source")
    WORKER_RANK_FIELD_NUMBER: _ClassVar[int]
    NIXL_METADATA_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    METADATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_GRPC_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    TENSOR_SOURCE_FIELD_NUMBER: _ClassVar[int]
    worker_rank: int
    nixl_metadata: bytes
    tensors: _containers.RepeatedCompositeFieldContainer[TensorDescriptor]
    status: SourceStatus
    updated_at: int
    metadata_endpoint: str
    agent_name: str
    worker_grpc_endpoint: str
    accelerator: str
    tensor_source: TensorSourceMetadata
    def __init__(self, worker_rank: _Optional[int] = ..., nixl_metadata: _Optional[bytes] = ..., tensors: _Optional[_Iterable[_Union[TensorDescriptor, _Mapping]]] = ..., status: _Optional[_Union[SourceStatus, str]] = ..., updated_at: _Optional[int] = ..., metadata_endpoint: _Optional[str] = ..., agent_name: _Optional[str] = ..., worker_grpc_endpoint: _Optional[str] = ..., accelerator: _Optional[str] = ..., tensor_source: _Optional[_Union[TensorSourceMetadata, _Mapping]] = ...) -> None: ...

class PublishMetadataRequest(_message.Message):
    __slots__ = ("identity", "worker", "worker_id", "pod_name", "pod_uid", "pod_namespace", "owner_secret")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    OWNER_SECRET_FIELD_NUMBER: _ClassVar[int]
    identity: SourceIdentity
    worker: WorkerMetadata
    worker_id: str
    pod_name: str
    pod_uid: str
    pod_namespace: str
    owner_secret: str
    def __init__(self, identity: _Optional[_Union[SourceIdentity, _Mapping]] = ..., worker: _Optional[_Union[WorkerMetadata, _Mapping]] = ..., worker_id: _Optional[str] = ..., pod_name: _Optional[str] = ..., pod_uid: _Optional[str] = ..., pod_namespace: _Optional[str] = ..., owner_secret: _Optional[str] = ...) -> None: ...

class PublishMetadataResponse(_message.Message):
    __slots__ = ("success", "message", "mx_source_id", "worker_id", "owner_secret")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_SECRET_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    mx_source_id: str
    worker_id: str
    owner_secret: str
    def __init__(self, success: bool = ..., message: _Optional[str] = ..., mx_source_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., owner_secret: _Optional[str] = ...) -> None: ...

class SourceInstanceRef(_message.Message):
    __slots__ = ("mx_source_id", "worker_id", "model_name", "worker_rank", "accelerator", "updated_at", "status")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_RANK_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    worker_id: str
    model_name: str
    worker_rank: int
    accelerator: str
    updated_at: int
    status: SourceStatus
    def __init__(self, mx_source_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., model_name: _Optional[str] = ..., worker_rank: _Optional[int] = ..., accelerator: _Optional[str] = ..., updated_at: _Optional[int] = ..., status: _Optional[_Union[SourceStatus, str]] = ...) -> None: ...

class ListSourcesRequest(_message.Message):
    __slots__ = ("identity", "status_filter", "model_name_filter", "worker_rank_filter", "min_updated_at", "limit")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FILTER_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FILTER_FIELD_NUMBER: _ClassVar[int]
    WORKER_RANK_FILTER_FIELD_NUMBER: _ClassVar[int]
    MIN_UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    identity: SourceIdentity
    status_filter: SourceStatus
    model_name_filter: str
    worker_rank_filter: int
    min_updated_at: int
    limit: int
    def __init__(self, identity: _Optional[_Union[SourceIdentity, _Mapping]] = ..., status_filter: _Optional[_Union[SourceStatus, str]] = ..., model_name_filter: _Optional[str] = ..., worker_rank_filter: _Optional[int] = ..., min_updated_at: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("mx_source_id", "worker_rank", "status", "worker_id", "owner_secret")
    MX_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_RANK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_SECRET_FIELD_NUMBER: _ClassVar[int]
    mx_source_id: str
    worker_rank: int
    status: SourceStatus
    worker_id: str
    owner_secret: str
    def __init__(self, mx_source_id: _Optional[str] = ..., worker_rank: _Optional[int] = ..., status: _Optional[_Union[SourceStatus, str]] = ..., worker_id: _Optional[str] = ..., owner_secret: _Optional[str] = ...) -> None: ...

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
