"""`python -m mini_sglang.launch_server [--model-path P] [--port 30000] ...`"""

from __future__ import annotations

import os
import sys

from mini_sglang.entrypoints.http_server import launch_server
from mini_sglang.server_args import prepare_server_args
from mini_sglang.utils.process import kill_process_tree


def main(argv: list[str] | None = None) -> None:
    server_args = prepare_server_args(sys.argv[1:] if argv is None else argv)
    try:
        launch_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
