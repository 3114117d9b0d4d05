"""ModelRunner: owns the model, the KV pools, the attention backend and the sampler.

Memory sizing (SGLang's rule on GPU): after the weights load, the KV pool gets
  free_gpu_memory - total_gpu_memory * (1 - mem_fraction_static)
bytes, i.e. weights + KV together stay within mem_fraction_static of the card. On CPU the
pool gets MINI_SGLANG_CPU_KV_CACHE_GB (default 2) GiB. --max-total-tokens caps either.
Weights offloaded to host memory (--cpu-offload-gb) are not on the card, so that free
memory, measured after the allocator's cache is emptied, goes to the KV pool (as SGLang).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mini_sglang.config_slices import ModelRunnerConfig
from mini_sglang.distributed.parallel_state import get_tp_rank, get_tp_size
from mini_sglang.environ import envs
from mini_sglang.layers.attention import create_attention_backend
from mini_sglang.layers.attention.hybrid_backend import HybridAttnBackend
from mini_sglang.layers.cpu_offload import offload_bytes_for_device
from mini_sglang.layers.kernels import (
    flashinfer_module,
    flashinfer_module_ready,
    flashinfer_sampling_spec,
    start_flashinfer_builds,
)
from mini_sglang.layers.kv_quant import is_fp8, resolve_kv_cache_dtype
from mini_sglang.layers.moe.expert_distribution import ExpertDistributionRecorder
from mini_sglang.layers.sampler import Sampler, SamplerOutput
from mini_sglang.mem_cache.allocator import get_allocator
from mini_sglang.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from mini_sglang.model_config import ModelConfig
from mini_sglang.model_executor.cuda_graph_runner import CudaGraphRunner
from mini_sglang.model_executor.forward_batch_info import ForwardBatch, ModelWorkerBatch
from mini_sglang.model_loader.kv_cache_scales import load_quantization_param_path
from mini_sglang.model_loader.loader import get_model

logger = logging.getLogger("mini_sglang")

GiB = 1 << 30
# Decode batches of at most MINI_SGLANG_TRITON_DECODE_MAX_BS (default 32) requests run the
# Triton split-KV kernel when the decode backend is flashinfer (ModelRunner.small_decode_max_bs),
# with this many splits per request.
# H100, bench_one_batch runner mode, context ~530, batch 1/8/32/64 ms per step, flashinfer
# vs Triton: Llama-3.1-8B 7.27/7.51/8.31/10.75 vs 6.28/6.92/7.89/9.73, Qwen3-0.6B
# 1.98/2.10/2.71/3.49 vs 1.43/1.77/2.50/3.53; flashinfer's own kernel is ahead at batch 64+
# (benchmarks/bench_decode_attention.py). 16 splits beat 8 and 32 at batch 1 (Llama-3.1-8B,
# scheduler mode: 6.21 / 6.14 / 6.16 ms/token). MINI_SGLANG_TRITON_DECODE_KV_SPLITS sets it
# (a model with fewer KV heads, e.g. Qwen3-30B-A3B's 4, runs half the programs per split).
SMALL_DECODE_KV_SPLITS = max(1, envs.MINI_SGLANG_TRITON_DECODE_KV_SPLITS.get())


def gpu_memory_gib(device: torch.device) -> tuple[float, float]:
    """(free, total) GiB on a CUDA device."""
    free, total = torch.cuda.mem_get_info(device)
    return free / GiB, total / GiB


@dataclass
class WeightSource:
    """The checkpoint the live weights came from: the launch values until an update from
    disk succeeds (weight_updates.update_weights_from_disk), which rolls back to it on failure."""

    model_path: str
    load_format: str


class ModelRunner:
    """Owns the model, KV pools, attention backend, sampler and CUDA graphs of one rank.

    `config` is its slice of the launch flags (config_slices.ModelRunnerConfig); the one
    piece of state that changes after construction besides the weights themselves is
    `weight_source`, the checkpoint they were last loaded from.
    """

    def __init__(
        self, model_config: ModelConfig, config: ModelRunnerConfig, gpu_id: int = 0
    ) -> None:
        self.model_config = model_config
        self.config = config
        self.device = torch.device(f"cuda:{gpu_id}" if config.device == "cuda" else "cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.page_size = config.page_size
        torch.manual_seed(config.random_seed)
        before = gpu_memory_gib(self.device)[0] if self.device.type == "cuda" else 0.0
        offload_bytes = offload_bytes_for_device(config.cpu_offload_gb, self.device)
        self.model = get_model(model_config, config.load_format, self.device, offload_bytes)
        self.weight_source = WeightSource(model_config.model_path, config.load_format)
        # Before the pool and CUDA graphs: the scales are read as floats when captured.
        load_quantization_param_path(
            self.model,
            config.quantization_param_path,
            config.kv_cache_dtype,
            get_tp_rank(),
            get_tp_size(),
            model_config.num_hidden_layers,
            getattr(model_config.hf_config, "model_type", None),
        )
        # Before CUDA graphs are captured: the layers' count adds are captured with them.
        self.expert_recorder = None
        if config.expert_distribution_recorder_mode:
            self.expert_recorder = ExpertDistributionRecorder.attach(
                self.model,
                model_config.num_hidden_layers,
                config.expert_distribution_recorder_buffer_size,
                self.device,
                mode=config.expert_distribution_recorder_mode,
                rank=get_tp_rank(),
                max_tokens=config.expert_distribution_max_tokens,
            )
            if self.expert_recorder is None:
                logger.warning(
                    "--expert-distribution-recorder-mode: the model has no MoE layers; "
                    "nothing is recorded."
                )
        if self.device.type == "cuda":
            if offload_bytes:
                # The offloaded layers' device blocks sit in the caching allocator; hand them
                # back so the weight usage and the KV pool sizing below see them free.
                torch.cuda.empty_cache()
            after = gpu_memory_gib(self.device)[0]
            self.weight_gib = before - after
            logger.info(
                "Load weight end. avail mem=%.2f GB, mem usage=%.2f GB.", after, self.weight_gib
            )
        else:
            self.weight_gib = (
                sum(p.numel() * p.element_size() for p in self.model.parameters()) / GiB
            )
        self.init_memory_pool()
        # The background builds wait for graph capture, whose first uses compile flashinfer's
        # decode modules and would otherwise queue behind them (start_flashinfer_builds).
        capture_done = threading.Event()
        self.prefill_build, sampling_build = self.start_flashinfer_builds(capture_done)
        self.attn_backend = self.create_attention_backend()
        self.sampler = Sampler(config.sampling_backend, sampling_build)
        self.graph_runner = None
        # CUDA graphs capture decode steps, which an embedding model never runs (SGLang).
        if (
            self.device.type == "cuda"
            and not config.disable_cuda_graph
            and model_config.is_generation
        ):
            if self.attn_backend.supports_cuda_graph:
                self.init_cuda_graphs()
            else:
                logger.warning("CUDA graphs disabled: the decode attention backend has none.")
        capture_done.set()

    def start_flashinfer_builds(
        self, after: threading.Event | None = None
    ) -> tuple[str | None, str | None]:
        """Start compiling in the background the flashinfer modules whose first use would
        otherwise fall on a request (docs/performance/startup.md), where something else can
        serve until each is built: the batch-prefill module when prefill_fallback_ok (the
        Triton extend kernel serves prefill meanwhile), then the sampling module when
        sampling uses flashinfer (the torch path samples meanwhile).

        Not with MINI_SGLANG_DISABLE_BACKGROUND_FLASHINFER_BUILD=1, and only at tp 1: the
        ranks of tp > 1 must run the same kernels at every step, and each rank's build would
        end at its own time. Elsewhere every module builds on first use. The thread starts
        compiling once `after` is set (graph capture done).
        Returns (prefill, sampling): each module's name while its build may be in flight
        (kernels.flashinfer_module_ready), None where nothing was started for it."""
        cfg = self.model_config
        if (
            self.device.type != "cuda"
            or get_tp_size() != 1
            or envs.MINI_SGLANG_DISABLE_BACKGROUND_FLASHINFER_BUILD.get()
        ):
            return None, None
        makers: dict[str, Callable[[], Any]] = {}
        if self.prefill_fallback_ok():
            # Local: as in layers/attention, the flashinfer backend's module loads on demand.
            from mini_sglang.layers.attention.flashinfer_backend import batch_prefill_spec

            makers["prefill"] = functools.partial(
                batch_prefill_spec, cfg.dtype, self.kv_dtype, cfg.head_dim, self.device
            )
        if (
            self.config.sampling_backend == "flashinfer"
            and cfg.is_generation
            and flashinfer_module() is not None
        ):
            makers["sampling"] = flashinfer_sampling_spec
        started = dict(zip(makers, start_flashinfer_builds(list(makers.values()), after)))
        if started.get("prefill"):
            logger.info(
                "Until flashinfer's batch prefill module is built, prefill runs the Triton kernel"
            )
        if started.get("sampling"):
            logger.info(
                "Until flashinfer's sampling module is built, sampling takes the torch path"
            )
        return started.get("prefill"), started.get("sampling")

    def prefill_fallback_ok(self) -> bool:
        """Whether Triton's extend kernel can serve this runner's prefill while flashinfer's
        batch-prefill module builds: prefill runs on flashinfer, on CUDA, with a KV cache in
        the model dtype or FP8 that Triton reads on this GPU (pool.triton_ok; the same cases
        as small_decode_max_bs). The kernel reads keys through req_to_token, so any page size
        works, and it runs encoder-only layers non-causally, as flashinfer's plan does."""
        prefill = self.config.attention.prefill_attention_backend or self.attention_backend_name()
        return (
            prefill == "flashinfer"
            and self.device.type == "cuda"
            and (self.kv_dtype == self.model_config.dtype or is_fp8(self.kv_dtype))
            and self.token_to_kv_pool.triton_ok
        )

    def create_attention_backend(self):
        """The --attention-backend, or a hybrid when the prefill and decode overrides
        (--prefill-attention-backend / --decode-attention-backend) differ, when small
        flashinfer decode batches go to the Triton kernel (see small_decode_max_bs), or while
        flashinfer's batch-prefill module builds (self.prefill_build): Triton's extend kernel
        then serves prefill, on the small-decode Triton backend where there is one."""
        base = self.attention_backend_name()
        prefill = self.config.attention.prefill_attention_backend or base
        decode = self.config.attention.decode_attention_backend or base
        small_bs = self.small_decode_max_bs(decode)
        fallback = not flashinfer_module_ready(self.prefill_build)
        if prefill == decode and not small_bs and not fallback:
            return create_attention_backend(prefill, self, self.config.attention)
        # Local: the module imports triton, needed only for a hybrid with a Triton side.
        from mini_sglang.layers.attention.triton_backend import TritonAttnBackend

        if prefill != decode:
            logger.info("Hybrid attention: %s for prefill, %s for decode", prefill, decode)
        prefill_backend = create_attention_backend(prefill, self, self.config.attention)
        decode_backend = (
            prefill_backend
            if prefill == decode
            else create_attention_backend(decode, self, self.config.attention)
        )
        small = TritonAttnBackend(self, SMALL_DECODE_KV_SPLITS) if small_bs else None
        prefill_fallback = None
        if fallback:
            prefill_fallback = (
                small
                if small is not None
                else TritonAttnBackend(self, self.config.attention.triton_attention_num_kv_splits)
            )
        return HybridAttnBackend(
            prefill_backend,
            decode_backend,
            small,
            small_bs,
            prefill_fallback,
            functools.partial(flashinfer_module_ready, self.prefill_build),
        )

    def small_decode_max_bs(self, decode: str) -> int:
        """Decode batches up to this size run the Triton split-KV kernel instead of
        flashinfer's: at batch 1, flashinfer's decode takes ~12 us per layer for a few MB
        of keys (split-KV plus a merge kernel, both latency-bound, and a host-side plan per
        step), the Triton kernel with 16 splits ~7 us. Only where the user
        did not pick the decode backend, on CUDA with a KV cache in the model dtype or FP8
        (the Triton kernels read FP8 with the layer scales, layers/kv_quant.py, where the
        GPU has the conversions: pool.triton_ok);
        MINI_SGLANG_TRITON_DECODE_MAX_BS overrides the size (0 turns it off)."""
        if (
            decode != "flashinfer"
            or self.config.attention.decode_attention_backend is not None
            or self.device.type != "cuda"
            or not (self.kv_dtype == self.model_config.dtype or is_fp8(self.kv_dtype))
            or not self.token_to_kv_pool.triton_ok
        ):
            return 0
        return envs.MINI_SGLANG_TRITON_DECODE_MAX_BS.get()

    def attention_backend_name(self) -> str:
        name = self.config.attention.attention_backend or (
            "torch_native" if self.device.type == "cpu" else "flashinfer"
        )
        return name

    # ---- memory --------------------------------------------------------------------
    def kv_cell_bytes(self) -> int:
        cfg = self.model_config
        return MHATokenToKVPool.bytes_per_token(
            cfg.num_kv_heads_per_rank(get_tp_size()),
            cfg.head_dim,
            cfg.num_hidden_layers,
            self.kv_dtype,
        )

    def profile_max_num_tokens(self) -> int:
        cell = self.kv_cell_bytes()
        if self.device.type == "cpu":
            budget = envs.MINI_SGLANG_CPU_KV_CACHE_GB.get() * GiB
        else:
            free, total = gpu_memory_gib(self.device)
            budget = (free - total * (1 - self.config.mem_fraction_static)) * GiB
        if budget <= 0:
            raise RuntimeError(
                "Not enough memory for the KV cache. Increase --mem-fraction-static "
                f"(now {self.config.mem_fraction_static})."
            )
        return int(budget // cell)

    def init_memory_pool(self) -> None:
        sa = self.config
        # FP8 halves the cell bytes, so the same budget holds twice the tokens.
        self.kv_dtype = resolve_kv_cache_dtype(sa.kv_cache_dtype, self.model_config.dtype)
        logger.info("Using KV cache dtype: %s", self.kv_dtype)
        max_tokens = self.profile_max_num_tokens()
        if sa.max_total_tokens is not None:
            if sa.max_total_tokens > max_tokens:
                logger.warning(
                    "max_total_tokens=%d is larger than the profiled value %d. Use the profiled value instead.",
                    sa.max_total_tokens,
                    max_tokens,
                )
            max_tokens = min(max_tokens, sa.max_total_tokens)
        max_tokens = max_tokens // self.page_size * self.page_size
        if max_tokens <= self.page_size:
            raise RuntimeError(f"KV cache too small: {max_tokens} tokens")
        self.max_total_num_tokens = max_tokens
        context_len = self.model_config.context_len
        max_num_reqs = sa.max_running_requests or min(
            max(int(max_tokens / context_len * 512), 2048), 4096
        )
        self.req_to_token_pool = ReqToTokenPool(max_num_reqs, context_len + 4, self.device)
        self.token_to_kv_pool_allocator = get_allocator(
            max_tokens, self.page_size, self.device, envs.SGLANG_DEBUG_MEMORY_POOL.get()
        )
        cfg = self.model_config
        self.token_to_kv_pool = MHATokenToKVPool(
            self.token_to_kv_pool_allocator.num_kv_slots - 1,
            self.kv_dtype,
            cfg.num_kv_heads_per_rank(get_tp_size()),
            cfg.head_dim,
            cfg.num_hidden_layers,
            self.device,
        )
        kv_gib = self.token_to_kv_pool.mem_bytes() / GiB
        logger.info(
            "KV Cache is allocated. #tokens: %d, K size: %.2f GB, V size: %.2f GB",
            max_tokens,
            kv_gib / 2,
            kv_gib / 2,
        )
        self.kv_cache_gib = kv_gib

    # ---- forward -------------------------------------------------------------------
    def init_cuda_graphs(self) -> None:
        self.graph_runner = CudaGraphRunner(self)

    def make_forward_batch(self, batch: ModelWorkerBatch) -> ForwardBatch:
        return ForwardBatch.init_new(
            batch, self.req_to_token_pool, self.token_to_kv_pool, self.attn_backend, self.device
        )

    @torch.no_grad()
    def forward(self, fb: ForwardBatch, get_embedding: bool = False):
        """The model's output: LogitsProcessorOutput, or with ``get_embedding`` (an EXTEND
        batch) the EmbeddingPoolerOutput of layers/pooler.py's contract."""
        recorder = self.expert_recorder
        if recorder is not None:
            recorder.begin_forward(fb)
        if get_embedding:
            self.attn_backend.init_forward_metadata(fb)
            out = self.model(fb.input_ids, fb.positions, fb, get_embedding=True)
        elif self.graph_runner is not None and self.graph_runner.can_run(fb):
            out = self.graph_runner.replay(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)
            out = self.model(fb.input_ids, fb.positions, fb)
        if recorder is not None:
            recorder.end_forward()
        return out

    @torch.no_grad()
    def sample(self, logits: torch.Tensor, fb: ForwardBatch) -> SamplerOutput:
        # The sampled token lands at position seq_len: that keys the seeded noise.
        return self.sampler(logits, fb.sampling_info, fb.seq_lens, fb.return_logprob)
