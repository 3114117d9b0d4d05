"""mini-sglang: a small, fast, SGLang-compatible LLM inference server."""

from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):
    # Engine pulls in torch and the process machinery; import it lazily so that
    # `import mini_sglang` stays cheap for tools that only need the version.
    if name == "Engine":
        from mini_sglang.entrypoints.engine import Engine

        return Engine
    raise AttributeError(name)
