"""What a handler's outcome becomes in the job's row: its return value as the JSON the
result column (jsonb) can hold, and its error and traceback bounded in size. A handler's
return is hostile until bounded: nothing here lets one job's value cost another its
outcome (worker/executor.py runs the handlers; worker/recorder.py writes the outcomes).
"""

from __future__ import annotations

import json
import re
import traceback
from typing import Any

from ..conf import pgqueue_settings
from ..nesting import nested_deeper_than

#: Bounds of the error texts recorded for a failed attempt, in bytes of UTF-8: the job's
#: ``last_error`` (and the attempt's error) keeps its first 4 KiB, the attempt's traceback
#: its last 64 KiB (where the innermost frames and the exception are).
ERROR_MAX_BYTES = 4 * 1024
TRACEBACK_MAX_BYTES = 64 * 1024
TRUNCATED = " [truncated]"

# An escaped NUL in JSON text: \u0000 not itself preceded by an escaping backslash.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class ResultNotStorable(ValueError):
    """A handler's return value that the job's result (jsonb) cannot hold; says why."""


def encode_result(value: Any) -> str | None:
    """A handler's return value as the JSON text stored in the job's result.

    Raises ``ResultNotStorable`` for what jsonb refuses (NUL characters, lone
    surrogates), what JSON cannot express (NaN, Infinity, sets, arbitrary objects) and
    what is larger than ``PGQUEUE["MAX_RESULT_BYTES"]``.
    """
    if value is None:
        return None
    depth = int(pgqueue_settings.MAX_JSON_DEPTH)
    if nested_deeper_than(value, depth):
        raise ResultNotStorable(f"nested more than {depth} levels deep (PGQUEUE['MAX_JSON_DEPTH'])")
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        raise ResultNotStorable("nested too deeply for JSON") from None
    except ValueError as exc:
        if "Out of range float" in str(exc):
            raise ResultNotStorable("holds NaN or Infinity, which JSON cannot express") from None
        raise ResultNotStorable(f"not JSON-serialisable: {describe_error(exc)}") from None
    except Exception as exc:
        raise ResultNotStorable(f"not JSON-serialisable: {describe_error(exc)}") from None
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise ResultNotStorable("holds a lone surrogate, which is not text") from None
    if _JSON_NUL.search(text):
        raise ResultNotStorable("holds a NUL character, which PostgreSQL cannot store")
    limit = int(pgqueue_settings.MAX_RESULT_BYTES)
    if size > limit:
        raise ResultNotStorable(
            f"{size} bytes of JSON, more than PGQUEUE['MAX_RESULT_BYTES'] ({limit})"
        )
    return text


def storable_text(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` as PostgreSQL stores it and at most ``limit`` bytes of UTF-8.

    NUL becomes the four characters ``\\x00`` and a lone surrogate its ``\\udcff`` escape,
    so the text says what was there; too long, it keeps its start (or its end) and says so.
    """
    data = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return data.decode()
    room = limit - len(TRUNCATED)
    if keep_end:
        return TRUNCATED.lstrip() + " " + data[-(room - 1) :].decode(errors="ignore")
    return data[:room].decode(errors="ignore") + TRUNCATED


def describe_error(exc: BaseException) -> str:
    """``module.Type: message`` (builtins unqualified), the job's ``last_error``.

    Storable and bounded (see ``storable_text``), even when ``str(exc)`` itself raises.
    """
    try:
        text = str(exc)
    except Exception as failure:
        text = f"<str() raised {type(failure).__name__}: {_safe_str(failure)}>"
    name = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    return storable_text(f"{name}: {text}" if text else name, ERROR_MAX_BYTES)


def format_traceback() -> str:
    """The traceback of the exception being handled, storable and bounded."""
    try:
        text = traceback.format_exc()
    except Exception as failure:
        text = f"<the traceback could not be formatted: {_safe_str(failure)}>"
    return storable_text(text, TRACEBACK_MAX_BYTES, keep_end=True)


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return type(exc).__name__
