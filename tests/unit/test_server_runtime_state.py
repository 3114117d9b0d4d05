"""ServerRuntimeState: what the control API changes, reported over the frozen ServerArgs."""

from __future__ import annotations

import json

from mini_sglang.managers.server_runtime_state import ServerRuntimeState
from mini_sglang.server_args import ServerArgs


def test_view_is_the_launch_args_with_runtime_values_in_place():
    args = ServerArgs(model_path="/models/a", device="cpu", weight_version="v0")
    state = ServerRuntimeState.from_server_args(args)
    assert state.server_args_view(args) == args.to_public_dict()
    state.weight_version, state.model_path, state.load_format = "v1", "/models/b", "safetensors"
    view = state.server_args_view(args)
    assert list(view) == list(args.to_public_dict())  # same keys, same order
    assert (view["weight_version"], view["model_path"], view["load_format"]) == (
        "v1",
        "/models/b",
        "safetensors",
    )
    assert view["tokenizer_path"] == "/models/a"  # launch values stay
    assert args.weight_version == "v0" and args.model_path == "/models/a"
    json.dumps(view)
