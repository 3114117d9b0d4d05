"""Engine methods for online weight updates (SGLang 0.5.4's Engine API names).

Each call goes through the Engine's TokenizerManager to every scheduler rank (and, with
--dp-size, every replica), exactly as the HTTP routes do; see managers/tokenizer_communicator.py.
"""

from __future__ import annotations

from typing import Any

import torch

from mini_sglang.managers.io_struct.weights import (
    DestroyWeightsUpdateGroupReqInput,
    GetWeightsByNameReqInput,
    InitWeightsUpdateGroupReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightsFromTensorReqInput,
)


class EngineWeightsMixin:
    """Mixed into Engine: needs `self.loop` and `self.tokenizer_manager`."""

    def _run(self, coro) -> Any:
        return self.loop.run_until_complete(coro)

    def update_weights_from_disk(
        self, model_path: str, load_format: str | None = None, **kw: Any
    ) -> tuple[bool, str]:
        """Swap in another checkpoint of the same architecture; (success, message)."""
        obj = UpdateWeightFromDiskReqInput(model_path=model_path, load_format=load_format, **kw)
        out = self._run(self.tokenizer_manager.communicator.update_weights_from_disk(obj))
        return out.success, out.message

    def update_weights_from_tensor(
        self,
        named_tensors: list[tuple[str, torch.Tensor]],
        load_format: str | None = None,
        flush_cache: bool = True,
        weight_version: str | None = None,
    ) -> tuple[bool, str]:
        """Load full (unsharded) tensors under their checkpoint names, e.g.
        [("model.layers.0.mlp.down_proj.weight", t)]; every TP rank keeps its shard."""
        tensors = [(name, t.detach().cpu()) for name, t in named_tensors]
        obj = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=tensors,
            load_format=load_format,
            flush_cache=flush_cache,
            weight_version=weight_version,
        )
        out = self._run(self.tokenizer_manager.communicator.update_weights_from_tensor(obj))
        return out.success, out.message

    def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> tuple[bool, str]:
        obj = InitWeightsUpdateGroupReqInput(
            master_address=master_address,
            master_port=master_port,
            rank_offset=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
        )
        out = self._run(self.tokenizer_manager.communicator.init_weights_update_group(obj))
        return out.success, out.message

    def destroy_weights_update_group(self, group_name: str = "weight_update_group"):
        obj = DestroyWeightsUpdateGroupReqInput(group_name=group_name)
        out = self._run(self.tokenizer_manager.communicator.destroy_weights_update_group(obj))
        return out.success, out.message

    def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = "weight_update_group",
        flush_cache: bool = True,
        weight_version: str | None = None,
    ) -> tuple[bool, str]:
        obj = UpdateWeightsFromDistributedReqInput(
            names=names,
            dtypes=dtypes,
            shapes=shapes,
            group_name=group_name,
            flush_cache=flush_cache,
            weight_version=weight_version,
        )
        out = self._run(self.tokenizer_manager.communicator.update_weights_from_distributed(obj))
        return out.success, out.message

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list | None:
        obj = GetWeightsByNameReqInput(name=name, truncate_size=truncate_size)
        return self._run(self.tokenizer_manager.communicator.get_weights_by_name(obj))
