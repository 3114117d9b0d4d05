"""The flag vocabulary of ServerArgs: choices, limits, the unsupported-flag table, the pure
rules behind the "auto" defaults, argparse and --config.

The memory heuristics (chunked prefill size, CUDA-graph batch sizes, --mem-fraction-static)
are pure functions of the device memory so they can be tested without a GPU.
`add_cli_args(parser)` declares every flag with SGLang 0.5.4's spelling, aliases, types and
choices; defaults come from the `ServerArgs` dataclass so there is one source of truth.
`prepare_server_args(argv)` merges `--config file.yaml` under the command line (CLI wins)
and builds a resolved `ServerArgs`. An unknown flag makes argparse exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import subprocess
from typing import TYPE_CHECKING, Any

from mini_sglang.entrypoints.openai.function_call.function_call_parser import (
    SGLANG_TOOL_CALL_PARSERS,
    TOOL_CALL_PARSERS,
)
from mini_sglang.entrypoints.openai.reasoning_parser import (
    REASONING_PARSERS,
    SGLANG_REASONING_PARSERS,
)

if TYPE_CHECKING:
    import torch

    from mini_sglang.server_args import ServerArgs

LOAD_FORMAT_CHOICES = ["auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "gguf",
                       "bitsandbytes", "layered", "remote", "remote_instance"]  # fmt: skip
QUANTIZATION_CHOICES = ["awq", "fp8", "gptq", "marlin", "gptq_marlin", "awq_marlin",
                        "bitsandbytes", "gguf", "modelopt", "modelopt_fp8", "modelopt_fp4",
                        "petit_nvfp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "qoq", "w4afp8",
                        "mxfp4", "compressed-tensors"]  # fmt: skip
ATTENTION_BACKEND_CHOICES = ["triton", "torch_native", "flex_attention", "nsa", "cutlass_mla",
                             "fa3", "fa4", "flashinfer", "flashmla", "trtllm_mla", "trtllm_mha",
                             "dual_chunk_flash_attn", "aiter", "wave", "intel_amx", "ascend",
                             "intel_xpu"]  # fmt: skip
DTYPE_CHOICES = ["auto", "half", "float16", "bfloat16", "float", "float32"]
KV_CACHE_DTYPE_CHOICES = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"]
SCHEDULE_POLICY_CHOICES = ["lpm", "random", "fcfs", "dfs-weight", "lof", "priority"]
LOAD_BALANCE_METHOD_CHOICES = ["round_robin", "shortest_queue", "minimum_tokens"]
SAMPLING_BACKEND_CHOICES = ["flashinfer", "pytorch"]
GRAMMAR_BACKEND_CHOICES = ["xgrammar", "outlines", "llguidance", "none"]
RADIX_EVICTION_POLICY_CHOICES = ["lru", "lfu"]
TOKENIZER_MODE_CHOICES = ["auto", "slow"]
LOG_LEVEL_CHOICES = ["debug", "info", "warning", "error", "critical"]
SAMPLING_DEFAULTS_CHOICES = ["openai", "model"]
SPECULATIVE_ALGORITHM_CHOICES = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]

# What mini-sglang implements; other values in SGLang's choices are reset with a warning.
SUPPORTED_ATTENTION_BACKENDS = ("torch_native", "flashinfer", "triton")
SUPPORTED_LOAD_FORMATS = ("auto", "pt", "safetensors", "dummy", "gguf")


def _unsupported_backend(v: Any) -> bool:
    return v is not None and v not in SUPPORTED_ATTENTION_BACKENDS


def _given(v: Any) -> bool:
    return v is not None


# The single table of flags that are accepted for SGLang compatibility but whose feature
# mini-sglang lacks: field name -> "this value asks for the missing feature". ServerArgs
# logs such a value (naming the flag) and resets it to the field's default, so downstream
# code never sees it.
UNSUPPORTED_FLAGS: dict[str, Any] = {
    "pp_size": lambda v: v != 1,
    "quantization": lambda v: v not in (None, "gguf"),  # gguf weights are dequantized at load
    "kv_cache_dtype": lambda v: v != "auto",
    "load_format": lambda v: v not in SUPPORTED_LOAD_FORMATS,
    "is_embedding": bool,
    "enable_torch_compile": bool,
    "enable_dp_attention": bool,
    "enable_hierarchical_cache": bool,
    "enable_lora": bool,
    "lora_paths": bool,
    "max_lora_rank": _given,
    "speculative_algorithm": _given,
    "speculative_draft_model_path": _given,
    "speculative_num_steps": _given,
    "speculative_eagle_topk": _given,
    "speculative_num_draft_tokens": _given,
    # SGLang parser names whose formats mini-sglang lacks (gpt-oss, mistral, ...).
    "reasoning_parser": lambda v: v is not None and v not in REASONING_PARSERS,
    "tool_call_parser": lambda v: v is not None and v not in TOOL_CALL_PARSERS,
    "attention_backend": _unsupported_backend,
    "prefill_attention_backend": _unsupported_backend,
    "decode_attention_backend": _unsupported_backend,
    "grammar_backend": lambda v: v not in (None, "xgrammar", "none"),
    "schedule_policy": lambda v: v == "priority",
    "device": lambda v: v is not None and v.split(":")[0] not in ("cuda", "cpu"),
    "completion_template": _given,
    "multi_item_scoring_delimiter": _given,
    "enable_return_hidden_states": bool,
}

# Fields whose value must be one of a fixed list (argparse checks the CLI; this checks code).
CHOICES: dict[str, list[Any]] = {
    "tokenizer_mode": TOKENIZER_MODE_CHOICES,
    "load_format": LOAD_FORMAT_CHOICES,
    "dtype": DTYPE_CHOICES,
    "kv_cache_dtype": KV_CACHE_DTYPE_CHOICES,
    "quantization": [None, *QUANTIZATION_CHOICES],
    "schedule_policy": SCHEDULE_POLICY_CHOICES,
    "radix_eviction_policy": RADIX_EVICTION_POLICY_CHOICES,
    "load_balance_method": LOAD_BALANCE_METHOD_CHOICES,
    "attention_backend": [None, *ATTENTION_BACKEND_CHOICES],
    "prefill_attention_backend": [None, *ATTENTION_BACKEND_CHOICES],
    "decode_attention_backend": [None, *ATTENTION_BACKEND_CHOICES],
    "sampling_backend": [None, *SAMPLING_BACKEND_CHOICES],
    "grammar_backend": [None, *GRAMMAR_BACKEND_CHOICES],
    "log_level": LOG_LEVEL_CHOICES,
    "log_level_http": [None, *LOG_LEVEL_CHOICES],
    "log_requests_level": [0, 1, 2, 3],
    "sampling_defaults": SAMPLING_DEFAULTS_CHOICES,
    "speculative_algorithm": [None, *SPECULATIVE_ALGORITHM_CHOICES],
    "reasoning_parser": [None, *SGLANG_REASONING_PARSERS],
    "tool_call_parser": [None, *SGLANG_TOOL_CALL_PARSERS],
}

# Fields that, when given (not None), must be >= the bound.
MIN_VALUES: dict[str, int] = {
    "tp_size": 1, "pp_size": 1, "dp_size": 1, "page_size": 1, "stream_interval": 1,
    "max_running_requests": 1, "max_total_tokens": 1, "max_queued_requests": 1,
    "max_prefill_tokens": 1, "context_length": 1, "cuda_graph_max_bs": 1,
    "torch_compile_max_bs": 1, "nnodes": 1, "node_rank": 0, "base_gpu_id": 0,
    "gpu_id_step": 1, "dist_timeout": 1, "decode_log_interval": 1,
}  # fmt: skip


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


def get_device_memory_capacity_mb(device: str) -> float | None:
    """Smallest GPU's memory in MB (host RAM for cpu, as SGLang), None when unknown.

    nvidia-smi is asked first because querying torch.cuda would create a CUDA context in
    the launcher process, which the scheduler subprocesses must own.
    """
    if device.startswith("cpu"):
        import psutil

        return float(psutil.virtual_memory().total // (1 << 20))
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        sizes = [float(x) for x in out.split() if x.strip()]
        if sizes:
            return min(sizes)
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    import torch

    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return min(torch.cuda.get_device_properties(i).total_memory for i in range(n)) / (1 << 20)
    return None


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


def is_port_available(port: int) -> bool:
    """True if a TCP socket can bind `port` on all interfaces right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
            return True
        except OSError:
            return False


_S, _I, _F = str, int, float
_T = "store_true"

# (option strings, argparse kwargs); the first option string names the dataclass field.
_FLAGS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    # Model and tokenizer
    (("--model-path", "--model"), dict(type=_S, help="Model weights: a local folder, a GGUF file or an HF repo id. Omitted: the embedded default model.")),
    (("--tokenizer-path",), dict(type=_S, help="The path of the tokenizer (default: the model path).")),
    (("--tokenizer-mode",), dict(type=_S, choices=TOKENIZER_MODE_CHOICES, help="'auto' uses the fast tokenizer if available, 'slow' always the slow one.")),
    (("--skip-tokenizer-init",), dict(action=_T, help="Skip the tokenizer; requests give input_ids and get output_ids.")),
    (("--load-format",), dict(type=_S, choices=LOAD_FORMAT_CHOICES, help="Weight format. 'dummy' initialises random weights (profiling); 'gguf' reads a GGUF file.")),
    (("--trust-remote-code",), dict(action=_T, help="Allow custom models defined on the Hub in their own modeling files.")),
    (("--context-length",), dict(type=_I, help="The model's maximum context length (default: from config.json).")),
    (("--is-embedding",), dict(action=_T, help="Use a CausalLM as an embedding model (not supported).")),
    # HTTP server
    (("--host",), dict(type=_S, help="The host of the HTTP server.")),
    (("--port",), dict(type=_I, help="The port of the HTTP server.")),
    (("--skip-server-warmup",), dict(action=_T, help="Skip the warmup request.")),
    (("--nccl-port",), dict(type=_I, help="The port for torch.distributed setup (default: a random free port).")),
    # Data types
    (("--dtype",), dict(type=_S, choices=DTYPE_CHOICES, help="Weights/activations dtype. 'auto': FP16 for FP32/FP16 checkpoints, BF16 for BF16 ones; float32 on CPU.")),
    (("--quantization",), dict(type=_S, choices=QUANTIZATION_CHOICES, help="The quantization method (only gguf is supported).")),
    (("--kv-cache-dtype",), dict(type=_S, choices=KV_CACHE_DTYPE_CHOICES, help="KV cache dtype; 'auto' uses the model dtype.")),
    # Memory and scheduling
    (("--mem-fraction-static",), dict(type=_F, help="Fraction of device memory for model weights plus KV cache pool.")),
    (("--max-running-requests",), dict(type=_I, help="The maximum number of running requests.")),
    (("--max-queued-requests",), dict(type=_I, help="The maximum number of queued requests; more are aborted.")),
    (("--max-total-tokens",), dict(type=_I, help="The maximum number of tokens in the KV memory pool.")),
    (("--chunked-prefill-size",), dict(type=_I, help="Max tokens in a chunk of chunked prefill; -1 disables chunking.")),
    (("--max-prefill-tokens",), dict(type=_I, help="The maximum number of tokens in a prefill batch.")),
    (("--schedule-policy",), dict(type=_S, choices=SCHEDULE_POLICY_CHOICES, help="The scheduling policy of the requests.")),
    (("--schedule-conservativeness",), dict(type=_F, help="Larger is more conservative; raise it if requests are retracted often.")),
    (("--page-size",), dict(type=_I, help="The number of tokens in a KV page.")),
    (("--radix-eviction-policy",), dict(type=_S, choices=RADIX_EVICTION_POLICY_CHOICES, help="Radix tree eviction: lru or lfu.")),
    # Runtime
    (("--device",), dict(type=_S, help="'cuda' or 'cpu' (default: cuda if available).")),
    (("--tp-size", "--tensor-parallel-size"), dict(type=_I, help="The tensor parallelism size.")),
    (("--pp-size", "--pipeline-parallel-size"), dict(type=_I, help="The pipeline parallelism size (only 1 is supported).")),
    (("--stream-interval",), dict(type=_I, help="Stream every N tokens; the first token is always immediate.")),
    (("--stream-output",), dict(action=_T, help="Output as a sequence of disjoint segments.")),
    (("--random-seed",), dict(type=_I, help="The random seed (default: random).")),
    (("--watchdog-timeout",), dict(type=_F, help="Crash if one forward batch takes longer than this many seconds.")),
    (("--dist-timeout",), dict(type=_I, help="Timeout in seconds for torch.distributed initialization.")),
    (("--base-gpu-id",), dict(type=_I, help="The first GPU id to use.")),
    (("--gpu-id-step",), dict(type=_I, help="The delta between consecutive GPU ids.")),
    # Logging and metrics
    (("--log-level",), dict(type=_S, help="The logging level of all loggers.")),
    (("--log-level-http",), dict(type=_S, help="The logging level of the HTTP server (default: --log-level).")),
    (("--log-requests",), dict(action=_T, help="Log metadata, inputs and outputs of all requests.")),
    (("--log-requests-level",), dict(type=_I, choices=[0, 1, 2, 3], help="0: metadata, 1: + sampling params, 2: + partial input/output, 3: everything.")),
    (("--decode-log-interval",), dict(type=_I, help="Log decode statistics every N decode batches.")),
    (("--gc-warning-threshold-secs",), dict(type=_F, help="Log a warning for each garbage collection in the HTTP process slower than this (0 disables).")),
    (("--enable-metrics",), dict(action=_T, help="Expose Prometheus metrics at /metrics.")),
    # API
    (("--api-key",), dict(type=_S, help="Require 'Authorization: Bearer <key>' on every non-health request.")),
    (("--served-model-name",), dict(type=_S, help="The model name returned by /v1/models (default: the model path).")),
    (("--weight-version",), dict(type=_S, help="Version identifier of the model weights.")),
    (("--chat-template",), dict(type=_S, help="Builtin chat template name or template file path.")),
    (("--completion-template",), dict(type=_S, help="Builtin completion template name or file path.")),
    (("--multi-item-scoring-delimiter",), dict(type=_I, help="Token id joining query and items in one sequence for /v1/score (multi-item scoring).")),
    (("--enable-cache-report",), dict(action=_T, help="Report cached tokens in usage.prompt_tokens_details.")),
    (("--reasoning-parser",), dict(type=_S, choices=SGLANG_REASONING_PARSERS, help=f"Reasoning parser (reasoning_content); implemented: {list(REASONING_PARSERS)}.")),
    (("--tool-call-parser",), dict(type=_S, choices=SGLANG_TOOL_CALL_PARSERS, help=f"Tool-call parser (tool_calls); implemented: {list(TOOL_CALL_PARSERS)}.")),
    (("--sampling-defaults",), dict(type=_S, choices=SAMPLING_DEFAULTS_CHOICES, help="'model' takes default sampling params from generation_config.json.")),
    # Data parallelism and multi-node
    (("--dp-size", "--data-parallel-size"), dict(type=_I, help="The data parallelism size.")),
    (("--load-balance-method",), dict(type=_S, choices=LOAD_BALANCE_METHOD_CHOICES, help="How the DP controller picks a rank.")),
    (("--dist-init-addr", "--nccl-init-addr"), dict(type=_S, help="host:port of node 0 for torch.distributed.")),
    (("--nnodes",), dict(type=_I, help="The number of nodes.")),
    (("--node-rank",), dict(type=_I, help="The node rank.")),
    # Overrides
    (("--json-model-override-args",), dict(type=_S, help="JSON dict overriding model config fields.")),
    (("--preferred-sampling-params",), dict(type=_S, help="JSON sampling params merged under each request's.")),
    # LoRA and speculative decoding (accepted, not supported)
    (("--enable-lora",), dict(action=_T, help="Enable LoRA (not supported).")),
    (("--lora-paths",), dict(type=_S, nargs="*", help="LoRA adapters (not supported).")),
    (("--max-lora-rank",), dict(type=_I, help="Maximum LoRA rank (not supported).")),
    (("--max-loras-per-batch",), dict(type=_I, help="Maximum adapters per batch (not supported).")),
    (("--speculative-algorithm",), dict(type=_S, choices=SPECULATIVE_ALGORITHM_CHOICES, help="Speculative decoding (not supported).")),
    (("--speculative-draft-model-path", "--speculative-draft-model"), dict(type=_S, help="Draft model (not supported).")),
    (("--speculative-num-steps",), dict(type=_I, help="Draft steps (not supported).")),
    (("--speculative-eagle-topk",), dict(type=_I, help="EAGLE top-k (not supported).")),
    (("--speculative-num-draft-tokens",), dict(type=_I, help="Draft tokens (not supported).")),
    # Kernel backends
    (("--attention-backend",), dict(type=_S, choices=ATTENTION_BACKEND_CHOICES, help="Attention kernels (torch_native, flashinfer, triton are implemented).")),
    (("--prefill-attention-backend",), dict(type=_S, choices=ATTENTION_BACKEND_CHOICES, help="Prefill attention kernels (priority over --attention-backend).")),
    (("--decode-attention-backend",), dict(type=_S, choices=ATTENTION_BACKEND_CHOICES, help="Decode attention kernels (priority over --attention-backend).")),
    (("--triton-attention-num-kv-splits",), dict(type=_I, help="Key/value splits of the Triton decode kernel (each request's keys are read by this many programs, then merged).")),
    (("--sampling-backend",), dict(type=_S, choices=SAMPLING_BACKEND_CHOICES, help="Sampling kernels.")),
    (("--grammar-backend",), dict(type=_S, choices=GRAMMAR_BACKEND_CHOICES, help="Grammar-guided decoding backend.")),
    (("--constrained-json-disable-any-whitespace",), dict(action=_T, help="(xgrammar) Compact JSON: no free whitespace between JSON tokens.")),
    # Optimizations
    (("--disable-radix-cache",), dict(action=_T, help="Disable prefix caching (use ChunkCache).")),
    (("--enable-hierarchical-cache",), dict(action=_T, help="Hierarchical (host) KV cache (not supported).")),
    (("--cuda-graph-max-bs",), dict(type=_I, help="The maximum batch size captured in a CUDA graph.")),
    (("--cuda-graph-bs",), dict(type=_I, nargs="+", help="The batch sizes captured in CUDA graphs.")),
    (("--disable-cuda-graph",), dict(action=_T, help="Disable CUDA graphs.")),
    (("--disable-cuda-graph-padding",), dict(action=_T, help="Capture every size; use a graph only on an exact batch size.")),
    (("--disable-overlap-schedule",), dict(action=_T, help="Disable overlapping the CPU scheduler with the device worker.")),
    (("--enable-mixed-chunk",), dict(action=_T, help="Mix prefill chunks with running decodes in one batch.")),
    (("--enable-dp-attention",), dict(action=_T, help="DP attention with TP FFN (not supported).")),
    (("--enable-torch-compile",), dict(action=_T, help="torch.compile the model (not supported).")),
    (("--torch-compile-max-bs",), dict(type=_I, help="The maximum batch size for torch.compile.")),
    (("--disable-custom-all-reduce",), dict(action=_T, help="Use NCCL all-reduce only (mini-sglang always does).")),
    (("--allow-auto-truncate",), dict(action=_T, help="Truncate over-long inputs instead of returning an error.")),
    (("--enable-return-hidden-states",), dict(action=_T, help="Allow returning hidden states with responses.")),
    (("--enable-deterministic-inference",), dict(action=_T, help="Deterministic inference: seeded per-request sampling.")),
    (("--config",), dict(type=_S, help="A YAML file of flags (keys are flag names); the command line wins.")),
]  # fmt: skip


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Declare every ServerArgs flag on `parser`, defaults taken from the dataclass."""
    from mini_sglang.server_args import ServerArgs

    for names, kwargs in _FLAGS:
        dest = names[0].lstrip("-").replace("-", "_")
        parser.add_argument(*names, dest=dest, **kwargs)
    parser.set_defaults(
        **{
            f.name: f.default
            for f in dataclasses.fields(ServerArgs)
            if f.init and f.default is not dataclasses.MISSING
        }
    )


def from_cli_args(args: argparse.Namespace) -> ServerArgs:
    """Build (and resolve) a ServerArgs from a parsed namespace; extra attributes are ignored."""
    from mini_sglang.server_args import ServerArgs

    names = [f.name for f in dataclasses.fields(ServerArgs) if f.init]
    return ServerArgs(**{n: getattr(args, n) for n in names if hasattr(args, n)})


def config_to_argv(config: dict[str, Any]) -> list[str]:
    """YAML mapping -> argv: true booleans become bare flags, lists become nargs, dicts JSON."""
    argv: list[str] = []
    for key, value in config.items():
        flag = "--" + str(key).replace("_", "-")
        if value is None or value is False:
            continue  # store_true flags cannot be turned off; None means "default"
        if value is True:
            argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *(str(v) for v in value)] if value else []
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv


def merge_config_into_argv(argv: list[str]) -> list[str]:
    """Replace `--config FILE` (or `--config=FILE`) with FILE's flags, placed before the CLI's.

    argparse keeps the last occurrence of a flag, so the command line wins over the file.
    """
    idx = [i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config=")]
    if not idx:
        return list(argv)
    if len(idx) > 1:
        raise ValueError("--config: only one config file may be given")
    i = idx[0]
    if argv[i] == "--config":
        if i + 1 >= len(argv):
            raise ValueError("--config: no config file given after the flag")
        path, rest = argv[i + 1], argv[:i] + argv[i + 2 :]
    else:
        path, rest = argv[i].split("=", 1)[1], argv[:i] + argv[i + 1 :]
    if not path.lower().endswith((".yaml", ".yml")):
        raise ValueError(f"--config: the config file must be YAML (.yaml/.yml), got {path!r}")
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ValueError(f"--config: config file not found: {path}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ValueError(f"--config: {path} must hold a mapping of flag names to values")
    return config_to_argv(data) + rest


def prepare_server_args(argv: list[str]) -> ServerArgs:
    """Parse `argv` (typically sys.argv[1:]) into a resolved ServerArgs, as SGLang does."""
    parser = argparse.ArgumentParser(prog="python -m mini_sglang.launch_server")
    add_cli_args(parser)
    return from_cli_args(parser.parse_args(merge_config_into_argv(argv)))
