"""What every retriever returns, and the one method it has."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from zsearch_cli.data.corpus import join_contents


@dataclass(frozen=True)
class Passage:
    """One retrieved passage. ``score`` is None where the source gives none."""

    id: str
    title: str
    text: str
    score: float | None = None
    raw_contents: str | None = field(default=None, compare=False, repr=False)
    """The corpus file's own ``contents`` string (wiki-18 input), served byte for byte."""

    @property
    def contents(self) -> str:
        """Search-R1's wiki-18 form, ``'"Title"\\ntext'``: as stored when the corpus had it."""
        if self.raw_contents is not None:
            return self.raw_contents
        return join_contents(self.title, self.text)


class Retriever(Protocol):
    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """Top-``topk`` passages for each query, best first."""
        ...
