"""CudaGraphRunner: decode forwards replayed from CUDA graphs, one per captured batch size.

A decode batch of size bs runs the graph of the smallest captured size >= bs; the padded
rows read request slot 0 with seq_len 1 and write their K/V into slot 0, the padding sink,
so they disturb nothing. Sampling stays outside the graph (it varies per batch).
"""

from __future__ import annotations

import bisect
import gc
import logging
import time
import weakref
from typing import TYPE_CHECKING

import torch

from mini_sglang.layers.logits_processor import LogitsProcessorOutput
from mini_sglang.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from mini_sglang.server_args_defaults import generate_cuda_graph_batch_sizes

if TYPE_CHECKING:
    from mini_sglang.model_executor.model_runner import ModelRunner

logger = logging.getLogger("mini_sglang")

# every runner not yet garbage, for release_cuda_graphs (a model runner and its graph runner
# refer to each other, so they outlive their last user until the cycle collector runs)
_live_runners: weakref.WeakSet[CudaGraphRunner] = weakref.WeakSet()


def release_cuda_graphs() -> None:
    """Destroy the CUDA graphs of every CudaGraphRunner in this process; call before leaving
    a NCCL process group. NCCL keeps the plans of collectives captured into a graph until the
    graph is destroyed, and destroying the communicator waits for them: with the graphs alive
    `torch.distributed.destroy_process_group()` never returns (pytorch/pytorch#115388; two
    H100s, bench_one_batch --tp-size 2, both ranks stuck there 60 s after their report)."""
    for graph_runner in list(_live_runners):
        graph_runner.release()


class CudaGraphRunner:
    def __init__(self, runner: ModelRunner) -> None:
        sa = runner.config
        self.runner = runner
        self.device = runner.device
        backend = runner.attn_backend
        if not backend.supports_cuda_graph:
            raise ValueError(f"{type(backend).__name__} does not support CUDA graphs")
        max_bs = sa.cuda_graph_max_bs or 160
        sizes = sa.cuda_graph_bs or generate_cuda_graph_batch_sizes(
            max_bs, sa.disable_cuda_graph_padding
        )
        sizes = sorted(b for b in set(sizes) if b <= runner.req_to_token_pool.size)
        self.capture_bs = sizes
        self.max_bs = sizes[-1]
        self.exact_only = sa.disable_cuda_graph_padding
        n = self.max_bs
        dev = self.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(n, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=dev)
        backend.init_cuda_graph_state(n, n)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        _live_runners.add(self)
        self.capture()

    def release(self) -> None:
        """Destroy the captured graphs and their memory pool; can_run is False afterwards."""
        self.graphs.clear()
        self.outputs.clear()
        self.capture_bs, self.max_bs, self.pool = [], 0, None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _static_batch(self, bs: int, seq_lens_cpu: torch.Tensor) -> ForwardBatch:
        r = self.runner
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=seq_lens_cpu,
            out_cache_loc=self.out_cache_loc[:bs],
            req_to_token_pool=r.req_to_token_pool,
            token_to_kv_pool=r.token_to_kv_pool,
            attn_backend=r.attn_backend,
        )

    def capture(self) -> None:
        from tqdm import tqdm

        t0 = time.perf_counter()
        free_before = torch.cuda.mem_get_info(self.device)[0]
        stream = torch.cuda.Stream(self.device)
        sizes = list(reversed(self.capture_bs))  # largest first: later graphs reuse its pool
        for bs in tqdm(sizes, desc="Capturing batches", leave=False):
            fb = self._static_batch(bs, torch.ones(bs, dtype=torch.int64))
            self.runner.attn_backend.init_forward_metadata_capture_cuda_graph(bs, fb)
            model = self.runner.model
            # The static buffers and the metadata above are written on the current stream;
            # the capture stream must not read them before those writes land (SGLang's
            # graph_capture waits the same way).
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up runs outside the graph (lazy inits, autotune)
                    model(fb.input_ids, fb.positions, fb)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                out = model(fb.input_ids, fb.positions, fb)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[bs] = graph
            self.outputs[bs] = out.next_token_logits
        torch.cuda.synchronize(self.device)
        # Compiling the warm-up's Triton kernels leaves cyclic garbage (tens of thousands of
        # objects a dozen kernels) that only a full collection frees: collected here, at
        # start-up, as SGLang's capture ends (its freeze_gc), not by a gen-2 collection in
        # the middle of serving. On an H200 a process that compiled its kernels stalled
        # 0.28 s once in 1,024 decode steps; one that loaded them from Triton's cache did
        # not (docs/performance/host-overhead.md).
        gc.collect()
        used = (free_before - torch.cuda.mem_get_info(self.device)[0]) / (1 << 30)
        self.runner.graph_mem_gib = used
        logger.info(
            "Capture cuda graph end. Time elapsed: %.2f s. mem usage=%.2f GB. bs=%s",
            time.perf_counter() - t0,
            used,
            self.capture_bs,
        )

    def can_run(self, fb: ForwardBatch) -> bool:
        if not fb.forward_mode.is_decode():
            return False
        if self.exact_only:
            return fb.batch_size in self.graphs
        return fb.batch_size <= self.max_bs

    def replay(self, fb: ForwardBatch) -> LogitsProcessorOutput:
        bs = fb.batch_size
        padded = self.capture_bs[bisect.bisect_left(self.capture_bs, bs)]
        if padded != bs:
            # Padding rows: request slot 0, length 1, KV written to the padding sink.
            self.req_pool_indices[bs:padded].zero_()
            self.seq_lens[bs:padded].fill_(1)
            self.out_cache_loc[bs:padded].zero_()
            self.positions[bs:padded].zero_()
        self.input_ids[:bs].copy_(fb.input_ids)
        self.positions[:bs].copy_(fb.positions)
        self.req_pool_indices[:bs].copy_(fb.req_pool_indices)
        self.seq_lens[:bs].copy_(fb.seq_lens)
        self.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        seq_cpu = fb.seq_lens_cpu
        if padded != bs:
            seq_cpu = torch.cat([seq_cpu, torch.ones(padded - bs, dtype=seq_cpu.dtype)])
        static = self._static_batch(padded, seq_cpu)
        self.runner.attn_backend.init_forward_metadata_replay_cuda_graph(padded, static)
        self.graphs[padded].replay()
        return LogitsProcessorOutput(self.outputs[padded][:bs])
