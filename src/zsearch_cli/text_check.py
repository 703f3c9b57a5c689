"""Text a tokenizer cannot take, found where text enters zsearch (issue 36): the agent
server's messages, QA files, corpora. One line naming the field, never a traceback later.

- A lone UTF-16 surrogate (U+D800-U+DFFF; JSON's ``"\\ud800"`` decodes to one) cannot be
  encoded as UTF-8: tokenizers and pyarrow raise ``UnicodeEncodeError`` deep inside.
- A NUL character passes UTF-8 but truncates C strings and is never real text in a question
  or a passage.
- Invalid UTF-8 in a file is caught where the file is decoded (``artifacts.iter_jsonl``).
"""

from __future__ import annotations

import re

_BAD = re.compile("[\ud800-\udfff\x00]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(text: str, nul: bool = True) -> str | None:
    """What is wrong with ``text`` for a tokenizer, or None: e.g. "holds a lone surrogate
    (U+D800) at character 12". ``nul``: a NUL counts too."""
    found = (_BAD if nul else _SURROGATE).search(text)
    if found is None:
        return None
    char = found.group()
    what = "a NUL character" if char == "\x00" else f"a lone surrogate (U+{ord(char):04X})"
    return f"holds {what} at character {found.start()}"
