"""A sample corpus of real English text, built from what is already on this machine.

    info = build_corpus("demo/corpus", num_rows=10_000)   # 4 Parquet files, row groups of 1000
    info.files, info.num_rows

Sources, in this order, until there are enough sentences:

1. the license texts in /usr/share/common-licenses (GPL-3, Apache-2.0, GFDL-1.3, ...);
2. the packages' /usr/share/doc/*/copyright files, then their README files (gzipped or not);
3. the docstrings of the Python standard library's modules, classes and functions,
   read from the source with `ast` (nothing is imported, so no module runs).

Paragraphs are split into sentences; a sentence is kept when it is 5 to 200 words of
plain ASCII text that is mostly letters (no tables, code, lists of paths or years).
Whitespace is normalised and repeats dropped, first occurrence wins; files are read
in sorted order, so the same machine always gives the same corpus. Columns: `doc_id`
(int64, 0..n-1), `text`, `source` (the file, or `python-stdlib:<module>`). A machine
with fewer distinct sentences than asked for is an error (`CorpusTooSmall`): rows are
never repeated to make up the number.
"""

from __future__ import annotations

import ast
import gzip
import os
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

LICENSES_DIR = Path("/usr/share/common-licenses")
DOC_DIR = Path("/usr/share/doc")

MIN_WORDS = 5
MAX_WORDS = 200
MAX_FILE_BYTES = 4 << 20          # skip anything bigger: not a README
FILE_PREFIX = "corpus-"

SCHEMA = pa.schema([("doc_id", pa.int64()), ("text", pa.string()), ("source", pa.string())])

# A sentence ends at . ! or ? (optionally closed by a quote or bracket) followed by
# whitespace and something that starts a sentence.
_SENTENCE_END = re.compile(r"(?<=[.!?])([\"')\]]*)\s+(?=[\"'(\[]?[A-Z0-9])")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*[A-Za-z]|[A-Za-z]")
_LONG_WORD = re.compile(r"[A-Za-z]{2,}")
_RULE = re.compile(r"^[\s=\-*_#~+`.|]*$")        # ====, ----, " ." (Debian copyright blank line)
_FIELD = re.compile(r"^(Files|License|Copyright|Comment|Source|Upstream-[\w-]+|Format|Disclaimer):")
_PROSE_FIELDS = ("Comment", "Disclaimer")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+•]|\d+[.)]|\([a-z0-9]+\)|[A-Z][A-Za-z-]*:)\s")


class CorpusTooSmall(RuntimeError):
    """This machine has fewer distinct sentences than the corpus asked for."""


@dataclass(frozen=True)
class CorpusInfo:
    files: tuple[Path, ...]       # the Parquet files, in doc_id order
    num_rows: int
    num_row_groups: int = 0
    sources: int = 0              # distinct source files the rows came from

    @property
    def folder(self) -> Path:
        return self.files[0].parent


def build_corpus(folder: str | os.PathLike, num_rows: int, num_files: int = 4,
                 row_group_size: int = 1000) -> CorpusInfo:
    """Write `num_rows` distinct sentences to `num_files` Parquet files in `folder`.

    Earlier corpus files in the folder are replaced. Raises `CorpusTooSmall` when the
    machine has fewer distinct sentences than `num_rows`.
    """
    if num_rows < 1:
        raise ValueError(f"num_rows must be positive, not {num_rows}")
    if num_files < 1 or row_group_size < 1:
        raise ValueError("num_files and row_group_size must be positive")
    rows = collect_sentences(num_rows)
    if len(rows) < num_rows:
        raise CorpusTooSmall(
            f"this machine has only {len(rows)} distinct English sentences in {LICENSES_DIR}, "
            f"{DOC_DIR}/*/copyright, README files and the Python standard library's docstrings; "
            f"{num_rows} were asked for. Ask for at most {len(rows)} rows.")

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"{FILE_PREFIX}*.parquet"):
        old.unlink()

    num_files = min(num_files, num_rows)
    per_file = -(-num_rows // num_files)
    files, num_groups = [], 0
    for index, start in enumerate(range(0, num_rows, per_file)):
        chunk = rows[start:start + per_file]
        table = pa.table({"doc_id": pa.array(range(start, start + len(chunk)), pa.int64()),
                          "text": pa.array([text for text, _ in chunk], pa.string()),
                          "source": pa.array([source for _, source in chunk], pa.string())},
                         schema=SCHEMA)
        path = folder / f"{FILE_PREFIX}{index:05d}.parquet"
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(table, tmp, row_group_size=row_group_size)
        os.replace(tmp, path)
        files.append(path)
        num_groups += -(-len(chunk) // row_group_size)
    return CorpusInfo(files=tuple(files), num_rows=num_rows, num_row_groups=num_groups,
                      sources=len({source for _, source in rows}))


def collect_sentences(limit: int | None = None) -> list[tuple[str, str]]:
    """Distinct (sentence, source) pairs in a fixed order; stops at `limit` if given."""
    seen: set[str] = set()
    rows: list[tuple[str, str]] = []
    for source, text in iter_documents():
        for sentence in split_sentences(text):
            if sentence not in seen:
                seen.add(sentence)
                rows.append((sentence, source))
                if limit is not None and len(rows) >= limit:
                    return rows
    return rows


def iter_documents() -> Iterator[tuple[str, str]]:
    """(source, text) for every text file the corpus reads, in a deterministic order."""
    read: set[str] = set()
    for path in _sorted_files(LICENSES_DIR.glob("*")):
        yield from _read_once(path, read)
    for path in _sorted_files(DOC_DIR.glob("*/copyright")):
        yield from _read_once(path, read)
    for path in _sorted_files(DOC_DIR.glob("*/README*")):
        yield from _read_once(path, read)
    yield from iter_stdlib_docstrings()


def iter_stdlib_docstrings() -> Iterator[tuple[str, str]]:
    """(`python-stdlib:<module>`, docstring) for stdlib modules, classes and functions."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if not stdlib.is_dir():
        return
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "__phello__"}
    paths = []
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith("."))
        paths.extend(Path(root, name) for name in names if name.endswith(".py"))
    for path in sorted(paths, key=lambda p: p.relative_to(stdlib).as_posix()):
        module = ".".join(path.relative_to(stdlib).with_suffix("").parts).removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc:
                    yield f"python-stdlib:{module}", _drop_code(doc)


def split_sentences(text: str) -> Iterator[str]:
    """The sentences of a text that pass the corpus's filter, whitespace normalised."""
    for paragraph in _paragraphs(text):
        for sentence in _split_paragraph(paragraph):
            sentence = " ".join(sentence.split())
            if _is_english_sentence(sentence):
                yield sentence


def _split_paragraph(paragraph: str) -> list[str]:
    pieces = _SENTENCE_END.split(paragraph)
    # split() with one group returns [text, closer, text, closer, ...]: put closers back.
    sentences = []
    for i in range(0, len(pieces), 2):
        closer = pieces[i + 1] if i + 1 < len(pieces) else ""
        sentences.append(pieces[i] + closer)
    return sentences


def _paragraphs(text: str) -> Iterator[str]:
    lines: list[str] = []
    for line in text.splitlines():
        if _RULE.match(line):            # blank, a rule, or Debian's " ." paragraph break
            if lines:
                yield " ".join(lines)
            lines = []
            continue
        if _LIST_ITEM.match(line) and lines:   # a list item or a "Field:" line starts afresh
            yield " ".join(lines)
            lines = []
        field = _FIELD.match(line)
        if field:
            # Debian copyright: "License: GPL-2+" only names the text below it, "Copyright:"
            # lists years and holders (both dropped); "Comment: ..." is prose.
            if lines:
                yield " ".join(lines)
            lines = [line[field.end():].strip()] if field.group(1) in _PROSE_FIELDS else []
            continue
        lines.append(line.strip())
    if lines:
        yield " ".join(lines)


def _is_english_sentence(sentence: str) -> bool:
    if not sentence.isascii() or not sentence.isprintable():
        return False
    tokens = sentence.split()
    if not MIN_WORDS <= len(tokens) <= MAX_WORDS:
        return False
    words = [token for token in tokens if _WORD.fullmatch(token.strip(".,;:!?\"'()[]"))]
    if len(words) < 0.7 * len(tokens) or len(_LONG_WORD.findall(sentence)) < MIN_WORDS:
        return False
    letters = sum(c.isalpha() for c in sentence)
    if letters < 0.7 * len(sentence.replace(" ", "")):
        return False
    # Must read as a sentence: starts with a capital (or quote/bracket then one), ends with
    # sentence punctuation.
    return bool(re.match(r"[\"'(\[]?[A-Z]", sentence)) and sentence.rstrip("\"')]").endswith((".", "!", "?"))


def _drop_code(doc: str) -> str:
    """A docstring without doctest sessions and indented code blocks."""
    kept, in_doctest = [], False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.startswith(">>>"):
            in_doctest = True
        if in_doctest:
            if not stripped:
                in_doctest = False
            kept.append("")
            continue
        kept.append("" if line.startswith(("    ", "\t")) else line)
    return "\n".join(kept)


def _sorted_files(paths) -> list[Path]:
    return sorted((p for p in paths if p.is_file()), key=lambda p: p.as_posix())


def _read_once(path: Path, read: set[str]) -> Iterator[tuple[str, str]]:
    real = os.path.realpath(path)        # GPL -> GPL-3: read each file once
    if real in read:
        return
    read.add(real)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
    except (OSError, EOFError, gzip.BadGzipFile):
        return
    if b"\0" in data[:4096]:
        return
    yield str(path), data.decode("utf-8", errors="replace")
