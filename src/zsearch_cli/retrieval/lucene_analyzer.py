"""Lucene's English analysis chain, as Pyserini/Anserini index and query with it.

Anserini's default analyzer (``DefaultEnglishAnalyzer``, the same chain as Lucene's
``EnglishAnalyzer``) runs::

    StandardTokenizer -> EnglishPossessiveFilter -> LowerCaseFilter -> StopFilter -> PorterStemFilter

Written here from the algorithms' definitions (Unicode UAX #29 word boundaries; Martin
Porter's 1980 algorithm in the form of his reference C implementation, which Lucene's
``PorterStemmer`` follows), no Java needed:

* **Tokenizer.** Tokens are UAX #29 words that hold a letter or digit: letters and
  digits join across ``'``, ``.``, ``’`` (both sides letters, or both digits), across
  ``:`` and ``·`` (letters), across ``,`` and ``;`` (digits), and across ``_``; each Han
  ideograph and each Hiragana character is its own token. Longer than 255 characters is
  cut into 255-character pieces (Lucene's ``maxTokenLength``).
* **Possessive.** A trailing ``'s`` / ``’s`` / ``＇s`` (any case of s) is removed.
* **Lowercase.** Per code point, as Java's ``Character.toLowerCase``: no final-sigma rule,
  ``İ`` -> ``i`` (Python's ``str.lower`` differs on exactly these).
* **Stopwords.** Lucene's ``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`` (33 words).
* **Porter.** Not Snowball's "english" (Porter2), and not Snowball's "porter" either: the
  reference C version departs from the published paper in step 2 (``bli`` -> ``ble``
  instead of ``abli`` -> ``able``; ``logi`` -> ``log``) and leaves words of one or two
  letters alone. "possibly" -> ``possibl`` (Snowball porter: ``possibli``), "geology" ->
  ``geologi`` here and there, but "archaeologies" differ.
"""

from __future__ import annotations

import re
from functools import lru_cache

ENGLISH_STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with".split()
)
MAX_TOKEN_LENGTH = 255

_CJK = "\u3040-\u309f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"
"""Hiragana and Han ideographs: UAX #29 breaks around every one of them."""
_EMOJI = "\U0001f300-\U0001faff\u2600-\u27bf"
_OTHER_NUMBERS = "\u00b2\u00b3\u00b9\u00bc-\u00be\u2070-\u209f\u2150-\u218f\u2460-\u24ff\u2776-\u2793"
"""Superscripts, fractions, circled numbers: Python's \\w has them, UAX #29 words do not."""
_UNIT = rf"[^\W{_CJK}{_OTHER_NUMBERS}]|[\u0300-\u036f\u200d]"
"""Letters, digits, underscore (ExtendNumLet) and combining marks (Extend)."""
_LETTER = rf"[^\W\d_{_CJK}{_OTHER_NUMBERS}]"
_MID_LETTER = r"[:\u00b7\u0387\u055f\u05f4\u2027\ufe13\ufe55\uff1a]"
_MID_NUM_LET = r"[.'\u2018\u2019\u2024\ufe52\uff07\uff0e]"
_MID_NUM = r"[,;\u037e\u0589\u060c\u060d\u066c\u07f8\u2044\ufe10\ufe14\ufe50\ufe54\uff0c\uff1b]"
_WORD = re.compile(
    rf"(?:{_UNIT})+"
    rf"(?:(?<={_LETTER})(?:{_MID_LETTER}|{_MID_NUM_LET})(?={_LETTER})(?:{_UNIT})+"
    rf"|(?<=\d)(?:{_MID_NUM}|{_MID_NUM_LET})(?=\d)(?:{_UNIT})+)*"
    rf"|[{_CJK}]|[{_EMOJI}]"
)
_HAS_ALNUM = re.compile(rf"[^\W_{_OTHER_NUMBERS}]|[{_EMOJI}]")
_APOSTROPHES = ("'", "\u2019", "\uff07")
_LOWER_FIX = str.maketrans({"\u03a3": "\u03c3", "\u0130": "i"})


def standard_tokens(text: str) -> list[str]:
    """UAX #29 words that Lucene's StandardTokenizer emits (case kept)."""
    out = []
    for word in _WORD.findall(text):
        if not _HAS_ALNUM.search(word):  # e.g. "___": a segment, but not a token
            continue
        if len(word) > MAX_TOKEN_LENGTH:
            out.extend(word[i : i + MAX_TOKEN_LENGTH] for i in range(0, len(word), MAX_TOKEN_LENGTH))
        else:
            out.append(word)
    return out


def english_words(text: str) -> list[str]:
    """Tokenizer -> possessive removal -> lowercase (before stopwords and stemming)."""
    words = []
    for tok in standard_tokens(text):
        if len(tok) >= 2 and tok[-2] in _APOSTROPHES and tok[-1] in "sS":
            tok = tok[:-2]
        words.append(tok.translate(_LOWER_FIX).lower())
    return words


@lru_cache(maxsize=1 << 18)
def porter_stem(word: str) -> str:
    """Porter's stemmer as Lucene's PorterStemFilter applies it (see the module docstring)."""
    if len(word) <= 2:
        return word
    return _Porter(word).run()


class _Porter:
    """One word's stemming state: ``b`` the letters, ``k`` the last index of the current
    word, ``j`` the end of the stem before a matched suffix (the paper's notation)."""

    def __init__(self, word: str):
        self.b = list(word)
        self.k = len(word) - 1
        self.j = 0

    def cons(self, i: int) -> bool:
        ch = self.b[i]
        if ch in "aeiou":
            return False
        if ch == "y":
            return i == 0 or not self.cons(i - 1)
        return True

    def m(self) -> int:
        """The number of vowel-consonant sequences in b[0..j]."""
        n, i, j = 0, 0, self.j
        while True:
            if i > j:
                return n
            if not self.cons(i):
                break
            i += 1
        i += 1
        while True:
            while True:
                if i > j:
                    return n
                if self.cons(i):
                    break
                i += 1
            i += 1
            n += 1
            while True:
                if i > j:
                    return n
                if not self.cons(i):
                    break
                i += 1
            i += 1

    def vowel_in_stem(self) -> bool:
        return any(not self.cons(i) for i in range(self.j + 1))

    def double_c(self, j: int) -> bool:
        return j >= 1 and self.b[j] == self.b[j - 1] and self.cons(j)

    def cvc(self, i: int) -> bool:
        if i < 2 or not self.cons(i) or self.cons(i - 1) or not self.cons(i - 2):
            return False
        return self.b[i] not in "wxy"

    def ends(self, s: str) -> bool:
        start = self.k - len(s) + 1
        if start < 0 or "".join(self.b[start : self.k + 1]) != s:
            return False
        self.j = self.k - len(s)
        return True

    def setto(self, s: str) -> None:
        self.b[self.j + 1 :] = list(s)
        self.k = self.j + len(s)

    def r(self, s: str) -> None:
        if self.m() > 0:
            self.setto(s)

    def _truncate(self) -> None:
        del self.b[self.k + 1 :]

    def step1ab(self) -> None:
        b = self.b
        if b[self.k] == "s":
            if self.ends("sses"):
                self.k -= 2
            elif self.ends("ies"):
                self.setto("i")
            elif b[self.k - 1] != "s":
                self.k -= 1
            self._truncate()
        if self.ends("eed"):
            if self.m() > 0:
                self.k -= 1
        elif (self.ends("ed") or self.ends("ing")) and self.vowel_in_stem():
            self.k = self.j
            self._truncate()
            if self.ends("at"):
                self.setto("ate")
            elif self.ends("bl"):
                self.setto("ble")
            elif self.ends("iz"):
                self.setto("ize")
            elif self.double_c(self.k):
                self.k -= 1
                if self.b[self.k] in "lsz":
                    self.k += 1
            elif self.m() == 1 and self.cvc(self.k):
                self.setto("e")
        self._truncate()

    def step1c(self) -> None:
        if self.ends("y") and self.vowel_in_stem():
            self.b[self.k] = "i"

    # suffix -> replacement, tried in order within the group of the letter before last;
    # the first suffix that matches ends the step, replaced or not (as in the C version).
    _STEP2 = {
        "a": (("ational", "ate"), ("tional", "tion")),
        "c": (("enci", "ence"), ("anci", "ance")),
        "e": (("izer", "ize"),),
        "l": (("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous")),
        "o": (("ization", "ize"), ("ation", "ate"), ("ator", "ate")),
        "s": (("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous")),
        "t": (("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")),
        "g": (("logi", "log"),),
    }
    _STEP3 = {
        "e": (("icate", "ic"), ("ative", ""), ("alize", "al")),
        "i": (("iciti", "ic"),),
        "l": (("ical", "ic"), ("ful", "")),
        "s": (("ness", ""),),
    }
    _STEP4 = {
        "a": ("al",), "c": ("ance", "ence"), "e": ("er",), "i": ("ic",), "l": ("able", "ible"),
        "n": ("ant", "ement", "ment", "ent"), "s": ("ism",), "t": ("ate", "iti"), "u": ("ous",),
        "v": ("ive",), "z": ("ize",),
    }

    def _replace_first(self, table: dict, key: str) -> None:
        for suffix, repl in table.get(key, ()):
            if self.ends(suffix):
                self.r(repl)
                self._truncate()
                return

    def step2(self) -> None:
        if self.k >= 1:
            self._replace_first(self._STEP2, self.b[self.k - 1])

    def step3(self) -> None:
        self._replace_first(self._STEP3, self.b[self.k])

    def step4(self) -> None:
        if self.k < 1:
            return
        key = self.b[self.k - 1]
        if key == "o":
            matched = (self.ends("ion") and self.j >= 0 and self.b[self.j] in "st") or self.ends("ou")
        else:
            matched = any(self.ends(s) for s in self._STEP4.get(key, ()))
        if matched and self.m() > 1:
            self.k = self.j
            self._truncate()

    def step5(self) -> None:
        self.j = self.k
        if self.b[self.k] == "e":
            a = self.m()
            if a > 1 or (a == 1 and not self.cvc(self.k - 1)):
                self.k -= 1
        if self.b[self.k] == "l" and self.double_c(self.k) and self.m() > 1:
            self.k -= 1
        self._truncate()

    def run(self) -> str:
        self.step1ab()
        self.step1c()
        self.step2()
        self.step3()
        self.step4()
        self.step5()
        return "".join(self.b[: self.k + 1])
