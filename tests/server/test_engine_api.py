"""The offline Engine API (`mini_sglang.Engine`): same subprocesses as the server, no HTTP.

Outputs must equal the HTTP server's for the same greedy requests, and shutdown (explicit
or through the context manager) must leave no child process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import json
import logging
from collections.abc import Iterator

import psutil
import pytest

import mini_sglang
from mini_sglang.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor
from tests.server.conftest import EOS_PROMPT, ServerHandle, TinyModel

PROMPTS = ["Hello world, this is", "The weather today", EOS_PROMPT]
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
BAN = DisallowedTokensLogitsProcessor.to_str()


def _children() -> set[int]:
    """This process's live descendants, except multiprocessing's resource tracker: that is
    a process-wide singleton (started by the first spawn, shared with any other user code)
    that exits with the interpreter, so an Engine must not kill it."""
    pids = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.is_running() and "resource_tracker" not in " ".join(p.cmdline()):
                pids.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def _assert_gone(pids: set[int]) -> None:
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=10)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"engine children still alive: {alive}"


@pytest.fixture(scope="module")
def engine(tiny_model: TinyModel) -> Iterator[mini_sglang.Engine]:
    before = _children()
    eng = mini_sglang.Engine(model_path=tiny_model.path, max_total_tokens=4096)
    eng._test_child_pids = _children() - before  # type: ignore[attr-defined]
    yield eng
    eng.shutdown()


def test_generate_single_matches_http(engine, server: ServerHandle):
    out = engine.generate(EOS_PROMPT, GREEDY)
    http = server.post("/generate", json={"text": EOS_PROMPT, "sampling_params": GREEDY}).json()
    assert list(out) == ["text", "output_ids", "meta_info"]
    assert out["text"] == http["text"]
    assert out["output_ids"] == http["output_ids"]
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert list(out["meta_info"]) == list(http["meta_info"])


def test_encode_and_rerank_on_a_generation_model_are_refused(engine):
    from mini_sglang.managers.input_checks import NOT_AN_EMBEDDING_MODEL

    with pytest.raises(ValueError, match="does not appear to be an embedding model"):
        engine.encode("hello")
    with pytest.raises(ValueError) as e:
        engine.encode(input_ids=[[1, 2], [3]])
    assert str(e.value) == NOT_AN_EMBEDDING_MODEL
    with pytest.raises(ValueError) as e:
        engine.rerank([["a query", "a document"]])
    assert str(e.value) == NOT_AN_EMBEDDING_MODEL
    with pytest.raises(ValueError, match=r"\[query, document\] pairs"):
        engine.rerank([["only a query"]])


def test_generate_batch_dict_and_list_params(engine, server: ServerHandle):
    http = server.post("/generate", json={"text": PROMPTS, "sampling_params": GREEDY}).json()
    outs = engine.generate(PROMPTS, GREEDY)
    assert [o["output_ids"] for o in outs] == [h["output_ids"] for h in http]
    assert [o["text"] for o in outs] == [h["text"] for h in http]
    # Per-prompt sampling params as a list.
    per = [{**GREEDY, "max_new_tokens": n} for n in (2, 3, 4)]
    outs = engine.generate(PROMPTS, per)
    assert [len(o["output_ids"]) for o in outs] == [2, 3, 4]
    for o, h in zip(outs, http):
        assert h["output_ids"][: len(o["output_ids"])] == o["output_ids"]


def test_generate_input_ids_and_eos(engine, tiny_model: TinyModel):
    out = engine.generate(
        input_ids=tiny_model.eos_prompt_ids,
        sampling_params={"temperature": 0, "max_new_tokens": 10},
    )
    assert out["output_ids"] == tiny_model.greedy_ids[: tiny_model.eos_index + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": tiny_model.eos_token_id}


def test_generate_stream(engine):
    whole = engine.generate(EOS_PROMPT, GREEDY)
    chunks = list(engine.generate(EOS_PROMPT, GREEDY, stream=True))
    assert len(chunks) >= 2
    assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"]
    assert chunks[-1]["text"] == whole["text"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}


def test_async_generate(engine):
    whole = engine.generate(PROMPTS[0], GREEDY)
    loop = asyncio.get_event_loop()  # SGLang's documented pattern

    async def run() -> tuple[dict, list[dict]]:
        out = await engine.async_generate(PROMPTS[0], GREEDY)
        stream = await engine.async_generate(PROMPTS[0], GREEDY, stream=True)
        chunks = [c async for c in stream]
        return out, chunks

    out, chunks = loop.run_until_complete(run())
    assert out["output_ids"] == whole["output_ids"] and out["text"] == whole["text"]
    assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"]


def test_invalid_request_raises_value_error(engine):
    with pytest.raises(ValueError, match="temperature"):
        engine.generate("hi", {"temperature": -1})
    # Still usable afterwards.
    assert len(engine.generate("hi", {**GREEDY, "max_new_tokens": 2})["output_ids"]) == 2


def test_start_and_stop_profile_write_a_trace(engine, tmp_path):
    engine.start_profile(output_dir=str(tmp_path), profile_id="eng")
    engine.generate("hi", {**GREEDY, "max_new_tokens": 3})
    engine.stop_profile()
    (trace,) = tmp_path.glob("eng-TP-0*.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert events
    with pytest.raises(RuntimeError):
        engine.stop_profile()  # not running any more


def test_freeze_gc(engine):
    """Engine.freeze_gc freezes this process (the Engine's TokenizerManager lives here) and
    its children keep serving the same greedy outputs."""
    before = engine.generate(PROMPTS[0], GREEDY)["output_ids"]
    try:
        engine.freeze_gc()
        assert gc.get_freeze_count() > 0
        assert engine.generate(PROMPTS[0], GREEDY)["output_ids"] == before
    finally:
        gc.unfreeze()


def test_expert_distribution_record_needs_the_recorder(engine):
    """A dense model's engine has no recorder: each call raises ValueError with the flag to
    set (the counting itself: tests/server/test_expert_distribution.py), and it serves on."""
    for call in (
        engine.start_expert_distribution_record,
        engine.stop_expert_distribution_record,
        engine.dump_expert_distribution_record,
    ):
        with pytest.raises(ValueError, match="--expert-distribution-recorder-mode stat"):
            call()
    assert engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})


def test_generate_takes_sglangs_other_keywords(engine):
    """SGLang's Engine.generate keywords: data_parallel_rank generates as usual;
    image_data on a text-only model and return_hidden_states are the /generate 400s as
    ValueErrors; a keyword SGLang does not have is a TypeError."""
    plain = engine.generate(PROMPTS[0], GREEDY)["output_ids"]
    assert engine.generate(PROMPTS[0], GREEDY, data_parallel_rank=0)["output_ids"] == plain
    with pytest.raises(ValueError, match="does not accept images"):
        engine.generate(PROMPTS[0], GREEDY, image_data="x.png")
    with pytest.raises(ValueError, match="not configured to return the hidden states"):
        engine.generate(PROMPTS[0], GREEDY, return_hidden_states=True)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['tempreature'\\]"):
        engine.generate(PROMPTS[0], GREEDY, tempreature=0.5)
    with pytest.raises(ValueError, match="not configured to enable custom logit processor"):
        engine.generate(PROMPTS[0], GREEDY, custom_logit_processor=BAN)


def test_score_matches_http(engine, server: ServerHandle):
    """Engine.score is /v1/score without HTTP: same scores, and bad input is a ValueError."""
    body = {"query": "Is it", "items": [" yes", " no"], "label_token_ids": [5, 9, 100]}
    http = server.post("/v1/score", json=body)
    assert http.status_code == 200, http.text
    scores = engine.score(**body)
    for row, http_row in zip(scores, http.json()["scores"], strict=True):
        assert row == pytest.approx(http_row, rel=1e-4)
    soft = engine.score(**body, apply_softmax=True)
    assert [sum(row) for row in soft] == pytest.approx([1.0, 1.0], abs=1e-5)
    with pytest.raises(ValueError, match="label_token_ids must be provided"):
        engine.score("Is it", [" yes"])


def test_shutdown_leaves_no_children(engine):
    pids = engine._test_child_pids
    assert len(pids) >= 2, pids  # scheduler + detokenizer
    engine.shutdown()
    engine.shutdown()  # idempotent
    _assert_gone(pids)


def test_engine_as_context_manager_with_processors_and_cpu_offload(tiny_model: TinyModel, caplog):
    """One Engine, used as a context manager, with enable_custom_logit_processor and
    cpu_offload_gb (each check below would otherwise start an Engine of its own):

    - SGLang's --cpu-offload-gb keeps weights in host memory; on CPU they already are: one
      warning, then the same greedy output (transformers'), also after a weight update.
    - Engine.generate takes a custom logit processor (one, or one per prompt) and
      custom_params in the sampling params, as /generate does.
    - Leaving the `with` block shuts the Engine down with no child left behind.
    """
    before = _children()
    with caplog.at_level(logging.WARNING):
        cm = mini_sglang.Engine(
            model_path=tiny_model.path,
            max_total_tokens=2048,
            enable_custom_logit_processor=True,
            cpu_offload_gb=3,
        )
    with cm as eng:
        pids = _children() - before
        assert len(pids) >= 2
        out = eng.generate(EOS_PROMPT, GREEDY)
        assert len(out["output_ids"]) == 6

        lines = [r.getMessage() for r in caplog.records if "cpu-offload-gb" in r.getMessage()]
        assert lines == [
            "--cpu-offload-gb has no effect on CPU: weights already live in CPU memory."
        ]
        params = {**GREEDY, "max_new_tokens": len(tiny_model.greedy_ids)}
        assert eng.generate(EOS_PROMPT, params)["output_ids"] == tiny_model.greedy_ids

        plain = eng.generate(PROMPTS[0], GREEDY)["output_ids"]
        banned = {**GREEDY, "custom_params": {"token_ids": [plain[0]]}}
        out = eng.generate(PROMPTS[0], banned, custom_logit_processor=BAN)["output_ids"]
        assert out[0] != plain[0] and plain[0] not in out
        both = eng.generate(PROMPTS[:2], [banned, GREEDY], custom_logit_processor=[BAN, None])
        assert both[0]["output_ids"] == out
        assert both[1]["output_ids"] == eng.generate(PROMPTS[1], GREEDY)["output_ids"]

        ok, message = eng.update_weights_from_disk(tiny_model.path)
        assert ok, message
        assert eng.generate(EOS_PROMPT, params)["output_ids"] == tiny_model.greedy_ids
    _assert_gone(pids)
