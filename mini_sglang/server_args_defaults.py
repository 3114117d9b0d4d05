"""The pure rules behind ServerArgs' "auto" (None) defaults, as SGLang 0.5.4 computes them.

The memory heuristics (chunked prefill size, CUDA-graph max batch size and capture list,
--mem-fraction-static) are pure functions of the device memory size, so they can be tested
without a GPU; `get_device_memory_capacity_mb` measures that size (nvidia-smi first, so the
launcher creates no CUDA context). `resolve_dtype` is SGLang's --dtype "auto" rule and
`is_gguf_file` the check that makes --load-format "auto" pick GGUF. `ServerArgs.__post_init__`
applies these rules; nothing here reads or writes a ServerArgs.
"""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING, Any

from mini_sglang.server_args_validation import DTYPE_CHOICES

if TYPE_CHECKING:
    import torch

# --mem-fraction-static bookkeeping, all in MB (SGLang's _handle_gpu_memory_settings).
_BASE_RESERVED_MB = 512
_LARGE_GPU_MB = 60 * 1024
_LARGE_GPU_MIN_RESERVED_MB = 10 * 1024
_UNKNOWN_MEM_FRACTION = 0.88
# CPU prefill is compute-bound and slow (seconds per 2k tokens on a few cores); a small chunk
# bounds how long running decodes stall behind one long prompt, and 2048 is also SGLang's
# smallest-GPU tier. SGLang would size it from host RAM instead, giving 16k on big hosts.
CPU_CHUNKED_PREFILL_SIZE = 2048
# SGLang's activation estimate (1.5 MB per prefill token) is sized for large models on GPUs;
# on a small CPU host with chunking disabled it would exceed the whole RAM and make the
# fraction negative. CPU tests must not fail for that, so the auto value has a floor there.
CPU_MIN_MEM_FRACTION_STATIC = 0.3


def default_chunked_prefill_and_cuda_graph_max_bs(
    gpu_mem_mb: float | None, tp_size: int
) -> tuple[int, int]:
    """SGLang's (chunked_prefill_size, cuda_graph_max_bs) for a device of `gpu_mem_mb` MB."""
    if gpu_mem_mb is None:
        return 4096, 160
    small_tp = tp_size < 4
    for limit_gb, chunk, bs_small_tp, bs_large_tp in (
        (20, 2048, 8, 8),  # T4, 4080
        (35, 2048, 16, 80),  # A10, 4090, 5090
        (60, 4096, 32, 160),  # A100-40G, L40
        (90, 8192, 256, 512),  # H100, A100-80G
        (160, 8192, 256, 512),  # H20, H200
    ):
        if gpu_mem_mb < limit_gb * 1024:
            return chunk, bs_small_tp if small_tp else bs_large_tp
    return 16384, 512  # B200, MI300


def compute_mem_fraction_static(
    gpu_mem_mb: float | None,
    chunked_prefill_size: int,
    cuda_graph_max_bs: int,
    tp_size: int = 1,
    pp_size: int = 1,
    max_prefill_tokens: int = 16384,
) -> float:
    """SGLang's auto --mem-fraction-static: (mem - reserved) / mem, rounded to 3 places.

    reserved = 512 + max(prefill chunk, 2048) * 1.5 (activations) + cuda_graph_max_bs * 2
    (graph buffers) + tp * pp / 8 * 1024, at least 10 GB on GPUs above 60 GB; 0.88 when the
    memory size is unknown. The fraction bounds model weights plus the KV cache pool.
    """
    if gpu_mem_mb is None:
        return _UNKNOWN_MEM_FRACTION
    chunk = chunked_prefill_size if chunked_prefill_size > 0 else max_prefill_tokens
    reserved = _BASE_RESERVED_MB + max(chunk, 2048) * 1.5
    reserved += cuda_graph_max_bs * 2 + tp_size * pp_size / 8 * 1024
    if gpu_mem_mb > _LARGE_GPU_MB:
        reserved = max(reserved, _LARGE_GPU_MIN_RESERVED_MB)
    return round((gpu_mem_mb - reserved) / gpu_mem_mb, 3)


def generate_cuda_graph_batch_sizes(
    cuda_graph_max_bs: int, disable_padding: bool = False
) -> list[int]:
    """SGLang's capture list: [1,2,4,8,12] + 16..256/8 + 272..496/16 + 512../32, <= max."""
    if disable_padding:  # a graph for every size, used only on an exact match
        return list(range(1, cuda_graph_max_bs + 1))
    bs = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16))
    bs += list(range(512, cuda_graph_max_bs + 1, 32))
    return [b for b in bs if b <= cuda_graph_max_bs]


def _nvidia_smi(field: str) -> list[str]:
    """nvidia-smi's --query-gpu=field, one value per GPU (no header, no units); [] where
    nvidia-smi is missing or fails. It is asked instead of torch.cuda, which would create a
    CUDA context in the launcher process, while the scheduler subprocesses must own theirs."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [x.strip() for x in out.splitlines() if x.strip()]


def get_device_memory_capacity_mb(device: str) -> float | None:
    """Smallest GPU's memory in MB (host RAM for cpu, as SGLang), None when unknown
    (nvidia-smi first, see _nvidia_smi; torch.cuda only where it cannot tell)."""
    if device.startswith("cpu"):
        import psutil

        return float(psutil.virtual_memory().total // (1 << 20))
    try:
        sizes = [float(x) for x in _nvidia_smi("memory.total")]
    except ValueError:
        sizes = []
    if sizes:
        return min(sizes)
    import torch

    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return min(torch.cuda.get_device_properties(i).total_memory for i in range(n)) / (1 << 20)
    return None


def get_device_compute_capability(device: str) -> tuple[int, int] | None:
    """The smallest GPU's compute capability, e.g. (9, 0), from nvidia-smi; None on CPU or
    when nvidia-smi cannot tell."""
    if device.startswith("cpu"):
        return None
    try:
        caps = [tuple(int(v) for v in x.split(".")) for x in _nvidia_smi("compute_cap")]
    except ValueError:
        return None
    return min(caps) if caps else None  # type: ignore[return-value]


# The smallest page flashinfer's XQA decode kernel takes (flashinfer_backend.XQA_PAGE_SIZES):
# the radix cache matches prefixes in whole pages, so the smallest keeps reuse finest.
FP8_KV_PAGE_SIZE = 16


def default_page_size(
    kv_cache_dtype: str,
    decode_backend: str,
    capability: tuple[int, int] | None,
    chunked_prefill_size: int,
    xqa_enabled: bool,
) -> int:
    """--page-size when not given: SGLang's 1, except FP8_KV_PAGE_SIZE for an FP8 e4m3 KV
    cache decoded by flashinfer on sm90 or newer, where flashinfer_backend.xqa_decode_ok
    then holds. XQA's FP8 tensor-core decode reads the pool about twice as fast as any
    kernel at pages of 1 (H200, batch 256 x 800 tokens: 118 us against flashinfer's 229 us
    over a bf16 pool and 267 us over the FP8 one; docs/performance/decode-attention.md).
    A chunked prefill size that 16 does not divide keeps pages of 1 rather than fail."""
    wants_xqa = (
        xqa_enabled
        and kv_cache_dtype == "fp8_e4m3"
        and decode_backend == "flashinfer"
        and capability is not None
        and capability >= (9, 0)
    )
    fits = chunked_prefill_size <= 0 or chunked_prefill_size % FP8_KV_PAGE_SIZE == 0
    return FP8_KV_PAGE_SIZE if wants_xqa and fits else 1


_STR_TO_DTYPE_NAME = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16",
                      "float": "float32", "float32": "float32"}  # fmt: skip


def resolve_dtype(dtype: str, config_torch_dtype: Any = None, model_type: str = "") -> torch.dtype:
    """--dtype -> torch.dtype with SGLang's "auto" rule for a checkpoint of `config_torch_dtype`.

    auto: FP32 checkpoints (or unknown) -> FP16 (BF16 for Gemma); FP16/BF16 stay as they are.
    """
    import torch

    if isinstance(config_torch_dtype, str):
        config_torch_dtype = getattr(torch, _STR_TO_DTYPE_NAME.get(config_torch_dtype, ""), None)
    if config_torch_dtype is None:
        config_torch_dtype = torch.float32
    if dtype != "auto":
        if dtype not in _STR_TO_DTYPE_NAME:
            raise ValueError(f"--dtype: unknown dtype {dtype!r}; choose from {DTYPE_CHOICES}")
        return getattr(torch, _STR_TO_DTYPE_NAME[dtype])
    if config_torch_dtype == torch.float32:
        return torch.bfloat16 if model_type.startswith("gemma") else torch.float16
    return config_torch_dtype


def is_gguf_file(path: str) -> bool:
    """True for a local file that is GGUF (by suffix or magic), as SGLang's check_gguf_file."""
    try:
        if path.endswith(".gguf"):
            return True
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False
