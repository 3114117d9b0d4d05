"""Model-runner side of online weight updates (SGLang 0.5.4's ModelRunner methods).

- from disk: stream another checkpoint of the same architecture into the live parameters
  (every rank reads the full files and its weight_loaders keep its shard); on failure the
  previous checkpoint is streamed back in.
- from a trainer (update_weights_from_distributed): the trainer is rank 0 of a separate
  process group (`init_custom_process_group`, SGLang's helper, so trainers written for
  SGLang join unchanged) whose other ranks are the scheduler ranks; it broadcasts each full
  tensor, every rank receives it and loads its shard.
- from tensors passed in-process (Engine.update_weights_from_tensor).
- get_weights_by_name: the full (unsharded) checkpoint tensor, gathered across TP ranks.

Every function here is called on *every* TP rank with the same arguments (rank 0 broadcasts
the request), so the collectives inside line up.
"""

from __future__ import annotations

import datetime
import inspect
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from mini_sglang.distributed.parallel_state import (
    get_tp_rank,
    get_tp_size,
    tensor_model_parallel_all_gather,
)
from mini_sglang.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from mini_sglang.layers.vocab_parallel_embedding import VocabParallelEmbedding
from mini_sglang.model_loader.loader import weight_iterator

if TYPE_CHECKING:
    from mini_sglang.model_executor.model_runner import ModelRunner

logger = logging.getLogger("mini_sglang")


def init_custom_process_group(
    backend: str,
    init_method: str,
    world_size: int,
    rank: int,
    group_name: str,
    timeout_s: float | None = None,
) -> dist.ProcessGroup:
    """A process group independent of the default (TP) world, SGLang's helper.

    Keys live under PrefixStore(group_name), exactly as SGLang and RL trainers (verl, ...)
    that copy SGLang's helper create them, so both sides rendezvous on one TCP store.
    Works whether or not the default group is initialised (it is not at tp=1).
    """
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        default_pg_timeout,
        rendezvous,
    )

    timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else default_pg_timeout
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    # The keyword was pg_options before torch 2.6 (asked of the signature: comparing
    # version strings, as SGLang does, gets "2.13" < "2.6" wrong).
    params = inspect.signature(_new_process_group_helper).parameters
    opt_name = "backend_options" if "backend_options" in params else "pg_options"
    pg, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        store,
        group_name=group_name,
        timeout=timeout,
        **{opt_name: None},
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def load_named_tensors(runner: ModelRunner, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load a subset of the checkpoint (HF names, full tensors) into the live model."""
    runner.model.load_weights(((name, t.to(runner.device)) for name, t in weights), strict=False)


def update_weights_from_disk(
    runner: ModelRunner, model_path: str, load_format: str | None
) -> tuple[bool, str]:
    """Replace every weight with the checkpoint at model_path; rolls back on failure."""
    source = runner.weight_source
    load_format = load_format or source.load_format
    old_path, old_format = source.model_path, source.load_format
    logger.info("Update engine weights online from disk begin: %s", model_path)
    try:
        weights = weight_iterator(model_path, load_format)
    except Exception as e:
        return False, f"Failed to get weights iterator: {e}."
    try:
        with torch.no_grad():
            runner.model.load_weights(weights)
    except Exception as e:
        message = f"Failed to update weights: {e}.\nRolling back to original weights."
        if old_format != "dummy":  # a dummy model cannot be re-read; it stays half-updated
            with torch.no_grad():
                runner.model.load_weights(weight_iterator(old_path, old_format))
        return False, message
    source.model_path, source.load_format = model_path, load_format
    logger.info("Update weights end.")
    return True, "Succeeded to update model weights."


def init_weights_update_group(
    runner: ModelRunner,
    master_address: str,
    master_port: int,
    rank_offset: int,
    world_size: int,
    group_name: str,
    backend: str,
    dp_rank: int = 0,
) -> tuple[bool, str]:
    """Join the trainer's group as rank rank_offset + dp_rank * tp_size + tp_rank.

    (SGLang uses rank_offset + tp_rank; the dp term lets every DP replica join one group,
    world_size = 1 + dp_size * tp_size.) Blocks until all ranks have joined.
    """
    if not group_name:
        return False, "Group name cannot be empty"
    groups = runner.__dict__.setdefault("_model_update_group", {})
    rank = rank_offset + dp_rank * get_tp_size() + get_tp_rank()
    logger.info(
        "init custom process group: master_address=%s, master_port=%s, rank_offset=%s, "
        "rank=%s, world_size=%s, group_name=%s, backend=%s",
        master_address, master_port, rank_offset, rank, world_size, group_name, backend,
    )  # fmt: skip
    try:
        groups[group_name] = init_custom_process_group(
            backend, f"tcp://{master_address}:{master_port}", world_size, rank, group_name
        )
    except Exception as e:
        message = f"Failed to initialize custom process group: {e}."
        logger.error(message)
        return False, message
    return True, "Succeeded to initialize custom process group."


def destroy_weights_update_group(runner: ModelRunner, group_name: str) -> tuple[bool, str]:
    groups = runner.__dict__.setdefault("_model_update_group", {})
    if group_name not in groups:
        return False, "The group to be destroyed does not exist."
    try:
        dist.destroy_process_group(groups.pop(group_name))
    except Exception as e:
        return False, f"Failed to destroy custom process group: {e}."
    return True, "Succeeded to destroy custom process group."


def update_weights_from_distributed(
    runner: ModelRunner,
    names: list[str],
    dtypes: list[str],
    shapes: list[list[int]],
    group_name: str,
) -> tuple[bool, str]:
    """Receive each full tensor from the trainer's rank 0, then load them."""
    groups = runner.__dict__.get("_model_update_group", {})
    if group_name not in groups:
        return False, (
            f"Group {group_name} not in {list(groups)}. "
            "Please call `init_weights_update_group` first."
        )
    group = groups[group_name]
    try:
        weights = []
        handles = []
        for name, dtype, shape in zip(names, dtypes, shapes):
            target = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
            weight = torch.empty(shape, dtype=target, device=runner.device)
            handles.append(dist.broadcast(weight, src=0, group=group, async_op=True))
            weights.append((name, weight))
        for handle in handles:
            handle.wait()
        load_named_tensors(runner, weights)
    except Exception as e:
        message = (
            f"Failed to update parameter online: {e}. The full weights of the ModelRunner "
            "are partially updated. Please discard the whole weights."
        )
        logger.error(message)
        return False, message
    return True, "Succeeded to update parameter online."


def update_weights_from_tensor(
    runner: ModelRunner, named_tensors: list[tuple[str, torch.Tensor]]
) -> tuple[bool, str]:
    try:
        load_named_tensors(runner, named_tensors)
    except Exception as e:
        return False, f"Failed to update weights from tensor: {e}."
    return True, "Success"


def _resolve(model: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str, object]:
    """(owning module, parameter attribute, shard id) of a checkpoint name."""
    if name == "lm_head.weight" and getattr(model, "tie_word_embeddings", False):
        name = "model.embed_tokens.weight"
    shard_id = None
    for fused, part, sid in getattr(model, "stacked_params_mapping", []):
        if f".{part}." in name:
            name, shard_id = name.replace(f".{part}.", f".{fused}."), sid
            break
    module_name, _, attr = name.rpartition(".")
    return model.get_submodule(module_name), attr, shard_id


def get_weights_by_name(runner: ModelRunner, name: str, truncate_size: int = 100) -> list | None:
    """The full checkpoint tensor `name` as nested lists, first `truncate_size` rows
    (SGLang's `.tolist()[:truncate_size]`), float32; a quantized linear weight is returned
    dequantized. None if there is no such weight."""
    try:
        module, attr, shard_id = _resolve(runner.model, name)
        weight = getattr(module, attr).data
        if attr == "weight" and hasattr(module, "quant_method"):  # a quantized weight's values
            weight = module.quant_method.dequantized_weight(module)
        if isinstance(module, QKVParallelLinear) and shard_id is not None:
            q, kv = module.num_heads * module.head_size, module.num_kv_heads * module.head_size
            offset, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard_id]
            weight = weight.narrow(0, offset, size)
        elif shard_id is not None:  # merged column (gate/up)
            size = module.output_sizes[shard_id] // module.tp_size
            weight = weight.narrow(0, sum(module.output_sizes[:shard_id]) // module.tp_size, size)
        if get_tp_size() > 1:
            weight = _gather_full(module, attr, shard_id, weight)
        return weight.cpu().to(torch.float32).numpy().tolist()[:truncate_size]
    except Exception as e:
        logger.error("Error when getting parameter %s: %s", name, e)
        return None


def _gather_full(module: torch.nn.Module, attr: str, shard_id: object, local: torch.Tensor):
    """Reassemble a TP-sharded tensor (every rank calls this with its shard)."""
    if isinstance(module, VocabParallelEmbedding):
        return tensor_model_parallel_all_gather(local, dim=0)[: module.num_embeddings]
    if isinstance(module, RowParallelLinear):
        return tensor_model_parallel_all_gather(local, dim=1) if attr == "weight" else local
    if isinstance(module, ColumnParallelLinear):
        full = tensor_model_parallel_all_gather(local, dim=0)
        if isinstance(module, QKVParallelLinear) and shard_id in ("k", "v"):
            # KV heads replicated over r ranks: keep one copy of each.
            r, n = module.num_kv_replicas, local.shape[0]
            full = torch.cat([full[i * n : (i + 1) * n] for i in range(0, get_tp_size(), r)])
        return full
    return local
