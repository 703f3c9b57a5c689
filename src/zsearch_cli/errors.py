"""The one exception type that reaches users as a one-line error instead of a traceback."""

from __future__ import annotations


class ZsearchError(Exception):
    """A problem the user can fix: bad input, a missing file, an invalid option.

    The CLI prints ``str(err)`` on one line and exits with status 2. Library callers
    catch it like any exception. Messages name the file, the column and the row
    whenever those apply, e.g. ``qa.jsonl: row 7: column 'question' is empty``.
    """
