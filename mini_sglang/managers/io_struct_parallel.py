"""Messages of the parallel runtime that io_struct_control does not define: in-process tensor
weight updates and the DP controller's load reports (SGLang 0.5.4's names and fields)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from mini_sglang.managers.io_struct_control import BaseReq, GetLoadReqOutput


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


@dataclass
class WatchLoadUpdateReq(BaseReq):
    """Per-replica loads, for the controller's shortest_queue budget."""

    loads: list[GetLoadReqOutput] = field(default_factory=list)
