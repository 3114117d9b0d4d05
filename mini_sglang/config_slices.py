"""Typed slices of ServerArgs for the layers below the scheduler.

The model runner, its attention backends and the grammar backend each get a small frozen
dataclass holding only the launch settings they use, built here from a resolved
`ServerArgs` (the one place that knows both sides). The scheduler and TpModelWorker keep
the whole ServerArgs and hand the slices down:

    ServerArgs -> ModelRunnerConfig (with AttentionConfig) -> ModelRunner, CudaGraphRunner,
                                                              attention backend factories
    ServerArgs -> GrammarConfig -> create_grammar_backend

Field names are ServerArgs' (SGLang's flag names), so a slice field greps to its flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini_sglang.server_args import ServerArgs


@dataclass(frozen=True)
class AttentionConfig:
    """Which attention backends run (None: the runner's default for its device) and the
    Triton backend's split count."""

    attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    decode_attention_backend: str | None = None
    triton_attention_num_kv_splits: int = 8

    @classmethod
    def from_server_args(cls, server_args: ServerArgs) -> AttentionConfig:
        return cls(
            attention_backend=server_args.attention_backend,
            prefill_attention_backend=server_args.prefill_attention_backend,
            decode_attention_backend=server_args.decode_attention_backend,
            triton_attention_num_kv_splits=server_args.triton_attention_num_kv_splits,
        )


@dataclass(frozen=True)
class ModelRunnerConfig:
    """What ModelRunner (weights, KV pools, sampler, CUDA graphs) needs from the launch
    flags. `quantization_param_path` is the JSON file of FP8 KV cache scales
    (model_loader/kv_cache_scales.py). `cuda_graph_bs` None means the default capture list for `cuda_graph_max_bs`;
    `cpu_offload_gb` GiB of decoder-layer weights stay in host memory (CUDA only)."""

    device: str
    load_format: str = "auto"
    random_seed: int = 0
    page_size: int = 1
    kv_cache_dtype: str = "auto"
    quantization_param_path: str | None = None
    mem_fraction_static: float = 0.88
    max_total_tokens: int | None = None
    max_running_requests: int | None = None
    sampling_backend: str = "pytorch"
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: tuple[int, ...] | None = None
    disable_cuda_graph_padding: bool = False
    cpu_offload_gb: float = 0
    attention: AttentionConfig = AttentionConfig()
    # layers/moe/expert_distribution.py: on with a mode; passes kept (-1: unbounded), set
    # by ServerArgs whenever a mode is
    expert_distribution_recorder_mode: str | None = None
    expert_distribution_recorder_buffer_size: int | None = None
    # size the per_token recorder's rows (expert_distribution_max_tokens)
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384

    @classmethod
    def from_server_args(cls, server_args: ServerArgs) -> ModelRunnerConfig:
        sa = server_args
        return cls(
            device=sa.device,
            load_format=sa.load_format,
            random_seed=sa.random_seed or 0,
            page_size=sa.page_size or 1,
            kv_cache_dtype=sa.kv_cache_dtype,
            quantization_param_path=sa.quantization_param_path,
            mem_fraction_static=sa.mem_fraction_static,
            max_total_tokens=sa.max_total_tokens,
            max_running_requests=sa.max_running_requests,
            sampling_backend=sa.sampling_backend or "pytorch",
            disable_cuda_graph=sa.disable_cuda_graph,
            cuda_graph_max_bs=sa.cuda_graph_max_bs,
            cuda_graph_bs=tuple(sa.cuda_graph_bs) if sa.cuda_graph_bs else None,
            disable_cuda_graph_padding=sa.disable_cuda_graph_padding,
            cpu_offload_gb=sa.cpu_offload_gb,
            attention=AttentionConfig.from_server_args(sa),
            expert_distribution_recorder_mode=sa.expert_distribution_recorder_mode,
            expert_distribution_recorder_buffer_size=sa.expert_distribution_recorder_buffer_size,
            chunked_prefill_size=sa.chunked_prefill_size,
            max_prefill_tokens=sa.max_prefill_tokens,
        )

    @property
    def expert_distribution_max_tokens(self) -> int:
        """The most tokens of a pass the per_token expert recorder records: SGLang's
        chunked_prefill_size x 8, or max_prefill_tokens without chunked prefill."""
        chunk = self.chunked_prefill_size
        return 8 * chunk if chunk and chunk > 0 else self.max_prefill_tokens


@dataclass(frozen=True)
class GrammarConfig:
    """--grammar-backend ("none": no constrained decoding) and its JSON whitespace rules
    (``constrained_json_whitespace_pattern`` is read by outlines and llguidance only, as in SGLang)."""

    grammar_backend: str = "xgrammar"
    constrained_json_disable_any_whitespace: bool = False
    constrained_json_whitespace_pattern: str | None = None

    @classmethod
    def from_server_args(cls, server_args: ServerArgs) -> GrammarConfig:
        return cls(
            grammar_backend=server_args.grammar_backend or "xgrammar",
            constrained_json_disable_any_whitespace=(
                server_args.constrained_json_disable_any_whitespace
            ),
            constrained_json_whitespace_pattern=server_args.constrained_json_whitespace_pattern,
        )
