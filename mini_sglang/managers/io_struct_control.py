"""Control messages (abort, flush, internal state, weights, ...), SGLang 0.5.4's names.

Re-exported by ``io_struct``; import them from there. Each request/reply is a small
picklable dataclass; ``rid`` (keyword-only, like SGLang's ``BaseReq``) lets a reply be routed
back to the HTTP worker that asked. Replies to the HTTP layer (``*ReqOutput``) go from the
scheduler straight to the TokenizerManager.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

__all__ = [
    "AbortReq",
    "BaseReq",
    "CloseSessionReqInput",
    "ConfigureLoggingReq",
    "ContinueGenerationReqInput",
    "DestroyWeightsUpdateGroupReqInput",
    "DestroyWeightsUpdateGroupReqOutput",
    "FlushCacheReqInput",
    "FlushCacheReqOutput",
    "FreezeGCReq",
    "GetInternalStateReq",
    "GetInternalStateReqOutput",
    "GetLoadReqInput",
    "GetLoadReqOutput",
    "GetWeightsByNameReqInput",
    "GetWeightsByNameReqOutput",
    "HealthCheckOutput",
    "InitWeightsUpdateGroupReqInput",
    "InitWeightsUpdateGroupReqOutput",
    "OpenSessionReqInput",
    "OpenSessionReqOutput",
    "PauseGenerationReqInput",
    "ProfileReq",
    "ProfileReqInput",
    "ProfileReqOutput",
    "ProfileReqType",
    "ReleaseMemoryOccupationReqInput",
    "ReleaseMemoryOccupationReqOutput",
    "ResumeMemoryOccupationReqInput",
    "ResumeMemoryOccupationReqOutput",
    "SetInternalStateReq",
    "SetInternalStateReqOutput",
    "SlowDownReqInput",
    "SlowDownReqOutput",
    "UpdateWeightFromDiskReqInput",
    "UpdateWeightFromDiskReqOutput",
    "UpdateWeightVersionReqInput",
    "UpdateWeightsFromDistributedReqInput",
    "UpdateWeightsFromDistributedReqOutput",
]


@dataclass
class BaseReq:
    """Common base: an optional request id and the HTTP worker to answer (keyword-only)."""

    rid: Optional[str] = field(default=None, kw_only=True)
    http_worker_ipc: Optional[str] = field(default=None, kw_only=True)


@dataclass
class AbortReq(BaseReq):
    """Abort requests whose rid *starts with* ``rid`` (SGLang matches a prefix), or all.

    ``finished_reason`` (a FINISH_ABORT json dict) overrides the default abort message.
    """

    abort_all: bool = False
    finished_reason: Optional[dict[str, Any]] = None
    abort_reason: Optional[str] = None

    def __post_init__(self) -> None:
        if self.rid is None:  # SGLang: "" is a prefix of every rid
            self.rid = ""


@dataclass
class FlushCacheReqInput(BaseReq):
    """Drop the whole prefix cache; only allowed while no request is running or waiting."""


@dataclass
class FlushCacheReqOutput(BaseReq):
    success: bool


@dataclass
class GetInternalStateReq(BaseReq):
    """Ask the scheduler for its state dict (/get_server_info's ``internal_states``)."""


@dataclass
class GetInternalStateReqOutput(BaseReq):
    internal_state: dict[str, Any]


@dataclass
class SetInternalStateReq(BaseReq):
    server_args: dict[str, Any]


@dataclass
class SetInternalStateReqOutput(BaseReq):
    updated: bool
    server_args: dict[str, Any]


@dataclass
class HealthCheckOutput(BaseReq):
    """Scheduler -> TokenizerManager: alive, but too busy to run the health probe."""


@dataclass
class GetLoadReqInput(BaseReq):
    pass


@dataclass
class GetLoadReqOutput(BaseReq):
    dp_rank: int
    num_reqs: int
    num_waiting_reqs: int
    num_tokens: int


@dataclass
class UpdateWeightFromDiskReqInput(BaseReq):
    model_path: str
    load_format: Optional[str] = None
    abort_all_requests: bool = False
    weight_version: Optional[str] = None
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False


@dataclass
class UpdateWeightFromDiskReqOutput(BaseReq):
    success: bool
    message: str
    num_paused_requests: Optional[int] = 0


@dataclass
class UpdateWeightsFromDistributedReqInput(BaseReq):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Optional[str] = None


@dataclass
class UpdateWeightsFromDistributedReqOutput(BaseReq):
    success: bool
    message: str


@dataclass
class InitWeightsUpdateGroupReqInput(BaseReq):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


@dataclass
class InitWeightsUpdateGroupReqOutput(BaseReq):
    success: bool
    message: str


@dataclass
class DestroyWeightsUpdateGroupReqInput(BaseReq):
    group_name: str = "weight_update_group"


@dataclass
class DestroyWeightsUpdateGroupReqOutput(BaseReq):
    success: bool
    message: str


@dataclass
class UpdateWeightVersionReqInput(BaseReq):
    new_version: str
    abort_all_requests: bool = True


@dataclass
class GetWeightsByNameReqInput(BaseReq):
    name: str
    truncate_size: int = 100


@dataclass
class GetWeightsByNameReqOutput(BaseReq):
    parameter: list


@dataclass
class ReleaseMemoryOccupationReqInput(BaseReq):
    tags: Optional[list[str]] = None


@dataclass
class ReleaseMemoryOccupationReqOutput(BaseReq):
    pass


@dataclass
class ResumeMemoryOccupationReqInput(BaseReq):
    tags: Optional[list[str]] = None


@dataclass
class ResumeMemoryOccupationReqOutput(BaseReq):
    pass


@dataclass
class SlowDownReqInput(BaseReq):
    forward_sleep_time: Optional[float] = None


@dataclass
class SlowDownReqOutput(BaseReq):
    pass


@dataclass
class ProfileReqInput(BaseReq):
    """/start_profile body (every field optional).

    ``num_steps`` stops the trace by itself after that many forward steps (counted from
    ``start_step`` when given, which delays the start to that forward step);
    ``profile_by_stage`` writes one trace for prefill and one for decode, ``num_steps`` of
    each. ``activities`` (default ["CPU", "GPU"]): "CPU", "GPU", "MEM", "CUDA_PROFILER".
    ``profile_id`` is a mini-sglang extension: the trace-name prefix (SGLang always uses
    the start time, which is also the default here).
    """

    output_dir: Optional[str] = None
    start_step: Optional[int] = None
    num_steps: Optional[int] = None
    activities: Optional[list[str]] = None
    profile_by_stage: bool = False
    with_stack: Optional[bool] = None
    record_shapes: Optional[bool] = None
    merge_profiles: bool = False
    profile_id: Optional[str] = None


class ProfileReqType(Enum):
    START_PROFILE = 1
    STOP_PROFILE = 2


@dataclass
class ProfileReq(BaseReq):
    """TokenizerManager -> every scheduler rank (the DP controller fans it out)."""

    type: ProfileReqType
    output_dir: Optional[str] = None
    start_step: Optional[int] = None
    num_steps: Optional[int] = None
    activities: Optional[list[str]] = None
    profile_by_stage: bool = False
    with_stack: Optional[bool] = None
    record_shapes: Optional[bool] = None
    profile_id: Optional[str] = None
    merge_profiles: bool = False


@dataclass
class ProfileReqOutput(BaseReq):
    success: bool
    message: str


@dataclass
class PauseGenerationReqInput(BaseReq):
    """/pause_generation. 0.5.4 takes no body: it aborts every in-flight request and holds
    new generate requests in the TokenizerManager until /continue_generation."""


@dataclass
class ContinueGenerationReqInput(BaseReq):
    """/continue_generation: release the generate requests held while paused."""


@dataclass
class FreezeGCReq(BaseReq):
    """/freeze_gc: gc.freeze() in the scheduler, then in the detokenizer (the scheduler
    forwards it); no reply."""


@dataclass
class ConfigureLoggingReq(BaseReq):
    log_requests: Optional[bool] = None
    log_requests_level: Optional[int] = None
    dump_requests_folder: Optional[str] = None
    dump_requests_threshold: Optional[int] = None
    crash_dump_folder: Optional[str] = None


@dataclass
class OpenSessionReqInput(BaseReq):
    capacity_of_str_len: int
    session_id: Optional[str] = None


@dataclass
class CloseSessionReqInput(BaseReq):
    session_id: str


@dataclass
class OpenSessionReqOutput(BaseReq):
    session_id: Optional[str]
    success: bool
