"""The one exception type that reaches users as a one-line error instead of a traceback,
and the scrubbing every user-facing message goes through (one line, no secrets)."""

from __future__ import annotations

import os
import re


class ZsearchError(Exception):
    """A problem the user can fix: bad input, a missing file, an invalid option.

    The CLI prints ``str(err)`` on one line and exits with status 2. Library callers
    catch it like any exception. Messages name the file, the column and the row
    whenever those apply, e.g. ``qa.jsonl: row 7: column 'question' is empty``.

    ``str(err)`` never shows a secret (see :func:`redact`), whoever prints or logs it.
    """

    def __str__(self) -> str:
        return redact(super().__str__())


SECRET_ENV = ("SERPAPI_API_KEY", "OPENAI_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY")
"""Environment variables whose values never appear in a message or a log line."""

REDACTED = "***"

_SECRET_PARAM = re.compile(r"(?i)([?&](?:api[_-]?key|key|access[_-]?token|token|secret|password)=|"
                           r"\bapi[_-]?key['\"]?\s*[=:]\s*['\"]?)[^&\s'\",}]+")
_AUTH_HEADER = re.compile(r"(?i)\b(authorization:?\s*(?:bearer\s+)?|bearer\s+)[A-Za-z0-9._~+/=-]{8,}")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s:]+:[^/@\s]+@")  # any scheme: sim+ftp://u:KEY@h


def redact(text: str) -> str:
    """``text`` with secrets replaced by ``***``: the values of :data:`SECRET_ENV`, query
    parameters such as ``api_key=…``, bearer tokens and ``user:password@`` in URLs."""
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, REDACTED)
    text = _SECRET_PARAM.sub(lambda m: m.group(1) + REDACTED, text)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + REDACTED, text)
    return _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)


_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z_-]{0,31}")
NOT_SHOWN = "(not shown: it could be a key)"


def shown_name(name: str) -> str:
    """An option name from a user's spec as a message may quote it: a plain word (letters,
    ``_``, ``-``; no digits, at most 32 characters) as it is, anything else withheld. A key
    pasted where a name goes (``serpapi?4f9c…``) is then never echoed."""
    name = name.strip()
    return repr(name) if _PLAIN_NAME.fullmatch(name) else NOT_SHOWN


def shown_spec(spec: str) -> str:
    """A ``--search``-style spec (``kind[:target][?name=value&…]``, or a URL) as a message may
    show it: the part before ``?`` through :func:`redact` (a URL's ``user:password@`` and known
    key patterns withheld), then each option as ``name=***`` (:func:`shown_name`). Option
    values are never shown: a key may sit in any of them."""
    head, sep, query = spec.strip().partition("?")
    if not sep:
        return repr(redact(head))
    parts = []
    for part in filter(None, query.split("&")):
        name, eq, _ = part.partition("=")
        shown = name.strip() if _PLAIN_NAME.fullmatch(name.strip()) else "…"
        parts.append(f"{shown}=***" if eq else shown)
    return repr(redact(head) + "?" + "&".join(parts))


def shown_kind(spec: str) -> str:
    """A spec that matched no known form, as a message may show it: its kind (the part before
    the first ``:`` or ``?``) when that is a plain word, then ``…`` for the rest, which is never
    shown (``serpapi:KEY`` is a key pasted in the wrong place)."""
    spec = spec.strip()
    cut = min([i for i in (spec.find(":"), spec.find("?")) if i >= 0], default=len(spec))
    kind = spec[:cut]
    if not _PLAIN_NAME.fullmatch(kind):
        return NOT_SHOWN
    return repr(kind + ("…" if cut < len(spec) else ""))


def one_line(text: str) -> str:
    """``text`` redacted and on one line (a library's multi-line message folded)."""
    return " ".join(redact(str(text)).split())


def install_log_redaction() -> None:
    """Redact every log record of every library (urllib3 logs request URLs, and SerpAPI's
    carry the key) at creation, so no handler ever sees a secret. Idempotent."""
    import logging

    factory = logging.getLogRecordFactory()
    if getattr(factory, "zsearch_redacts", False):
        return

    def redacting(*args, **kwargs):  # type: ignore[no-untyped-def]
        record = factory(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's business, not ours
            return record
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return record

    redacting.zsearch_redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(redacting)
