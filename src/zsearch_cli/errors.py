"""The one exception type that reaches users as a one-line error instead of a traceback,
the scrubbing every user-facing message goes through (one line, no secrets), and the form
every recorded option takes on disk (``stored_config``: no secrets, still replayable)."""

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


def redact(text: str) -> str:
    """``text`` with secrets replaced by ``***``: the values of :data:`SECRET_ENV`, query
    parameters such as ``api_key=…``, bearer tokens, and what a record withholds (a URL's
    userinfo, credential-named options: :func:`stored_value`)."""
    text = _without_env_secrets(text, min_length=4)
    text = _SECRET_PARAM.sub(lambda m: m.group(1) + REDACTED, text)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + REDACTED, text)
    return _without_credentials(text)


def _without_env_secrets(text: str, min_length: int) -> str:
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= min_length:
            text = text.replace(value, REDACTED)
    return text


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


# ----------------------------------------------------------------------------- stored options
# A run folder is shared (zsearch's rule: it is enough to rerun its run), so what it records
# of the options (OUT/config.yaml, Parquet metadata, checkpoints, metrics, exports) goes
# through stored_config. A message may hide every option value of a spec (shown_spec); a
# record must keep them to replay the run, so it withholds only what is a credential by its
# form: a URL's userinfo, the value of an option or query parameter named like a key, and
# the value of a key variable of SECRET_ENV pasted anywhere. The key is never part of what a
# run computes, so a replay gives it again (cli_base.refuse_withheld) and a resume compares
# records without it (read_back).

_CREDENTIAL_NAME = re.compile(r"(?:[a-z0-9._-]*[_-])?(?:api|access|auth|client|private|session|refresh|security)?"
                              r"(?:key|token|secret|password|passwd|pwd|pass|credentials?|signature|sig|auth)")
"""An option or query parameter name (lowercased) whose value is a credential: ``api_key``,
``apiKey``, ``key``, ``token``, ``access_token``, ``X-Amz-Signature``, ``password``… and not
``max_tokens`` or ``cache`` (the word must end the name, after a separator or a known prefix)."""
_OPTION = re.compile(r"([?&])([^=&?#\s,'\"]+)=([^&#?\s,'\"]*)")
"""``?name=value`` / ``&name=value``: a spec's options (``serpapi?…``, ``sim:M?…``) and a URL's
query share it. A value stops at ``?``, so a URL inside a value (``base_url=https://h/s?token=K``)
has its own query read too."""
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#@\s,'\"]+)@")
"""``scheme://USERINFO@`` (any scheme: ``sim+http://u:KEY@h``), all of it: a user name alone may
be the token (``https://TOKEN@host``)."""
_WITHHELD = re.compile(r"(?i)[a-z][a-z0-9+.-]*://\*\*\*@|[?&]([^=&?#\s,]+)=\*\*\*(?=$|[&#?\s,])")
_STORED_ENV_MIN = 8
"""A SECRET_ENV value shorter than this is not searched for in records (a short test value
such as ``test`` would otherwise cut into paths); real keys are far longer."""


def _is_credential(name: str) -> bool:
    return _CREDENTIAL_NAME.fullmatch(name.strip().lower()) is not None


def stored_value(text: str) -> str:
    """``text`` (an option's value: a ``--search`` spec, a URL, a path) as a record keeps it:
    a URL's userinfo, every credential-named option or query value (``?api_key=…``,
    ``&token=…``) and any SECRET_ENV value replaced by ``***``; everything else as given,
    so the record still replays the run. Idempotent."""
    return _without_credentials(_without_env_secrets(text, min_length=_STORED_ENV_MIN))


def _without_credentials(text: str) -> str:
    text = _USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
    return _OPTION.sub(lambda m: m.group(0) if not _is_credential(m.group(2))
                       else f"{m.group(1)}{m.group(2)}={REDACTED}", text)


def _map_strings(values, fn):  # type: ignore[no-untyped-def]
    """``values`` (a mapping, a list, a tuple or one value) with every string through ``fn``,
    containers copied and other values as they are."""
    if isinstance(values, str):
        return fn(values)
    if isinstance(values, dict):
        return {k: _map_strings(v, fn) for k, v in values.items()}
    if isinstance(values, (list, tuple)):
        return type(values)(_map_strings(v, fn) for v in values)
    return values


def stored_config(values):  # type: ignore[no-untyped-def] - any JSON-like value, returned alike
    """``values`` (a mapping of options, a list, or one value) with every string through
    :func:`stored_value`, containers copied; the one path from options to anything written
    to disk."""
    return _map_strings(values, stored_value)


def holds_withheld(value: object) -> bool:
    """Whether ``value`` (or a string inside it) has a part :func:`stored_value` withheld:
    ``scheme://***@``, a credential-named ``name=***``, or is ``***`` itself. Sent as it is,
    ``***`` would go out as the key."""
    if isinstance(value, str):
        if value.strip() == REDACTED:
            return True
        return any(m.group(1) is None or _is_credential(m.group(1)) for m in _WITHHELD.finditer(value))
    if isinstance(value, dict):
        return any(holds_withheld(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(holds_withheld(v) for v in value)
    return False


class Withheld(str):
    """A recorded value with a withheld part, as read back for comparison with the options
    given now: equal to any value whose stored form it is. Which key a run used is not a
    difference between two runs, so ``train --resume`` or eval reusing rows, given the key
    again, sees no change where the record says ``***``."""

    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        return str.__eq__(self, stored_value(other)) if isinstance(other, str) else NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal


def read_back(values):  # type: ignore[no-untyped-def] - any JSON-like value, returned alike
    """A record read from disk, for comparison with live options: in stored form (a file an
    older zsearch wrote with the key compares as a newer one), each withheld string a
    :class:`Withheld`."""
    return _marked(stored_config(values))


def _marked(values):  # type: ignore[no-untyped-def]
    return _map_strings(values, lambda text: Withheld(text) if holds_withheld(text) else text)


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
