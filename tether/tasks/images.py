"""A dataset row's images, as TRL's GRPOTrainer takes them: an ``images`` column (a list) or an ``image`` column (one),
or image content parts of a conversation (``{"type": "image", "image": ...}``).

An image is kept as its source until a prompt is encoded (:func:`open_image`), so a task of many rows holds their
compressed bytes, not their pixels:

* a ``PIL.Image.Image`` (a row of a ``datasets.Dataset`` built in Python);
* ``bytes``, or a ``datasets`` ``Image`` feature's ``{"bytes": ..., "path": ...}`` (what a parquet file or a
  ``save_to_disk`` directory holds, as ``datasets`` reads it);
* a file path, relative to the data file's folder (a jsonl row's ``"image": "imgs/0.png"``); kept as an absolute
  path.

Each is checked when the row is read (a file is there, its header is an image's), so ``tether validate`` names a bad
one before any model loads.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

IMAGE_COLUMNS = ("images", "image")  # TRL's column names: a list of images, or one
CONTENT_PARTS = "content parts"  # where a conversation's own images are, for the messages that name their source


def image_column(row: dict[str, Any]) -> str | None:
    """The column of ``row`` that holds its images (``images`` first, as TRL), or None."""
    return next((name for name in IMAGE_COLUMNS if row.get(name) is not None), None)


def column_images(value: Any) -> list[Any]:
    """An image column's value as a list: ``images`` holds a list, ``image`` one image."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def part_images(messages: list[dict[str, Any]]) -> list[Any]:
    """The images that a conversation's image parts carry (``image``, or a file ``path``), in order. A key that is
    None carries nothing: Arrow gives every part of a column every key any part has (``{"type": "image", "image":
    None, "text": None}``)."""
    carried = [part.get("image") if part.get("image") is not None else part.get("path") for m in messages
               if isinstance(m["content"], list) for part in m["content"] if part.get("type") == "image"]
    return [image for image in carried if image is not None]


def without_image_data(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each image part bare (``{"type": "image"}``): the prompt stays text, hashable and printable,
    and its images travel beside it."""
    return [{**m, "content": [{"type": "image"} if part.get("type") == "image" else part for part in m["content"]]}
            if isinstance(m["content"], list) else m for m in messages]


def with_image_parts(prompt: str | list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """A prompt with a place for each of its ``count`` images: a conversation with image parts keeps them; else
    (a text, or a conversation without any) ``count`` image parts go before the first user message's text, as TRL
    puts a row's ``image`` column."""
    from tether.models.vision import image_parts

    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if image_parts(messages):
        return messages
    first = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first is None:
        raise ValueError("the conversation has no user message to put its images in")
    content = messages[first]["content"]
    text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    messages[first] = {**messages[first], "content": [{"type": "image"}] * count + text}
    return messages


def prompt_messages(prompt: str | list[dict[str, Any]], count: int, system: str | None) -> list[dict[str, Any]]:
    """The conversation a prompt with ``count`` images is encoded as (:func:`with_image_parts`, ``system`` first when
    given): what the collector hands the processor, and what the context check counts."""
    messages = with_image_parts(prompt, count)
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return messages


def resolve_image(value: Any, base: Path) -> Any:
    """An image's source as :func:`open_image` reads it: a PIL image or bytes as they are, a ``{"bytes", "path"}``
    dict as its bytes (else its path), a path made absolute against ``base``; its header checked.

    Raises:
        ValueError: not an image, or a file that is not there (never printing the bytes).
    """
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        data = value.get("bytes")
        if data is not None and not isinstance(data, (bytes, bytearray)):
            raise ValueError(f"its 'bytes' holds {type(data).__name__}, not bytes")
        value = data or value.get("path")
    if isinstance(value, str):
        if "://" in value:
            raise ValueError(f"{_shown(value)} is a URL: give the image's file or bytes (nothing is downloaded)")
        path = Path(value).expanduser()
        value = str(path if path.is_absolute() else base / path)
        try:
            found = Path(value).is_file()
        except OSError:  # a name too long for a path: some text, not a file
            found = False
        if not found:
            raise ValueError(f"image file {_shown(value)} does not exist")
    elif not isinstance(value, (bytes, bytearray)) and not is_pil_image(value):
        raise ValueError(f"an image is a PIL image, bytes or a file path, not {type(value).__name__}")
    if not is_pil_image(value):
        _check_header(value)
    return value


def _shown(text: str, limit: int = 200) -> str:
    """``text`` for an error line: a string that is an image's bytes, not a path, must not fill the terminal."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def is_pil_image(value: Any) -> bool:
    from PIL import Image

    return isinstance(value, Image.Image)


def _check_header(source: bytes | str) -> None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source):
            pass
    except (UnidentifiedImageError, OSError) as err:
        what = f"{len(source)} bytes" if isinstance(source, (bytes, bytearray)) else source
        raise ValueError(f"{what}: not an image PIL can read ({type(err).__name__})") from None


def open_image(source: Any) -> Any:
    """The RGB ``PIL.Image`` of a source of :func:`resolve_image`."""
    from PIL import Image

    if is_pil_image(source):
        return source.convert("RGB")
    with Image.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source) as image:
        return image.convert("RGB")


def image_area(source: Any) -> int:
    """Pixels of a source of :func:`resolve_image`, read from its header (nothing decoded): how many tokens a processor
    that tiles or resizes by area gives it grows with it."""
    from PIL import Image

    if is_pil_image(source):
        return source.width * source.height
    with Image.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source) as image:
        return image.width * image.height


def image_key(sources: Sequence[Any]) -> str:
    """A digest of the images of a prompt: two rows with the same text and other images are other prompts."""
    digest = hashlib.sha1()
    for source in sources:
        if is_pil_image(source):
            digest.update(source.mode.encode() + str(source.size).encode() + source.tobytes())
        else:
            digest.update(source if isinstance(source, (bytes, bytearray)) else source.encode())  # a file: its path
    return digest.hexdigest()
