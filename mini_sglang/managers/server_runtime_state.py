"""ServerRuntimeState: the server-wide values that change while the server runs.

`ServerArgs` is frozen once resolved. What the control API changes afterwards lives here,
owned by the TokenizerManager (the process that answers /get_server_info and writes
meta_info), starting from the launch values:

- `weight_version`: set by /update_weight_version and by a successful weight update that
  names a version; reported in every response's meta_info.
- `model_path`, `load_format`: the checkpoint last loaded by /update_weights_from_disk.

The schedulers keep their own copy of the loaded checkpoint (ModelRunner.weight_source),
since each of them reloads it on a failed update.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mini_sglang.server_args import ServerArgs


@dataclass
class ServerRuntimeState:
    """Mutable; every write happens on the TokenizerManager's event loop."""

    weight_version: str
    model_path: str
    load_format: str

    @classmethod
    def from_server_args(cls, server_args: ServerArgs) -> ServerRuntimeState:
        return cls(
            weight_version=server_args.weight_version,
            model_path=server_args.model_path,
            load_format=server_args.load_format,
        )

    def server_args_view(self, server_args: ServerArgs) -> dict[str, Any]:
        """`server_args.to_public_dict()` with the runtime values in place of the launch
        values (same keys, same order): what /get_server_info reports as the server args."""
        view = server_args.to_public_dict()
        view.update(dataclasses.asdict(self))
        return view
