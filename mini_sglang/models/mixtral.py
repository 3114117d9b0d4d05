"""MixtralForCausalLM (Mixtral-8x7B, 8x22B): Llama/Mistral attention with every layer a
sparse-MoE block (top-2 of 8, always renormalised).

Mixtral checkpoints name the block `block_sparse_moe` and an expert's gate, down and up
projections w1, w2 and w3; the shared decoder calls the block `mlp`, so names are mapped on
load. (sliding_window is ignored, as for Mistral: the published Mixtral configs set none.)
"""

from __future__ import annotations

from mini_sglang.models.sparse_moe import MoeForCausalLM


class MixtralForCausalLM(MoeForCausalLM):
    expert_proj_names = ("w1", "w2", "w3")

    def checkpoint_name(self, name: str) -> str:
        return name.replace(".block_sparse_moe.", ".mlp.")
