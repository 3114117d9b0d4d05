"""flashinfer attention: paged decode (tensor cores for GQA >= 4, see
decode_tensor_core_policy) and paged prefill, planned once
per batch and reused by every layer; CUDA-graph hooks for decode.

The KV pool's per-layer buffers [num_slots, kv_heads, head_dim] are viewed as flashinfer's
NHD paged layout [num_pages, page_size, kv_heads, head_dim]; a request's pages are its
req_to_token slots at multiples of page_size divided by page_size (kv_indices.py). Prefill
runs "paged throughout": the new tokens' K/V are written to the pool first, then one causal
prefill kernel attends over cached prefix and new tokens alike.

Causality is part of flashinfer's prefill plan, while it is a property of each layer
(RadixAttention.is_causal: False for encoder-only layers). The plan takes the causality the
last extend layer asked for; a layer that wants the other one re-plans the batch with the
saved arguments. Every layer of a model has the same type, so this re-plans at most once,
on a model's first extend batch.

FP8 KV cache: plan() gets the pool dtype as kv_data_type and run() the layer's k_scale /
v_scale, which flashinfer folds into the score scale and the output (layers/kv_quant.py).
Where xqa_decode_ok holds (an e4m3 pool in pages of 16-128 on sm90+; --kv-cache-dtype
fp8_e4m3 defaults to pages of 16 there), decode runs flashinfer's XQA kernel instead: it takes a
block table [batch, pages per request] and the lengths, filled per batch into fixed buffers
(so CUDA graphs replay them), and no plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from mini_sglang.distributed.parallel_state import get_tp_size
from mini_sglang.environ import envs
from mini_sglang.layers.attention.base_attn_backend import AttentionBackend
from mini_sglang.layers.attention.kv_indices import fill_kv_indices
from mini_sglang.layers.kernels import serialize_flashinfer_ninja
from mini_sglang.layers.kv_quant import is_fp8

if TYPE_CHECKING:
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch
    from mini_sglang.model_executor.model_runner import ModelRunner

WORKSPACE_BYTES = 256 << 20
# XQA's workspace: its first 8 MB are semaphores that must start at zero, the rest scratch
# for the partial results of KV splits
XQA_WORKSPACE_BYTES = 128 << 20
XQA_PAGE_SIZES = (16, 32, 64, 128)


def xqa_decode_ok(
    q_dtype: torch.dtype, kv_dtype: torch.dtype, page_size: int, head_dim: int, device
) -> bool:
    """Whether decode runs flashinfer's XQA kernel (TensorRT-LLM's decode attention,
    flashinfer.decode.trtllm_batch_decode_with_kv_cache with backend "xqa"), unless
    MINI_SGLANG_XQA_DECODE=0, over an FP8 e4m3 pool (on Hopper XQA then runs its FP8
    tensor-core kernel, where every other decode kernel here spends as long per FP8 element
    as per bf16 one; docs/performance/decode-attention.md), with pages of 16-128 tokens
    (XQA's), bf16/fp16 queries, head_dim a multiple of 16 up to 256, on sm90 or newer."""
    return (
        envs.MINI_SGLANG_XQA_DECODE.get()
        and kv_dtype == torch.float8_e4m3fn
        and page_size in XQA_PAGE_SIZES
        and q_dtype in (torch.bfloat16, torch.float16)
        and head_dim % 16 == 0
        and head_dim <= 256
        and torch.device(device).type == "cuda"
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


def block_table(
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    page_size: int,
    out: torch.Tensor,
    max_len: int | None = None,
) -> torch.Tensor:
    """Each request's page ids, out[i, j] = page j of request rows[i] (the slot of its token
    j * page_size, divided by page_size), for the pages that max_len tokens fill (default:
    as many as out has columns); returns the filled block out[:len(rows), :pages]. Pages
    past a request's length hold whatever was there and are never read, so a batch whose
    longest request has max_len tokens gathers ceil(max_len / page_size) columns, not the
    context length's (8,192 strided reads a row for a 131,072-token context). E.g.
    page_size 16, a request whose tokens 0..20 sit in slots 160..180: its row starts
    [10, 11]."""
    n, pages = len(rows), out.shape[1]
    if max_len is not None:
        pages = min(pages, -(-max_len // page_size))
    starts = req_to_token[rows.long(), : pages * page_size : page_size]
    return torch.floor_divide(starts, page_size, out=out[:n, : starts.shape[1]])


def decode_tensor_core_policy(num_qo_heads: int, num_kv_heads: int) -> tuple[bool, int]:
    """(use tensor-core decode at all, largest batch size that uses it).

    Default: from GQA group 4 up, at every batch size. On an H200, Llama-3.1-8B (group 4)
    decoded at bs 1 in 4.75 ms/token with it and 4.98 without (SGLang switches only above
    4), and with Llama-3.1-8B's heads the kernel alone reads KV faster than the CUDA-core
    one at every batch from 64 up (bench_decode_attention.py, H200: batch 64 x 1024 tokens
    3.67 vs 2.57 TB/s, batch 256 x 2048 4.24 vs 2.96). SGLANG_FLASHINFER_USE_TENSOR_CORE=
    true/false forces it (SGLang's variable); MINI_SGLANG_TENSOR_CORE_DECODE_MAX_BS=N keeps it
    for batches up to N only.
    """
    forced = envs.SGLANG_FLASHINFER_USE_TENSOR_CORE.get()
    use = forced if forced is not None else num_qo_heads // num_kv_heads >= 4
    max_bs = envs.MINI_SGLANG_TENSOR_CORE_DECODE_MAX_BS.get()
    return use, max_bs


def prefill_backend(q_dtype: torch.dtype, kv_dtype: torch.dtype) -> str:
    """The flashinfer backend of the paged prefill wrapper: "auto" (fa3 on sm90a, fa2
    elsewhere) when queries and KV share a dtype, else "fa2". flashinfer's fa3 picks its
    GEMMs from one element type for Q and KV, so bf16 queries over an FP8 cache fail to
    compile on an H100/H200 (cute's "MajorB must be GMMA::Major::K"); its "auto" does not
    check the dtypes (SGLang runs every paged prefill on fa2)."""
    return "auto" if q_dtype == kv_dtype else "fa2"


def batch_prefill_spec(
    q_dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int, device: torch.device
) -> Any:
    """flashinfer's JIT spec of the batch-prefill module that FlashInferAttnBackend's plan
    (_plan_prefill) makes BatchPrefillWithPagedKVCacheWrapper load, for queries and output
    in q_dtype over a KV cache in kv_dtype (FP8 included) with head_dim for q/k and v/o.

    It mirrors plan()'s resolution: the wrapper's backend (prefill_backend), where "auto",
    becomes fa3 where the device supports sm90a and fa2 otherwise (flashinfer's
    determine_attention_backend, with no custom mask, no positional encoding inside the
    kernel and no fp16 QK reduction), and
    the module is keyed by those dtypes, the page indices' int32 (_page_table) and no
    sliding window or logits soft cap (plan()'s defaults, which _plan_prefill keeps). Raises
    where flashinfer or its JIT API is not the one expected (keyword arguments: a changed
    signature fails instead of naming another module)."""
    from flashinfer.jit.attention import gen_batch_prefill_module
    from flashinfer.utils import PosEncodingMode, determine_attention_backend

    no_pos = PosEncodingMode.NONE.value
    backend = prefill_backend(q_dtype, kv_dtype)
    if backend == "auto":
        backend = determine_attention_backend(
            device=device,
            pos_encoding_mode=no_pos,
            use_fp16_qk_reductions=False,
            use_custom_mask=False,
            dtype_q=q_dtype,
            dtype_kv=kv_dtype,
        )
    return gen_batch_prefill_module(
        backend,
        dtype_q=q_dtype,
        dtype_kv=kv_dtype,
        dtype_o=q_dtype,
        dtype_idx=torch.int32,
        head_dim_qk=head_dim,
        head_dim_vo=head_dim,
        pos_encoding_mode=no_pos,
        use_sliding_window=False,
        use_logits_soft_cap=False,
        use_fp16_qk_reduction=False,
    )


class FlashInferAttnBackend(AttentionBackend):
    supports_cuda_graph = True

    def __init__(self, runner: ModelRunner) -> None:
        import flashinfer

        serialize_flashinfer_ninja()
        self.fi = flashinfer
        cfg = runner.model_config
        tp = get_tp_size()
        self.num_qo_heads = cfg.num_attention_heads // tp
        self.num_kv_heads = cfg.num_kv_heads_per_rank(tp)
        self.head_dim = cfg.head_dim
        self.page_size = runner.page_size
        self.device = runner.device
        self.q_dtype = cfg.dtype
        self.kv_dtype = runner.kv_dtype
        self.req_to_token = runner.req_to_token_pool.req_to_token
        max_pages = runner.token_to_kv_pool_allocator.num_kv_slots // self.page_size + 1
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.use_tensor_cores, self.tensor_core_max_bs = decode_tensor_core_policy(
            self.num_qo_heads, self.num_kv_heads
        )
        self.kv_indices = torch.empty(max_pages + 1024, dtype=torch.int32, device=self.device)
        # Eager decode wrappers by tensor-core use, made on first need.
        self.decode_wrappers: dict[bool, object] = {}
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend=prefill_backend(self.q_dtype, self.kv_dtype)
        )
        self.graph_wrappers: dict[int, object] = {}
        self.active_decode = None
        self.xqa = xqa_decode_ok(
            self.q_dtype, self.kv_dtype, self.page_size, self.head_dim, self.device
        )
        if self.xqa:
            max_reqs, max_context = self.req_to_token.shape
            pages = -(-max_context // self.page_size)
            self.xqa_workspace = torch.zeros(
                XQA_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device
            )
            self.xqa_pages = torch.zeros(max_reqs, pages, dtype=torch.int32, device=self.device)
            self.xqa_seq_lens = torch.ones(max_reqs, dtype=torch.int32, device=self.device)
        # The current batch's prefill plan arguments (all but causal) and its causality.
        self._prefill_plan_args: tuple = ()
        self._prefill_causal = True
        self._last_plan_copied: torch.cuda.Event | None = None

    def _tensor_cores_for(self, bs: int) -> bool:
        return self.use_tensor_cores and bs <= self.tensor_core_max_bs

    # ---- planning ------------------------------------------------------------------
    def _page_table(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill self.kv_indices with the batch's pages; return the host-side
        (kv_indptr, last_page_len) that flashinfer's plan() wants (int32).

        The device copy of kv_indptr that the index kernel reads is computed on the device
        from fb.seq_lens, so nothing is copied host->device (see utils/device.py)."""
        ps = self.page_size
        seq = fb.seq_lens_cpu.to(torch.int32)
        indptr = torch.zeros(len(seq) + 1, dtype=torch.int32)
        torch.cumsum((seq + ps - 1) // ps, 0, out=indptr[1:])
        indptr_dev = torch.zeros(len(seq) + 1, dtype=torch.int32, device=self.device)
        torch.cumsum((fb.seq_lens + ps - 1) // ps, 0, out=indptr_dev[1:])
        fill_kv_indices(self.req_to_token, fb.req_pool_indices, indptr_dev, self.kv_indices, ps)
        return self._pinned(indptr), self._pinned((seq - 1) % ps + 1)

    def _pinned(self, host: torch.Tensor) -> torch.Tensor:
        """`host` in pinned memory. plan() copies its host arguments to the device with
        non_blocking=True, which from pageable memory blocks until the stream drains: every
        decode step's plan would wait for the previous step to finish, and the GPU would sit
        idle while the host planned and launched the next graph. torch's caching host
        allocator keeps a pinned block alive until the copies that read it have run."""
        return host.pin_memory() if self.device.type == "cuda" else host

    def _plan(self, wrapper, *args, **kwargs) -> None:
        """wrapper.plan(...) that never overwrites flashinfer's pinned plan buffer while the
        previous plan's copy out of it is still queued.

        flashinfer's plan() writes its schedule into one pinned host buffer and enqueues an
        async copy from it. With overlap scheduling, plan N+1 runs while step N is queued,
        so it first waits for the event recorded after plan N (in steady state that point
        has long passed: the host already waited for step N-1's tokens)."""
        if self._last_plan_copied is not None:
            self._last_plan_copied.synchronize()
        wrapper.plan(*args, **kwargs)
        if self.device.type == "cuda":
            self._last_plan_copied = torch.cuda.Event()
            self._last_plan_copied.record()

    def _heads(self) -> tuple:
        return self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size

    def _plan_decode(self, wrapper, fb: ForwardBatch) -> None:
        indptr, last = self._page_table(fb)
        self._plan(
            wrapper,
            indptr,
            self.kv_indices,
            last,
            *self._heads(),
            q_data_type=self.q_dtype,
            kv_data_type=self.kv_dtype,
            non_blocking=True,
        )

    def _xqa_metadata(self, fb: ForwardBatch) -> None:
        """The batch's block table and lengths into the XQA buffers (stream-ordered after the
        previous step's kernels that read them)."""
        bs = len(fb.seq_lens)
        max_len = int(fb.seq_lens_cpu.max()) if bs else 1  # host lengths: no sync
        block_table(self.req_to_token, fb.req_pool_indices, self.page_size, self.xqa_pages, max_len)
        self.xqa_seq_lens[:bs].copy_(fb.seq_lens)

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_decode() and self.xqa:
            self._xqa_metadata(fb)
            return
        if fb.forward_mode.is_decode():
            tc = self._tensor_cores_for(len(fb.seq_lens_cpu))
            if tc not in self.decode_wrappers:
                self.decode_wrappers[tc] = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_tensor_cores=tc
                )
            self.active_decode = self.decode_wrappers[tc]
            self._plan_decode(self.active_decode, fb)
            return
        indptr, last = self._page_table(fb)
        ext = torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int32)
        qo_indptr = torch.zeros(len(ext) + 1, dtype=torch.int32)
        torch.cumsum(ext, 0, out=qo_indptr[1:])
        self._prefill_plan_args = (self._pinned(qo_indptr), indptr, self.kv_indices, last)
        self._plan_prefill(self._prefill_causal)

    def _plan_prefill(self, causal: bool) -> None:
        # The module this loads is the one batch_prefill_spec names: keep the two in step.
        self._plan(
            self.prefill_wrapper,
            *self._prefill_plan_args,
            *self._heads(),
            causal=causal,
            q_data_type=self.q_dtype,
            kv_data_type=self.kv_dtype,
            non_blocking=True,
        )
        self._prefill_causal = causal

    # ---- kernels -------------------------------------------------------------------
    def _paged(self, fb: ForwardBatch, layer_id: int):
        k, v = fb.token_to_kv_pool.get_kv_buffer(layer_id)
        shape = (-1, self.page_size, self.num_kv_heads, self.head_dim)
        return k.view(shape), v.view(shape)

    def _scales(self, layer) -> dict:
        """run()'s k_scale / v_scale for an FP8 pool; nothing for a model-dtype one (its
        kernels then run exactly as without the option)."""
        if not is_fp8(self.kv_dtype):
            return {}
        return {"k_scale": layer.k_scale, "v_scale": layer.v_scale}

    def _save(self, k, v, layer, fb: ForwardBatch, save: bool) -> None:
        if save:
            fb.token_to_kv_pool.set_kv_buffer(
                layer.layer_id, fb.out_cache_loc, k, v, layer.k_scale, layer.v_scale
            )

    def forward_extend(self, q, k, v, layer, fb, save_kv_cache=True):
        self._save(k, v, layer, fb, save_kv_cache)
        if layer.is_causal != self._prefill_causal:
            self._plan_prefill(layer.is_causal)
        o = self.prefill_wrapper.run(
            q.view(-1, layer.tp_q_head_num, layer.head_dim),
            self._paged(fb, layer.layer_id),
            **self._scales(layer),
        )
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)

    def forward_decode(self, q, k, v, layer, fb, save_kv_cache=True):
        self._save(k, v, layer, fb, save_kv_cache)
        if self.xqa:
            return self._xqa_decode(q, layer, fb)
        o = self.active_decode.run(
            q.view(-1, layer.tp_q_head_num, layer.head_dim),
            self._paged(fb, layer.layer_id),
            **self._scales(layer),
        )
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)

    def _xqa_decode(self, q, layer, fb: ForwardBatch) -> torch.Tensor:
        """XQA over the pool: q's scale (the softmax scale times k_scale) and one KV scale,
        v_scale, from which XQA recovers the scores' k_scale (see
        trtllm_batch_decode_with_kv_cache's bmm1_scale / bmm2_scale)."""
        from flashinfer.decode import trtllm_batch_decode_with_kv_cache

        bs = q.shape[0]
        o = trtllm_batch_decode_with_kv_cache(
            q.view(bs, layer.tp_q_head_num, layer.head_dim),
            self._paged(fb, layer.layer_id),
            self.xqa_workspace,
            self.xqa_pages[:bs],
            self.xqa_seq_lens[:bs],
            self.xqa_pages.shape[1] * self.page_size,
            bmm1_scale=layer.scaling * layer.k_scale,
            bmm2_scale=layer.v_scale,
            kv_layout="NHD",
            backend="xqa",
        )
        return o.view(bs, layer.tp_q_head_num * layer.head_dim)

    # ---- CUDA graphs (decode) ------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.graph_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)

    def _graph_wrapper(self, bs: int):
        if bs not in self.graph_wrappers:
            self.graph_wrappers[bs] = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=self._tensor_cores_for(bs),
                paged_kv_indptr_buffer=self.graph_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
            )
        return self.graph_wrappers[bs]

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        if self.xqa:  # the graph reads the fixed XQA buffers, refilled before each replay
            self._xqa_metadata(fb)
            return
        wrapper = self._graph_wrapper(bs)
        self._plan_decode(wrapper, fb)
        self.active_decode = wrapper

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        if self.xqa:
            self._xqa_metadata(fb)
            return
        wrapper = self.graph_wrappers[bs]
        self._plan_decode(wrapper, fb)
        self.active_decode = wrapper
