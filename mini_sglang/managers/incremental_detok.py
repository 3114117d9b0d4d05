"""The DetokenizerManager's logic without the process: token ids in, text increments out.

SGLang's incremental detokenization, per request:

    decode_ids = [p1 p2 p3 | o1 o2 o3 o4]      (a few prompt ids give the decoder context)
                  ^surr     ^read
    surr_text  = decode(decode_ids[surr:read])  -> text already accounted for
    read_text  = decode(decode_ids[surr:])      -> same text plus the new tokens
    new_text   = read_text[len(surr_text):]

Decoding a window that starts a few tokens back (``surr``) instead of decoding the new ids
alone matters for tokenizers whose pieces change with context (SentencePiece's leading
space) and for multi-byte characters split across tokens. While ``new_text`` ends in U+FFFD
the last token(s) end mid-character: nothing is committed, only the "printable" part is
sent, and the next message retries with more bytes. Otherwise ``new_text`` is committed
(appended to ``decoded_text``) and the window slides: surr <- read, read <- len(ids).

On finish: a matched stop string is cut from the text (unless ``no_stop_trim``), and a
matched stop *token* is dropped from the ids before decoding. While streaming, a text tail
that could still grow into one of the request's stop strings is held back (when the
message carries ``stop_strs``), so a client never sees text that is trimmed later.

Each call returns only what is new since the last call (``sent_offset``); the
TokenizerManager concatenates increments into SGLang's cumulative ``text``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

from mini_sglang.environ import envs
from mini_sglang.managers.io_struct.output import (
    PASSTHROUGH_FIELDS,
    BatchStrOutput,
    BatchTokenIDOutput,
)

logger = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"
# Most requests a detokenizer tracks at once; the oldest are evicted beyond this (SGLang).
DETOKENIZER_MAX_STATES = envs.SGLANG_DETOKENIZER_MAX_STATES.get()


@dataclass
class DecodeStatus:
    """Incremental decoding state of one request.

    ``decoded_text``: committed text (never ends mid-character). ``decode_ids``: every id
    received (context prompt ids first). ``surr_offset``/``read_offset``: the decode window
    (see module docstring). ``sent_offset``: how much of the text has been sent.
    """

    decoded_text: str
    decode_ids: list[int]
    surr_offset: int
    read_offset: int
    sent_offset: int = 0


def _is_cjk_char(cp: int) -> bool:
    # The CJK Unified Ideographs blocks: these characters are whole words, so they can be
    # printed as soon as they are complete.
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def find_printable_text(text: str) -> str:
    """The prefix of an uncommitted ``text`` that is safe to show now (SGLang's heuristic).

    Trailing U+FFFD (a half-received character) is never printable. Then: up to a newline
    or a CJK character, everything prints; otherwise print up to the last space, since the
    last word may still change. Examples: "Hello wor\\ufffd" -> "Hello ",
    "你好\\ufffd" -> "你好", "abc\\n\\ufffd" -> "abc\\n".
    """
    text = text.rstrip(REPLACEMENT_CHAR)
    if text.endswith("\n"):
        return text
    if text and _is_cjk_char(ord(text[-1])):
        return text
    if len(text) > 1 and _is_cjk_char(ord(text[-2])):
        return text[:-1]
    return text[: text.rfind(" ") + 1]


def stop_hold_back_start(text: str, stop_strs: Optional[list[str]], search_from: int = 0) -> int:
    """Index in ``text`` from which a stream must hold back because of stop strings.

    Returns len(text) when nothing needs holding. A stop string found at or after
    ``search_from`` (the scheduler has not reported it yet) holds from its start; otherwise
    the longest suffix of ``text`` that is a proper prefix of some stop string is held.
    Example: stop_strs=["</answer>"], text="x = 1</an" -> 5 (hold "</an").
    """
    limit = len(text)
    for stop in stop_strs or ():
        if not stop:
            continue
        pos = text.find(stop, max(0, search_from - len(stop) + 1))
        if pos != -1:
            limit = min(limit, pos)
            continue
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                limit = min(limit, len(text) - k)
                break
    return limit


def trim_matched_stop(
    output: str | list[int], finished_reason: Optional[dict[str, Any]], no_stop_trim: bool
) -> str | list[int]:
    """Remove what a stop matched: the stop string (and all after it) from text, or the final
    stop token from ids. Unchanged when not finished by a match or when ``no_stop_trim``.

    Example: ("The end.\\n\\nQ:", {"type": "stop", "matched": "\\n\\n"}) -> "The end."
    """
    if no_stop_trim or not finished_reason:
        return output
    matched = finished_reason.get("matched")
    if matched is None:
        return output
    if isinstance(matched, str) and isinstance(output, str):
        pos = output.find(matched)
        return output[:pos] if pos != -1 else output
    # A matched token is the last id (the scheduler sends ids up to the stop only).
    if isinstance(matched, int) and isinstance(output, list) and output and output[-1] == matched:
        return output[:-1]
    return output


class IncrementalDetokenizer:
    """Turns ``BatchTokenIDOutput`` messages into per-request text increments.

    Contract: for each request, concatenating the strings returned across its messages gives
    ``tokenizer.decode(all output ids)`` (with the request's special-token flags), minus a
    matched stop string / stop token and what follows it (unless ``no_stop_trim``). No
    increment ends inside a character, so U+FFFD appears only where the final text has it.
    A request's state is created by its first message and dropped when it finishes.
    """

    def __init__(self, tokenizer: Any, max_states: int = DETOKENIZER_MAX_STATES) -> None:
        self.tokenizer = tokenizer
        self.max_states = max_states
        self.decode_status: OrderedDict[str, DecodeStatus] = OrderedDict()

    def __len__(self) -> int:
        return len(self.decode_status)

    def release(self, rid: str) -> None:
        """Forget a request's state (e.g. it was aborted without a final message)."""
        self.decode_status.pop(rid, None)

    def _status(self, recv: BatchTokenIDOutput, i: int) -> DecodeStatus:
        rid = recv.rids[i]
        s = self.decode_status.get(rid)
        if s is None:
            s = DecodeStatus(
                decoded_text=recv.decoded_texts[i],
                decode_ids=list(recv.decode_ids[i]),
                surr_offset=0,
                read_offset=recv.read_offsets[i],
            )
            if len(self.decode_status) >= self.max_states:
                old_rid, _ = self.decode_status.popitem(last=False)
                logger.warning(
                    "Detokenizer state of request %s evicted (more than %d requests); raise "
                    "SGLANG_DETOKENIZER_MAX_STATES.",
                    old_rid,
                    self.max_states,
                )
            self.decode_status[rid] = s
        else:
            s.decode_ids.extend(recv.decode_ids[i])
        return s

    def _batch_decode(
        self, seqs: list[list[int]], skip: list[bool], spaces: list[bool]
    ) -> list[str]:
        # One batch_decode per distinct flag pair (SGLang applies the first request's flags
        # to the whole batch, a known TODO there).
        out: list[str] = [""] * len(seqs)
        groups: dict[tuple[bool, bool], list[int]] = {}
        for i, key in enumerate(zip(skip, spaces)):
            groups.setdefault(key, []).append(i)
        for (sk, sp), idx in groups.items():
            texts = self.tokenizer.batch_decode(
                [seqs[i] for i in idx],
                skip_special_tokens=sk,
                spaces_between_special_tokens=sp,
            )
            for i, t in zip(idx, texts):
                out[i] = t
        return out

    def decode(self, recv: BatchTokenIDOutput) -> list[str]:
        """Update every request in ``recv`` and return its new text (possibly "")."""
        bs = len(recv.rids)
        states = [self._status(recv, i) for i in range(bs)]
        surr_ids, read_ids = [], []
        for i, s in enumerate(states):
            surr_ids.append(s.decode_ids[s.surr_offset : s.read_offset])
            read_ids.append(
                trim_matched_stop(
                    s.decode_ids[s.surr_offset :], recv.finished_reasons[i], recv.no_stop_trim[i]
                )
            )
        flags = (recv.skip_special_tokens, recv.spaces_between_special_tokens)
        surr_texts = self._batch_decode(surr_ids, *flags)
        read_texts = self._batch_decode(read_ids, *flags)

        outputs: list[str] = []
        for i, s in enumerate(states):
            finished = recv.finished_reasons[i]
            new_text = read_texts[i][len(surr_texts[i]) :]
            if finished is None:
                if new_text and not new_text.endswith(REPLACEMENT_CHAR):
                    # Complete characters: commit them and slide the window.
                    s.decoded_text += new_text
                    s.surr_offset = s.read_offset
                    s.read_offset = len(s.decode_ids)
                    new_text = ""
                else:
                    new_text = find_printable_text(new_text)
            text = s.decoded_text + new_text
            if finished is not None:
                text = trim_matched_stop(text, finished, recv.no_stop_trim[i])  # type: ignore[assignment]
                limit = len(text)
            else:
                stops = recv.stop_strs[i] if recv.stop_strs is not None else None
                limit = stop_hold_back_start(text, stops, s.sent_offset)
            outputs.append(text[s.sent_offset : limit] if limit > s.sent_offset else "")
            s.sent_offset = max(s.sent_offset, limit)
            if finished is not None:
                self.decode_status.pop(recv.rids[i], None)
        return outputs

    def handle_batch_token_id_out(self, recv: BatchTokenIDOutput) -> BatchStrOutput:
        """The DetokenizerManager's handler: ``BatchTokenIDOutput`` -> ``BatchStrOutput``."""
        output_strs = self.decode(recv)
        passthrough = {name: getattr(recv, name) for name in PASSTHROUGH_FIELDS}
        return BatchStrOutput(output_strs=output_strs, output_ids=recv.output_ids, **passthrough)
