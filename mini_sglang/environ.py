"""Every environment variable mini-sglang reads, with its type, default and meaning.

This module is the only place in the package that reads `os.environ` for configuration
(tests/unit/test_environ.py enforces it). Each variable is an `EnvVar` attribute of
`Envs`, named exactly as the variable; read it with `envs.NAME.get()`:

    from mini_sglang.environ import envs
    RETRACT_DECODE_STEPS = envs.SGLANG_RETRACT_DECODE_STEPS.get()

`get()` reads the environment at the moment it is called, so *when* a caller reads a
variable is the caller's choice: module-level constants read it once at import (a server
subprocess sees what its parent set before starting it), function bodies read it per call.
An unset variable gives the default; a set one is parsed by the variable's type, and a
value that does not parse raises ValueError naming the variable.

SGLANG_* names are SGLang 0.5.4's (same meaning and default); MINI_SGLANG_* names are
mini-sglang's own switches, mostly for A/B measurements of kernels. docs/environment.md
holds the table `python -m mini_sglang.environ` prints.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class EnvVar(Generic[T]):
    """One environment variable: `get()` -> the parsed value, or `default` when unset."""

    type_name = "str"

    def __init__(self, default: T, doc: str) -> None:
        self.default = default
        self.doc = doc
        self.name = ""  # set by __set_name__: the attribute name is the variable's name

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def parse(self, raw: str) -> T:
        """The value of a set variable (the raw string for EnvStr)."""
        return raw  # type: ignore[return-value]

    def is_set(self) -> bool:
        """True if the variable is present in the environment (even if empty)."""
        return self.name in os.environ

    def get(self) -> T:
        """The parsed value of the variable now, or the default when it is unset."""
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as e:
            raise ValueError(f"{self.name}={raw!r}: {e}") from e


class EnvStr(EnvVar[Any]):
    """A string, used as given (an empty value is returned as the empty string)."""


class EnvInt(EnvVar[int]):
    type_name = "int"

    def parse(self, raw: str) -> int:
        return int(raw)


class EnvFloat(EnvVar[float]):
    type_name = "float"

    def parse(self, raw: str) -> float:
        return float(raw)


class EnvBool(EnvVar[Any]):
    """True iff the value, lower-cased, is one of `true_values`; any other value is False."""

    type_name = "bool"

    def __init__(self, default: bool | None, doc: str, true_values: tuple[str, ...]) -> None:
        super().__init__(default, doc)
        self.true_values = true_values

    def parse(self, raw: str) -> bool:
        return raw.lower() in self.true_values


def _flag(doc: str) -> EnvBool:
    """A switch that is on only when the variable is exactly "1"."""
    return EnvBool(False, doc, ("1",))


class Envs:
    """The registry: one attribute per variable, grouped by the component that reads it."""

    # Scheduling (SGLang's names and defaults)
    SGLANG_INIT_NEW_TOKEN_RATIO = EnvFloat(
        0.7, "Initial new_token_ratio (KV expected per running request) before conservativeness."
    )
    SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = EnvFloat(
        0.14, "The floor new_token_ratio decays to, as a fraction of the initial ratio."
    )
    SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = EnvInt(
        600, "Decode steps over which new_token_ratio decays from initial to floor."
    )
    SGLANG_RETRACT_DECODE_STEPS = EnvInt(
        20, "Decode steps of headroom a retraction frees KV for, per remaining request."
    )
    SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION = EnvInt(
        4096, "Cap on a request's max_new_tokens when estimating its future KV use."
    )
    # Detokenizer and HTTP server
    SGLANG_DETOKENIZER_MAX_STATES = EnvInt(
        1 << 16, "Most requests the detokenizer keeps incremental state for."
    )
    SGLANG_HEALTH_CHECK_TIMEOUT = EnvFloat(
        20.0, "Seconds /health_generate waits for scheduler output before answering 503."
    )
    # Profiling
    SGLANG_TORCH_PROFILER_DIR = EnvStr(
        "/tmp", "Directory for torch profiler traces when /start_profile names none."
    )
    SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR = EnvStr(
        "/tmp", "Directory /dump_expert_distribution_record writes its .pt file into."
    )
    SGLANG_PROFILE_WITH_STACK = EnvBool(
        True,
        "true/1: record Python stacks in profiles; any other value turns them off.",
        ("true", "1"),
    )
    # Attention kernels
    SGLANG_FLASHINFER_USE_TENSOR_CORE = EnvBool(
        None,
        "true/false forces flashinfer's tensor-core decode (unset: from GQA group 4 up).",
        ("true",),
    )
    MINI_SGLANG_TENSOR_CORE_DECODE_MAX_BS = EnvInt(
        1_000_000_000, "Largest decode batch that uses flashinfer's tensor-core decode."
    )
    MINI_SGLANG_TRITON_DECODE_MAX_BS = EnvInt(
        32,
        "Decode batches up to this size use the Triton split-KV kernel over flashinfer (0: off).",
    )
    MINI_SGLANG_TRITON_DECODE_KV_SPLITS = EnvInt(
        16, "Key splits a request of those small decode batches is cut into (>= 1)."
    )
    MINI_SGLANG_XQA_DECODE = EnvBool(
        True,
        "0: flashinfer decode over an FP8 e4m3 pool with pages of 16-128 runs its BatchDecode "
        "wrapper instead of the XQA kernel (FP8 tensor-core math, sm90+), and --kv-cache-dtype "
        "fp8_e4m3 keeps the default pages of 1.",
        ("1", "true"),
    )
    MINI_SGLANG_DISABLE_DECODE_FROM_QKV = _flag(
        "1: Triton decode runs the separate RoPE/KV-store kernel instead of the fused one."
    )
    # Fused and small-batch kernels
    MINI_SGLANG_DISABLE_FLASHINFER_OPS = _flag(
        "1: use the Triton/torch norm, activation and sampling ops even if flashinfer is installed."
    )
    MINI_SGLANG_DISABLE_BACKGROUND_FLASHINFER_BUILD = _flag(
        "1: flashinfer's prefill and sampling modules build on first use; unset (tp 1): they "
        "compile in the background after graph capture while Triton prefill and torch "
        "sampling serve."
    )
    MINI_SGLANG_DISABLE_PDL = _flag("1: never launch kernels as programmatic dependents (PDL).")
    MINI_SGLANG_DISABLE_FUSED_QK_ROPE = _flag(
        "1: run QK-norm, RoPE and the KV store as separate kernels in attention layers."
    )
    MINI_SGLANG_DISABLE_SMALL_M_GEMM = _flag(
        "1: small-batch linear layers always use cuBLAS, never the Triton GEMV."
    )
    MINI_SGLANG_DISABLE_GEMV_SILU_FUSION = _flag("1: no SiLU-and-mul epilogue in the Triton GEMV.")
    MINI_SGLANG_DISABLE_GEMV_NORM_FUSION = _flag("1: no RMSNorm prologue in the Triton GEMV.")
    MINI_SGLANG_DISABLE_GEMV_MLP_NORM_FOLD = _flag(
        "1: the post-attention RMSNorm stays a kernel where a persistent gate_up GEMV could fold it."
    )
    MINI_SGLANG_GEMV_PDL_CREDIT_US = EnvFloat(
        1.0, "Microseconds of credit a PDL-launched Triton GEMV gets when timed against cuBLAS."
    )
    MINI_SGLANG_KERNEL_RETUNE = _flag(
        "1: ignore shipped and cached kernel picks (GEMV configs) and time them again."
    )
    MINI_SGLANG_GEMV_CONFIGS = EnvStr(
        "",
        'Forced GEMV picks per weight shape, e.g. "4096x4096:4,2048,4,2;28672x4096:cublas" '
        "(entries separated by ';' or '/'); an integer-decoding config (kind 3) applies to "
        "FP8 weights only, for block-wise FP8 weights 'cublas' selects their own GEMV, and a "
        "dense-down config (BLOCK_N,BLOCK_K,warps,0,4) runs per-channel FP8 weights on the "
        "expert down kernel, their input norm and SiLU-mul unfused.",
    )
    MINI_SGLANG_DISABLE_FP8_CHANNEL_DENSE = _flag(
        "1: per-channel FP8 GEMVs at 3-4 rows keep their timed picks (by default those "
        "of weights up to 12 MiB run the expert down kernel, their input norm unfused)."
    )
    MINI_SGLANG_FP8_NORM_QUANT = EnvBool(
        True,
        "0: with --quantization fp8, above the GEMV's batch sizes the add-RMSNorms before qkv "
        "and gate_up and the SiLU-mul before down write bf16, and a separate kernel quantizes "
        "it per token for the FP8 GEMM (by default they write FP8 and the scales themselves).",
        ("1", "true"),
    )
    MINI_SGLANG_MOE_SMALL_M = EnvInt(
        4, "MoE batches up to this many tokens run the two-kernel expert GEMV path (0: off)."
    )
    MINI_SGLANG_FP8_GEMV_INT_DECODE = EnvBool(
        True,
        "0: the expert GEMVs and block_fp8_gemv convert FP8 weights with Triton's float8 "
        "cast (by default they read them as int32 words decoded with integer ops).",
        ("1", "true"),
    )
    MINI_SGLANG_MOE_GEMV_TILES = EnvStr(
        "",
        "Forced MoE expert-GEMV tiles per batch bucket, for experiments: entries "
        "\"bucket=gate_up[:down]\" separated by ';' or '/', each tile \"block_n,block_k,warps"
        '[,stages]" (stages 0: Triton\'s default), e.g. "1=4,512,4:4,256,8".',
    )
    MINI_SGLANG_MOE_CONFIG_DIR = EnvStr(
        "",
        "A folder of tuned fused-MoE kernel configs (benchmarks/tune_fused_moe.py --out-dir), "
        "looked up before those shipped in mini_sglang/layers/moe/configs/.",
    )
    # Multimodal inputs (TokenizerManager)
    SGLANG_IO_WORKERS = EnvInt(4, "Threads that load and preprocess images of requests.")
    MINI_SGLANG_MAX_IMAGE_BYTES = EnvInt(
        32 << 20, "Largest image (file, URL download or decoded base64) in bytes."
    )
    MINI_SGLANG_MAX_IMAGE_PIXELS = EnvInt(
        8192 * 8192, "Largest image in pixels (width x height) after decoding."
    )
    MINI_SGLANG_IMAGE_FETCH_TIMEOUT = EnvFloat(10.0, "Seconds an image URL fetch may take.")
    MINI_SGLANG_MAX_IMAGES_PER_REQUEST = EnvInt(
        16, "Most images one prompt may carry (a model may accept fewer)."
    )
    # Model config (ModelConfig)
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN = EnvBool(
        False,
        "true/1/yes/y: --context-length may exceed the model's derived length (with a warning).",
        ("true", "1", "yes", "y"),
    )
    # Memory and files
    MINI_SGLANG_CPU_KV_CACHE_GB = EnvFloat(2.0, "GiB of KV cache on --device cpu.")
    SGLANG_DEBUG_MEMORY_POOL = EnvBool(
        False,
        "true/1: the KV allocator checks every free (double frees, paged frees that are not a "
        "page-aligned range) and allocation on the host; slow, for tests and debugging.",
        ("true", "1"),
    )
    MINI_SGLANG_CACHE_DIR = EnvStr(
        None, "Cache for the converted default model (unset or empty: ~/.cache/mini_sglang)."
    )
    # Tests
    MINI_SGLANG_TEST_FAIL_PREPARE_RID = EnvStr(
        None, "Test hook: preparing the batch's sampling of the request with this rid raises."
    )
    # Cloud and benchmark clients (their platforms' names)
    AIP_PREDICT_ROUTE = EnvStr(
        "/vertex_generate", "Path of the Vertex AI prediction route (set by Vertex AI)."
    )
    OPENAI_API_KEY = EnvStr(None, "bench_serving sends it as 'Authorization: Bearer <key>'.")
    API_KEY = EnvStr(None, "bench_serving sends it as the raw Authorization header.")

    def __iter__(self) -> Iterator[EnvVar[Any]]:
        for value in vars(type(self)).values():
            if isinstance(value, EnvVar):
                yield value


envs = Envs()


def _show_default(var: EnvVar[Any]) -> str:
    if var.default is None:
        return "unset"
    if isinstance(var, EnvBool) and var.true_values == ("1",) and var.default is False:
        return "unset (off)"
    return f"`{var.default!r}`" if isinstance(var.default, str) else f"`{var.default}`"


def markdown_table(render: Callable[[EnvVar[Any]], str] = _show_default) -> str:
    """The registry as a Markdown table (name, type, default, meaning), in registry order."""
    lines = ["| Variable | Type | Default | Meaning |", "|---|---|---|---|"]
    for var in envs:
        lines.append(f"| `{var.name}` | {var.type_name} | {render(var)} | {var.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
