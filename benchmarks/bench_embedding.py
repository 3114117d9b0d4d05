"""Embedding throughput: mini-sglang's embedding path beside HF transformers, same inputs.

    python benchmarks/bench_embedding.py [--model qwen3-0.6b,bert-base] [--device cuda] \
        [--batch-sizes 1,64] [--min-len 32] [--max-len 512] [--num-inputs 256] \
        [--num-layers N] [--arms ours,hf] [--out results.jsonl]

Both arms embed the same random token-id inputs (lengths uniform in [min-len, max-len],
seed 0; capped below an encoder's position table) with dummy weights of the named
architecture (`benchmarks/models/NAME/config.json`, or BERT-base's published config for
`bert-base`; `--num-layers` shrinks it for a CPU run) and the same pooling: the last token's
state, L2-normalized (Qwen3-Embedding's, and SGLang's default for BertModel). `--model`
takes a comma-separated list, run one after the other. "Batch B" means the inputs are submitted B at a time and
each group is finished before the next starts.

- ours: the real in-process Scheduler with `--is-embedding` (tokenizer skipped, ids given),
  so scheduling, the KV pool and the pooler are all timed, but no HTTP.
- hf: transformers' AutoModel on right-padded batches with an attention mask (sdpa), the
  last non-pad row of each input pooled and normalized.

Each arm runs one untimed group first. Printed per arm and batch size: inputs/s and
(input) tokens/s; `--out` appends one JSON line per row. MODELS maps a name to its config
builder, the place to add another architecture's arm (an encoder runs the same two arms).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def decoder_config(name: str, num_layers: int | None) -> dict[str, Any]:
    """A benchmark decoder's config.json, as an embedder (--is-embedding)."""
    with open(os.path.join(HERE, "models", name, "config.json")) as f:
        cfg = json.load(f)
    if num_layers:
        cfg["num_hidden_layers"] = num_layers
    return cfg


def bert_base_config(name: str, num_layers: int | None) -> dict[str, Any]:
    """BERT-base (bge-base's shape): a non-causal encoder, BertModel."""
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_hidden_layers": num_layers or 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "hidden_act": "gelu",
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
    }


# name -> (config builder, extra ServerArgs for our arm)
MODELS: dict[str, tuple[Callable[[str, int | None], dict], dict[str, Any]]] = {
    "qwen3-0.6b": (decoder_config, {"is_embedding": True}),
    "bert-base": (bert_base_config, {}),
}


def make_inputs(n: int, min_len: int, max_len: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [
        [rng.randrange(1000, vocab - 1000) for _ in range(rng.randint(min_len, max_len))]
        for _ in range(n)
    ]


def groups(inputs: list[list[int]], batch: int) -> list[list[list[int]]]:
    return [inputs[i : i + batch] for i in range(0, len(inputs), batch)]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_ours(
    model_dir: str, inputs, batch: int, args, extra: dict[str, Any], max_len: int
) -> float:
    """Seconds for all inputs through the in-process Scheduler, `batch` at a time."""
    from mini_sglang.managers.io_struct.generate import TokenizedEmbeddingReqInput
    from mini_sglang.managers.scheduler import Scheduler
    from mini_sglang.sampling.sampling_params import SamplingParams
    from mini_sglang.server_args import ServerArgs

    server_args = ServerArgs(
        model_path=model_dir,
        device=args.device,
        dtype=args.dtype,
        load_format="dummy",
        skip_tokenizer_init=True,
        max_total_tokens=batch * max_len + 4096,
        max_running_requests=max(batch, 8),
        random_seed=0,
        **extra,
    )
    outputs: list[Any] = []
    sched = Scheduler(server_args, send_to_detokenizer=outputs.append)

    def run(group: list[list[int]], tag: str) -> None:
        for i, ids in enumerate(group):
            sp = SamplingParams(max_new_tokens=0)
            sp.normalize(None)
            sched.add_request(TokenizedEmbeddingReqInput(f"{tag}{i}", "", ids, sp))
        sched.run_until_idle()

    run(groups(inputs, batch)[0], "warm")
    sched.flush_cache()  # the timed inputs must not hit the warm-up's cached prefixes
    sync(args.device)
    start = time.perf_counter()
    for k, group in enumerate(groups(inputs, batch)):
        run(group, f"g{k}-")
    sync(args.device)
    elapsed = time.perf_counter() - start
    done = sum(len(m.rids) for m in outputs)
    assert done == len(inputs) + len(groups(inputs, batch)[0]), done
    return elapsed


@torch.no_grad()
def run_hf(model_dir: str, inputs, batch: int, args) -> float:
    """Seconds for all inputs through transformers' AutoModel, `batch` at a time."""
    from transformers import AutoConfig, AutoModel

    cfg = AutoConfig.from_pretrained(model_dir)
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else torch.float32
    model = AutoModel.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    model = model.to(args.device).eval()

    def run(group: list[list[int]]) -> torch.Tensor:
        n = max(len(x) for x in group)
        ids = torch.zeros(len(group), n, dtype=torch.long)
        mask = torch.zeros(len(group), n, dtype=torch.long)
        for i, x in enumerate(group):
            ids[i, : len(x)] = torch.tensor(x)
            mask[i, : len(x)] = 1
        ids, mask = ids.to(args.device), mask.to(args.device)
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        last = hidden[torch.arange(len(group), device=hidden.device), mask.sum(1) - 1]
        return torch.nn.functional.normalize(last.float(), dim=-1).cpu()

    run(groups(inputs, batch)[0])
    sync(args.device)
    start = time.perf_counter()
    for group in groups(inputs, batch):
        run(group)
    sync(args.device)
    return time.perf_counter() - start


def run_model(name: str, args) -> None:
    """Both arms on model `name` at every batch size; prints (and appends) one row each."""
    build, extra = MODELS[name]
    cfg = build(name, args.num_layers)
    # An encoder's absolute positions stop at max_position_embeddings - 1 (and the server
    # keeps one position spare): cap the lengths there.
    max_len = min(args.max_len, cfg.get("max_position_embeddings", args.max_len + 2) - 2)
    min_len = min(args.min_len, max_len)
    with tempfile.TemporaryDirectory() as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(cfg, f)
        inputs = make_inputs(args.num_inputs, min_len, max_len, cfg["vocab_size"])
        tokens = sum(len(x) for x in inputs)
        print(
            f"model={name} layers={cfg['num_hidden_layers']} device={args.device} "
            f"dtype={args.dtype} inputs={len(inputs)} tokens={tokens} "
            f"len=[{min_len},{max_len}]"
        )
        print(f"{'arm':<6}{'batch':>6}{'inputs/s':>12}{'tokens/s':>12}{'seconds':>10}")
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            for arm in args.arms.split(","):
                if arm == "ours":
                    sec = run_ours(model_dir, inputs, batch, args, extra, max_len)
                elif arm == "hf":
                    sec = run_hf(model_dir, inputs, batch, args)
                else:
                    raise SystemExit(f"unknown arm {arm!r} (ours, hf)")
                row = {
                    "model": name,
                    "arm": arm,
                    "batch": batch,
                    "device": args.device,
                    "dtype": args.dtype,
                    "layers": cfg["num_hidden_layers"],
                    "inputs_per_s": len(inputs) / sec,
                    "tokens_per_s": tokens / sec,
                    "seconds": sec,
                }
                print(
                    f"{arm:<6}{batch:>6}{row['inputs_per_s']:>12.1f}"
                    f"{row['tokens_per_s']:>12.0f}{sec:>10.2f}"
                )
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="qwen3-0.6b", help=f"comma-separated: {sorted(MODELS)}")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--batch-sizes", default="1,64")
    p.add_argument("--min-len", type=int, default=32)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--num-inputs", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=None, help="shrink the model (CPU runs)")
    p.add_argument("--arms", default="ours,hf")
    p.add_argument("--out", default=None, help="append one JSON line per result")
    args = p.parse_args()
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    names = args.model.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; have {sorted(MODELS)}")
    for name in names:
        run_model(name, args)


if __name__ == "__main__":
    main()
