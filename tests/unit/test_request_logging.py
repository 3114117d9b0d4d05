"""managers/request_logging: SGLang's truncated object text, the four --log-requests-level
formats, and /configure_logging's updates (a bad level changes nothing)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from mini_sglang.managers.io_struct.control import ConfigureLoggingReq
from mini_sglang.managers.io_struct.generate import GenerateReqInput
from mini_sglang.managers.request_logging import RequestLogger, truncated_repr


@dataclass
class Inner:
    name: str
    ids: list[int] = field(default_factory=list)


def test_truncated_repr_cuts_long_strings_and_lists_around_the_middle():
    assert truncated_repr("abcdefgh", 4) == "'ab' ... 'gh'"
    assert truncated_repr("abcd", 4) == "'abcd'"
    assert truncated_repr([1, 2, 3, 4, 5], 4) == "[1, 2] ... [4, 5]"
    assert truncated_repr((1, 2), 4) == "(1, 2)"
    assert truncated_repr({"a": "xyzxyz", "b": 1}, 4) == "{'a': 'xy' ... 'yz', 'b': 1}"
    assert truncated_repr({"a": 1, "b": 2}, 4, frozenset({"b"})) == "{'a': 1}"
    got = truncated_repr(Inner("n", [1, 2, 3, 4, 5]), 4, frozenset())
    assert got == "Inner(name='n', ids=[1, 2] ... [4, 5])"
    # skip_names applies at the top level only (SGLang's behaviour)
    outer = {"x": Inner("skip-me-not", [])}
    assert truncated_repr(outer, 100, frozenset({"name"})) == (
        "{'x': Inner(name='skip-me-not', ids=[])}"
    )
    assert truncated_repr(3.5) == "3.5" and truncated_repr(None) == "None"


def _request() -> GenerateReqInput:
    obj = GenerateReqInput(input_ids=list(range(3000)), sampling_params={"max_new_tokens": 4})
    obj.normalize_batch_and_arguments()
    return obj


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_levels(level, caplog):
    caplog.set_level(logging.INFO, logger="mini_sglang")
    log = RequestLogger(True, level)
    obj = _request()
    log.receive(obj)
    log.finish(obj, {"text": "hi", "output_ids": [5, 6], "meta_info": {"id": obj.rid}})
    receive, finish = (r.getMessage() for r in caplog.records[-2:])
    assert receive.startswith("Receive: obj=GenerateReqInput(") and f"rid='{obj.rid}'" in receive
    assert finish.startswith("Finish: obj=GenerateReqInput(")
    assert "out={" in finish and f"'meta_info': {{'id': '{obj.rid}'}}" in finish
    assert ("input_ids=" in receive) == (level >= 2)
    assert ("sampling_params=" in receive) == (level >= 1)
    assert ("'output_ids': [5, 6]" in finish) == (level >= 2)
    assert (" ... " in receive) == (level == 2)  # 3000 ids: cut at 2048 on level 2 only


def test_disabled_logs_nothing_and_configure_updates(caplog):
    caplog.set_level(logging.INFO, logger="mini_sglang")
    log = RequestLogger(False, 2)
    log.receive(_request())
    assert not caplog.records
    log.configure(ConfigureLoggingReq(log_requests=True))
    assert (log.enabled, log.level) == (True, 2)  # None leaves the level alone
    log.configure(ConfigureLoggingReq(log_requests_level=0))
    assert (log.enabled, log.level) == (True, 0)
    with pytest.raises(ValueError, match="log_requests_level must be one of"):
        log.configure(ConfigureLoggingReq(log_requests=False, log_requests_level=7))
    assert (log.enabled, log.level) == (True, 0)  # nothing changed
    caplog.clear()
    log.configure(ConfigureLoggingReq(dump_requests_folder="/tmp/x"))
    assert any("dump_requests_folder is not supported" in r.getMessage() for r in caplog.records)
