"""`python -m mini_sglang.launch_server [--model-path P] [--port 30000] ...`

A user error (an invalid flag value, a model path that cannot be served, a port in use, a
child that cannot start) ends the process with one line on stderr saying what is wrong and
what to do, and exit code 1; the traceback is printed too only with `--log-level debug`.
"""

from __future__ import annotations

import os
import sys
import traceback
from types import SimpleNamespace

from mini_sglang.entrypoints.http_server import launch_server
from mini_sglang.entrypoints.startup import StartupError
from mini_sglang.server_args import prepare_server_args
from mini_sglang.utils.process import configure_logger, kill_process_tree


def _log_level(argv: list[str]) -> str:
    """--log-level as given on the command line (before parsing: see main), else info."""
    for i, arg in enumerate(argv):
        if arg == "--log-level" and i + 1 < len(argv):
            return argv[i + 1].lower()
        if arg.startswith("--log-level="):
            return arg.split("=", 1)[1].lower()
    return "info"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # Warnings while the flags are parsed and resolved get the server's timestamped format.
    configure_logger(SimpleNamespace(log_level=_log_level(argv)))
    try:
        server_args = prepare_server_args(argv)
        try:
            launch_server(server_args)
        finally:
            kill_process_tree(os.getpid(), include_parent=False)
    except (StartupError, ValueError) as e:
        if _log_level(argv) == "debug":
            traceback.print_exc()
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"launch_server: error: {message}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
