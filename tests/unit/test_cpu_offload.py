"""--cpu-offload-gb (layers/cpu_offload.py) on CPU.

The budget rule (whole layers, a prefix of the list, never above the budget) and the swap
(entry points run on device copies, host tensors back afterwards, nested and failing calls
included) are checked on toy modules computing on CPU, where the "device copy" is a second
host tensor, told apart from the host one by its address. Then the real model: on CPU ModelRunner turns the budget off (the weights
already live in host memory), so the tiny models are run with the offload forced on,
CPU-to-CPU, through the in-process Scheduler: greedy outputs equal transformers', and a
weight update from disk lands in the offloaded layer.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from mini_sglang.layers.cpu_offload import (
    CpuOffloader,
    cpu_offload,
    offload_bytes_for_device,
    offload_layers,
    param_bytes,
)
from mini_sglang.model_executor import model_runner as model_runner_mod
from mini_sglang.model_executor.weight_updates import update_weights_from_disk
from mini_sglang.server_args import ServerArgs
from tests.conftest import (
    assert_memory_all_free,
    build_tiny_model,
    hf_greedy,
    make_scheduler,
    run_prompts,
)

CPU = torch.device("cpu")


class Block(nn.Module):
    """Records the address of its weight at each call; `twice` calls forward (nesting)."""

    offload_entry_points = ("forward", "twice")

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n), requires_grad=False)
        self.seen: list[int] = []
        self.sums: list[float] = []

    def forward(self, fail: bool = False) -> None:
        self.seen.append(self.weight.data_ptr())
        self.sums.append(float(self.weight.sum()))
        if fail:
            raise RuntimeError("boom")

    def twice(self) -> None:
        self.forward()
        self.seen.append(self.weight.data_ptr())
        self.forward()


def test_whole_layers_first_ones_first_within_the_budget():
    sizes = [10, 10, 10, 10]  # float32: 40 bytes a layer
    with cpu_offload(100, CPU) as offloader:
        layers = offload_layers(Block(n) for n in sizes)
    assert offloader.num_offloaded == 2 and offloader.offloaded_bytes == 80 <= 100
    assert ["forward" in vars(b) for b in layers] == [True, True, False, False]
    # A layer that does not fit ends offloading, even if a later, smaller one would fit.
    offloader = CpuOffloader(100, CPU)
    layers = [offloader.maybe_offload(Block(n)) for n in (10, 30, 1)]
    assert ["forward" in vars(b) for b in layers] == [True, False, False]
    assert offloader.offloaded_bytes == 40
    # No budget, or no active context: the layers are untouched.
    with cpu_offload(0, CPU) as none:
        assert none is None
        assert not any("forward" in vars(b) for b in offload_layers(Block(4) for _ in range(2)))
    assert not any("forward" in vars(b) for b in offload_layers([Block(4)]))


def test_entry_points_run_on_device_copies_and_restore_host_weights():
    original = Block(8)
    created = original.weight.data_ptr()
    block = CpuOffloader(1 << 20, CPU).maybe_offload(original)
    param = block.weight
    host = param.data_ptr()
    assert host != created  # the host copy is a tensor of its own
    block()
    block.twice()  # nested entry points swap once: one device copy for the whole call
    assert len(block.seen) == 4 and host not in block.seen
    assert len(set(block.seen[1:])) == 1
    assert block.weight is param and param.data_ptr() == host
    with pytest.raises(RuntimeError, match="boom"):
        block(fail=True)
    assert param.data_ptr() == host
    # Writes into the host tensor (what weight loaders do) reach the next call's copy.
    param.data.fill_(2.0)
    block()
    assert block.sums[-1] == 16.0 and block.seen[-1] != host


def test_budget_is_off_on_cpu_and_in_gib_elsewhere():
    assert offload_bytes_for_device(3, torch.device("cpu")) == 0
    assert offload_bytes_for_device(3, torch.device("cuda", 0)) == 3 << 30
    assert offload_bytes_for_device(0, torch.device("cuda", 0)) == 0


def test_server_args_warn_once_on_cpu_and_keep_the_flag_on_gpu(caplog, monkeypatch):
    with caplog.at_level(logging.WARNING):
        args = ServerArgs(model_path="/nonexistent", device="cpu", cpu_offload_gb=3)
    lines = [r.getMessage() for r in caplog.records if "cpu-offload-gb" in r.getMessage()]
    assert lines == ["--cpu-offload-gb has no effect on CPU: weights already live in CPU memory."]
    assert args.cpu_offload_gb == 0
    from mini_sglang.config_slices import ModelRunnerConfig

    gpu = ServerArgs(
        model_path="/nonexistent", device="cuda", cpu_offload_gb=2, mem_fraction_static=0.8
    )
    assert ModelRunnerConfig.from_server_args(gpu).cpu_offload_gb == 2


@pytest.fixture(scope="module")
def two_models(tmp_path_factory, qwen_tokenizer):
    """Two tiny Llamas (different seeds) on disk with transformers' greedy outputs."""
    prompts = [qwen_tokenizer.encode(p) for p in ("Hello world, this is", "The sky")]
    out = []
    for seed in (0, 1):
        path = tmp_path_factory.mktemp(f"offload_llama{seed}")
        hf = build_tiny_model("llama", path, qwen_tokenizer, seed=seed)
        greedy = [hf_greedy(hf, p, 12, ignore_eos=True) for p in prompts]
        layer_bytes = param_bytes(hf.model.layers[0].parameters())
        out.append((str(path), greedy, layer_bytes))
    assert out[0][1] != out[1][1]
    return prompts, out


def test_offloaded_first_layer_serves_and_takes_weight_updates(two_models, monkeypatch):
    prompts, ((path_a, greedy_a, layer_bytes), (path_b, greedy_b, _)) = two_models
    budget = layer_bytes * 3 // 2  # room for layer 0 only
    # Force the budget CPU-to-CPU (ModelRunner's rule makes it 0 on CPU).
    monkeypatch.setattr(model_runner_mod, "offload_bytes_for_device", lambda gb, dev: budget)
    sched = make_scheduler(path_a)
    runner = sched.tp_worker.model_runner
    layers = runner.model.model.layers
    assert ["forward" in vars(layer) for layer in layers] == [True, False]
    assert [r.output_ids for r in run_prompts(sched, prompts, 12)] == greedy_a
    # An update from disk is written into the offloaded layer's host tensors.
    ok, message = update_weights_from_disk(runner, path_b, None)
    assert ok, message
    assert sched.flush_cache()
    assert [r.output_ids for r in run_prompts(sched, prompts, 12, rid_prefix="b")] == greedy_b
    ok, message = update_weights_from_disk(runner, path_a, None)
    assert ok, message
    assert sched.flush_cache()
    assert [r.output_ids for r in run_prompts(sched, prompts, 12, rid_prefix="a")] == greedy_a
    assert_memory_all_free(sched)
