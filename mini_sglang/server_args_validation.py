"""Which values each ServerArgs flag accepts, and the checks that enforce it.

The tables: SGLang 0.5.4's choice lists (`*_CHOICES`, also used by the argparse table in
`server_args_cli.py`), `CHOICES` (field -> allowed values), `MIN_VALUES` (field -> lower
bound) and `UNSUPPORTED_FLAGS` (field -> "this value asks for a feature mini-sglang lacks";
`ServerArgs` warns about and resets such values). The checks `validate_choices`,
`validate_ranges` and `validate_resolved` take a `ServerArgs` and raise `ValueError` naming
the flag (`--flag-name`) for an invalid value; they also normalize as SGLang does
(lower-case log levels, chunked_prefill_size <= 0 -> -1).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from mini_sglang.function_call.function_call_parser import (
    SGLANG_TOOL_CALL_PARSERS,
    TOOL_CALL_PARSERS,
)
from mini_sglang.parser.reasoning_parser import (
    REASONING_PARSERS,
    SGLANG_REASONING_PARSERS,
)

if TYPE_CHECKING:
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
MOE_RUNNER_BACKEND_CHOICES = ["auto", "deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm",
                              "flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl",
                              "cutlass"]  # fmt: skip
MOE_A2A_BACKEND_CHOICES = ["none", "deepep", "mooncake"]
EXPERT_DISTRIBUTION_RECORDER_MODE_CHOICES = ["stat", "stat_approx", "per_pass", "per_token"]
GRAMMAR_BACKEND_CHOICES = ["xgrammar", "outlines", "llguidance", "none"]
RADIX_EVICTION_POLICY_CHOICES = ["lru", "lfu"]
TOKENIZER_MODE_CHOICES = ["auto", "slow"]
LOG_LEVEL_CHOICES = ["debug", "info", "warning", "error", "critical"]
SAMPLING_DEFAULTS_CHOICES = ["openai", "model"]
SPECULATIVE_ALGORITHM_CHOICES = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]

# What mini-sglang implements; other values in SGLang's choices are reset with a warning.
SUPPORTED_ATTENTION_BACKENDS = ("torch_native", "flashinfer", "triton")
SUPPORTED_LOAD_FORMATS = ("auto", "pt", "safetensors", "dummy", "gguf")
SUPPORTED_QUANTIZATION = ("gguf", "fp8", "compressed-tensors")


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
    # gguf weights are dequantized at load; the others are layers/quantization's methods
    "quantization": lambda v: v not in (None, *SUPPORTED_QUANTIZATION),
    "load_format": lambda v: v not in SUPPORTED_LOAD_FORMATS,
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
    "schedule_policy": lambda v: v == "priority",
    "device": lambda v: v is not None and v.split(":")[0] not in ("cuda", "cpu"),
    "completion_template": _given,
    "multi_item_scoring_delimiter": _given,
    "enable_return_hidden_states": bool,
    "moe_runner_backend": lambda v: v not in ("auto", "triton"),
    "moe_a2a_backend": lambda v: v != "none",
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
    "moe_runner_backend": MOE_RUNNER_BACKEND_CHOICES,
    "moe_a2a_backend": MOE_A2A_BACKEND_CHOICES,
    "expert_distribution_recorder_mode": [None, *EXPERT_DISTRIBUTION_RECORDER_MODE_CHOICES],
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
    "tp_size": 1, "ep_size": 1, "pp_size": 1, "dp_size": 1, "page_size": 1, "stream_interval": 1,
    "max_running_requests": 1, "max_total_tokens": 1, "max_queued_requests": 1,
    "max_prefill_tokens": 1, "context_length": 1, "cuda_graph_max_bs": 1,
    "torch_compile_max_bs": 1, "nnodes": 1, "node_rank": 0, "base_gpu_id": 0,
    "gpu_id_step": 1, "dist_timeout": 1, "decode_log_interval": 1,
}  # fmt: skip


def check_arg(ok: bool, message: str) -> None:
    """Raise ValueError(message) unless `ok`."""
    if not ok:
        raise ValueError(message)


def flag_name(name: str) -> str:
    """The command-line spelling of field `name`: max_total_tokens -> --max-total-tokens."""
    return "--" + name.replace("_", "-")


def validate_choices(args: ServerArgs) -> None:
    """Check every `CHOICES` field (log levels already lower-cased)."""
    for name, choices in CHOICES.items():
        value = getattr(args, name)
        check_arg(
            value in choices,
            f"{flag_name(name)}: invalid choice {value!r}; choose from "
            f"{[c for c in choices if c is not None]}",
        )


def validate_ranges(args: ServerArgs) -> None:
    """Check bounds, ports, JSON flags and multi-node consistency."""
    for name, low in MIN_VALUES.items():
        value = getattr(args, name)
        check_arg(value is None or value >= low, f"{flag_name(name)} must be >= {low}, got {value}")
    for name in ("port", "nccl_port"):
        value = getattr(args, name)
        check_arg(
            value is None or 1 <= value <= 65535,
            f"{flag_name(name)} must be in [1, 65535], got {value}",
        )
    m = args.mem_fraction_static
    check_arg(m is None or 0 < m < 1, f"--mem-fraction-static must be in (0, 1), got {m}")
    check_arg(
        args.schedule_conservativeness >= 0,
        f"--schedule-conservativeness must be >= 0, got {args.schedule_conservativeness}",
    )
    check_arg(
        args.watchdog_timeout > 0,
        f"--watchdog-timeout must be > 0, got {args.watchdog_timeout}",
    )
    size = args.expert_distribution_recorder_buffer_size
    check_arg(
        size is None or size == -1 or size >= 1,
        f"--expert-distribution-recorder-buffer-size must be -1 (unbounded) or >= 1, got {size}",
    )
    if args.cuda_graph_bs is not None:
        check_arg(
            len(args.cuda_graph_bs) > 0 and min(args.cuda_graph_bs) >= 1,
            f"--cuda-graph-bs must be a non-empty list of sizes >= 1, got {args.cuda_graph_bs}",
        )
    check_arg(
        args.node_rank < args.nnodes,
        f"--node-rank must be < --nnodes ({args.nnodes}), got {args.node_rank}",
    )
    check_arg(
        args.tp_size * args.pp_size % args.nnodes == 0,
        f"--tp-size ({args.tp_size}) must be divisible by --nnodes ({args.nnodes})",
    )
    check_arg(
        args.tp_size % args.ep_size == 0,
        f"--tp-size ({args.tp_size}) must be divisible by --ep-size ({args.ep_size})",
    )
    check_arg(
        args.dp_size == 1 or args.nnodes == 1,
        "--dp-size > 1 across several nodes (--nnodes > 1) is not supported",
    )
    for name in ("json_model_override_args", "preferred_sampling_params"):
        text = getattr(args, name)
        if text is not None:
            try:
                check_arg(isinstance(json.loads(text), dict), "not an object")
            except ValueError as e:
                raise ValueError(
                    f"{flag_name(name)} must be a JSON object, got {text!r} ({e})"
                ) from None
    if args.dist_init_addr is not None:
        host, _, port = args.dist_init_addr.rpartition(":")
        check_arg(
            bool(host) and port.isdigit(),
            f"--dist-init-addr must be host:port, got {args.dist_init_addr!r}",
        )


def validate_resolved(args: ServerArgs) -> None:
    """Check what only holds once the "auto" defaults are resolved."""
    c = args.chunked_prefill_size
    check_arg(
        c <= 0 or c % args.page_size == 0,
        f"--chunked-prefill-size ({c}) must be divisible by --page-size ({args.page_size})",
    )
    m = args.mem_fraction_static
    check_arg(0 < m < 1, f"--mem-fraction-static must be in (0, 1), got {m}")
