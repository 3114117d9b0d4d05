"""Turn one ``image_data`` entry into a PIL image, as SGLang accepts them.

Accepted: a PIL image (Engine API), bytes, a local file path, an http(s) URL (fetched with a
timeout and a size cap), a ``data:`` URL, or raw base64. Every failure is a ValueError whose
message names the problem (the HTTP layer answers it with 400); nothing here raises
anything else for bad input.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from PIL import Image

from mini_sglang.environ import envs


@dataclass(frozen=True)
class ImageLimits:
    """Bounds on one image: bytes read (file, URL or decoded base64), pixels after decoding
    (width x height) and seconds a URL fetch may take."""

    max_bytes: int
    max_pixels: int
    fetch_timeout: float

    @classmethod
    def from_env(cls) -> ImageLimits:
        return cls(
            max_bytes=envs.MINI_SGLANG_MAX_IMAGE_BYTES.get(),
            max_pixels=envs.MINI_SGLANG_MAX_IMAGE_PIXELS.get(),
            fetch_timeout=envs.MINI_SGLANG_IMAGE_FETCH_TIMEOUT.get(),
        )


def load_image(data: Any, limits: ImageLimits) -> Image.Image:
    """The RGB image `data` holds; ValueError naming why it cannot be used."""
    if isinstance(data, Image.Image):
        image = data
    else:
        raw = _read_bytes(data, limits)
        if len(raw) > limits.max_bytes:
            raise ValueError(f"The image is {len(raw)} bytes; at most {limits.max_bytes} allowed.")
        try:
            image = Image.open(io.BytesIO(raw))
            _check_pixels(image, limits)
            image.load()
        except ValueError:
            raise
        except Exception as e:  # PIL raises many types for non-image or broken data
            raise ValueError(f"The image data is not a readable image: {e}") from None
    _check_pixels(image, limits)
    return image.convert("RGB") if image.mode != "RGB" else image


def _check_pixels(image: Image.Image, limits: ImageLimits) -> None:
    w, h = image.size
    if w * h > limits.max_pixels:
        raise ValueError(
            f"The image is {w}x{h} pixels; at most {limits.max_pixels} pixels are allowed."
        )


def _read_bytes(data: Any, limits: ImageLimits) -> bytes:
    if isinstance(data, (bytes, bytearray)):
        return bytes(data)
    if isinstance(data, dict) and isinstance(data.get("url"), str):  # {"url": ...} parts
        data = data["url"]
    if not isinstance(data, str) or not data:
        raise ValueError(
            f"image_data entries must be non-empty strings, got {type(data).__name__}."
        )
    if data.startswith(("http://", "https://")):
        return _fetch(data, limits)
    if data.startswith("data:"):
        head, sep, payload = data.partition(",")
        if not sep or ";base64" not in head:
            raise ValueError(
                "A data: image URL must be base64 encoded (data:image/...;base64,...)."
            )
        return _b64decode(payload, "The data: URL")
    path = data[len("file://") :] if data.startswith("file://") else data
    if os.path.isfile(path):
        size = os.path.getsize(path)
        if size > limits.max_bytes:
            raise ValueError(f"The image file is {size} bytes; at most {limits.max_bytes} allowed.")
        with open(path, "rb") as f:
            return f.read()
    if len(data) < 256 and ("/" in data[:1] or "." in data[-5:] or data.startswith("file://")):
        raise ValueError(f"The image file {data!r} does not exist.")
    return _b64decode(data, "image_data")


def _b64decode(payload: str, what: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            f"{what} is not a file path, an http(s) URL, a data: URL or base64 image data."
        ) from None


def _fetch(url: str, limits: ImageLimits) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "mini-sglang"})
    try:
        with urllib.request.urlopen(request, timeout=limits.fetch_timeout) as resp:
            raw = resp.read(limits.max_bytes + 1)
    except urllib.error.HTTPError as e:
        raise ValueError(f"Fetching the image {url} failed: HTTP {e.code}.") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ValueError(f"Fetching the image {url} failed: {reason}.") from None
    if len(raw) > limits.max_bytes:
        raise ValueError(f"The image at {url} is larger than {limits.max_bytes} bytes.")
    return raw
