"""Bounded retries with exponential backoff, shared by every network client.

Nothing in zsearch retries forever: ZeroSearch's released simulator client does, and a
dead endpoint then hangs a training run silently.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from zsearch_cli.errors import ZsearchError, one_line

T = TypeVar("T")


class PermanentError(Exception):
    """Raised inside a retried call for failures that retrying cannot fix (a 4xx)."""


def with_retries(
    call: Callable[[], T],
    *,
    what: str,
    retries: int = 3,
    backoff: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``call`` up to ``1 + retries`` times, sleeping ``backoff * 2**attempt`` between
    tries. :class:`PermanentError` stops at once. After the last failure a
    :class:`ZsearchError` names ``what`` and the last error."""
    last: Exception | None = None
    for attempt in range(retries + 1):
        try:
            return call()
        except PermanentError as err:
            raise ZsearchError(one_line(f"{what}: {err}")) from None
        except Exception as err:  # noqa: BLE001 - any transport failure is retried, boundedly
            last = err
            if attempt < retries:
                sleep(backoff * (2**attempt))
    raise ZsearchError(one_line(f"{what}: failed after {retries + 1} attempts ({type(last).__name__}: {last})"))
