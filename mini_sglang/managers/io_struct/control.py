"""Control requests and their replies (SGLang 0.5.4's names): abort, flush, internal state,
load, profiling, pause/continue, GC, logging, sessions.

Requests go TokenizerManager -> scheduler (the DP controller fans them out to every replica;
``WatchLoadUpdateReq`` is the controller's own); replies (``*ReqOutput``) go from the
scheduler straight back to the TokenizerManager. Each is a small picklable dataclass;
``rid`` (keyword-only, like SGLang's ``BaseReq``) lets a reply be routed back to the HTTP
worker that asked. Weight-update messages are in ``io_struct.weights``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional


@dataclass
class BaseReq:
    """Common base: an optional request id and the HTTP worker to answer (keyword-only)."""

    rid: Optional[str] = field(default=None, kw_only=True)
    http_worker_ipc: Optional[str] = field(default=None, kw_only=True)


@dataclass
class AbortReq(BaseReq):
    """Abort the request whose rid is exactly ``rid``, or all (``abort_all``); an empty
    rid aborts nothing. (SGLang's scheduler matches a prefix; here the TokenizerManager
    names each sub-request of a batch itself, so one client's rid never reaches another's.)

    ``finished_reason`` (a FINISH_ABORT json dict) overrides the default abort message.
    """

    abort_all: bool = False
    finished_reason: Optional[dict[str, Any]] = None
    abort_reason: Optional[str] = None

    def __post_init__(self) -> None:
        if self.rid is None:
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
    dp_rank: int = 0  # the replica that answered (orders the replies under --dp-size)


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
class WatchLoadUpdateReq(BaseReq):
    """Per-replica loads, for the controller's shortest_queue budget."""

    loads: list[GetLoadReqOutput] = field(default_factory=list)


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


class ExpertDistributionReqType(Enum):
    START_RECORD = 1
    STOP_RECORD = 2
    DUMP_RECORD = 3


@dataclass
class ExpertDistributionReq(BaseReq):
    """/start|stop|dump_expert_distribution_record -> every scheduler rank (see
    layers/moe/expert_distribution.py)."""

    action: ExpertDistributionReqType


@dataclass
class ExpertDistributionReqOutput(BaseReq):
    """success False: no recorder (the flag is off, or the model has no MoE layers)."""

    success: bool
    message: str


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
