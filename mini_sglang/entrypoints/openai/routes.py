"""Mounts the OpenAI-compatible routes (/v1/completions, /v1/chat/completions, ...)."""

from __future__ import annotations

from fastapi import FastAPI


def mount_openai_routes(app: FastAPI) -> None:
    """Register the /v1 OpenAI routes on `app` (no-op until they exist)."""
    return None
