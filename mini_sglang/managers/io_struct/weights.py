"""Weight-update and memory-occupation requests and their replies (SGLang 0.5.4's names):
from disk, from a distributed group, from in-process tensors, by name, version, and the
release/resume of GPU memory used by RL trainers.

Requests go TokenizerManager -> scheduler (every DP replica); replies go from the scheduler
straight back to the TokenizerManager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from mini_sglang.managers.io_struct.control import BaseReq


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
class UpdateWeightsFromTensorReqInput(BaseReq):
    """Named full (unsharded) tensors, pickled as they are: on CPU pickle over ZMQ is the
    whole transport. SGLang sends one serialized list per TP rank; here every rank gets the
    same list (rank 0 broadcasts it) and its weight_loaders keep its shard."""

    serialized_named_tensors: list[tuple[str, Any]]
    load_format: Optional[str] = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Optional[str] = None


@dataclass
class UpdateWeightsFromTensorReqOutput(BaseReq):
    success: bool
    message: str
