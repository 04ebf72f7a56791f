"""Turn local documents into retrievable passages that remember where they came from.

- text and Markdown: chunks of about `chunk_chars` characters that overlap by
  `overlap` characters, cut at whitespace; Markdown chunks carry their section heading;
- PDF (pdfplumber): each page's text outside its tables is chunked with its page
  number; each table row becomes one passage "column: value; …" with page and row;
- CSV: each row becomes one passage "column: value; …" with its row number;
- images (PNG, JPEG, TIFF, BMP, GIF): text read by OCR (Tesseract through pytesseract;
  Debian: `apt-get install tesseract-ocr`), then chunked.
A document that cannot be read is listed in `IngestReport.errors` with a one-line
reason and the others are still ingested.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ponder.extras import require
from ponder.tools.retrieval import Document

TEXT_SUFFIXES = {".txt", ".text", ".md", ".markdown", ".rst"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".gif"}
SUFFIXES = TEXT_SUFFIXES | IMAGE_SUFFIXES | {".pdf", ".csv"}
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
OCR_MISSING = "OCR needs the tesseract program: install it with `apt-get install tesseract-ocr` (Debian/Ubuntu)"


class IngestError(ValueError):
    """One document could not be read; the message says why in one line."""


@dataclass
class IngestReport:
    """Passages made, and documents skipped with their reasons (path, message)."""

    documents: list[Document] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)


def chunk_text(text: str, chunk_chars: int = 800, overlap: int = 150) -> list[tuple[int, int]]:
    """(start, end) character spans covering `text`, each at most `chunk_chars` long.

    A span ends at the last whitespace of its second half when there is one (so words
    are not cut); the next span starts up to `overlap` characters earlier, at a word
    start, so a sentence cut at a boundary is whole in one of the two spans.
    """
    if chunk_chars < 1 or overlap < 0 or overlap >= chunk_chars:
        raise ValueError(f"need chunk_chars >= 1 and 0 <= overlap < chunk_chars, got {chunk_chars} and {overlap}")
    spans: list[tuple[int, int]] = []
    start, n = 0, len(text)
    while start < n:
        end = min(start + chunk_chars, n)
        if end < n:
            cut = max(text.rfind(" ", start + chunk_chars // 2, end), text.rfind("\n", start + chunk_chars // 2, end))
            end = cut if cut > start else end
        spans.append((start, end))
        if end >= n:
            break
        next_start = max(end - overlap, start + 1)
        space = text.find(" ", next_start, end)
        start = space + 1 if overlap and space != -1 else (next_start if overlap else end)
    return [(s, e) for s, e in spans if text[s:e].strip()]


def _sections(text: str) -> list[tuple[int, int, str | None]]:
    """(start, end, heading) of each Markdown section; text before the first heading has none."""
    starts = [(m.start(), m.group(1)) for m in _HEADING.finditer(text)]
    if not starts or starts[0][0] > 0:
        starts.insert(0, (0, None))  # type: ignore[arg-type]
    ends = [at for at, _ in starts[1:]] + [len(text)]
    return [(at, end, title) for (at, title), end in zip(starts, ends)]


def _passages(text: str, source: str, base: dict[str, Any], chunk_chars: int, overlap: int) -> list[Document]:
    """Chunks of each section of `text`, with offsets into the whole text and the section heading."""
    documents: list[Document] = []
    prefix = f"p{base['page']}-" if "page" in base else ""
    for section_start, section_end, title in _sections(text):
        section = text[section_start:section_end]
        for start, end in chunk_text(section, chunk_chars, overlap):
            index = len(documents)
            metadata = {"source": source, **base, "chunk": index, "start": section_start + start, "end": section_start + end}
            if title is not None:
                metadata["section"] = title
            documents.append(Document(f"{source}#{prefix}c{index}", section[start:end].strip(), metadata))
    return documents


def row_passage(header: list[str], row: list[Any]) -> str:
    """A table row as "column: value; …", so a retrieved row says what each value is."""
    cells = [f"{(name or f'column {i + 1}').strip()}: {'' if value is None else str(value).strip()}"
             for i, (name, value) in enumerate(zip(header, row))]
    return "; ".join(cells)


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    if b"\x00" in data[:4096]:
        raise IngestError("binary data in a text file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise IngestError(f"not UTF-8 text (byte {exc.start})") from exc


def _load_csv(path: Path, source: str) -> list[Document]:
    rows = list(csv.reader(io.StringIO(_read_text(path))))
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise IngestError("CSV file has no header row")
    header, documents = rows[0], []
    for number, row in enumerate(rows[1:], start=1):
        if any(cell.strip() for cell in row):
            metadata = {"source": source, "row": number, "columns": header}
            documents.append(Document(f"{source}#r{number}", row_passage(header, row), metadata))
    return documents


def _load_pdf(path: Path, source: str, chunk_chars: int, overlap: int) -> list[Document]:
    pdfplumber = require("pdfplumber", "rag", "reading PDFs")

    documents: list[Document] = []
    try:
        with pdfplumber.open(path) as pdf:
            for number, page in enumerate(pdf.pages, start=1):
                tables = page.find_tables()
                text_part = page
                for table in tables:
                    text_part = text_part.outside_bbox(table.bbox)
                documents += _passages(text_part.extract_text() or "", source, {"page": number}, chunk_chars, overlap)
                for t_index, table in enumerate(tables):
                    documents += _table_rows(table.extract(), source, number, t_index)
    except Exception as exc:  # pdfminer raises many types on broken files
        raise IngestError(f"cannot parse PDF ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc
    return documents


def _table_rows(rows: list[list[Any]], source: str, page: int, table: int) -> list[Document]:
    if len(rows) < 2:
        return []
    header = [str(cell or "").strip() for cell in rows[0]]
    documents = []
    for number, row in enumerate(rows[1:], start=1):
        if any(str(cell or "").strip() for cell in row):
            metadata = {"source": source, "page": page, "table": table, "row": number, "columns": header}
            documents.append(Document(f"{source}#p{page}-t{table}-r{number}", row_passage(header, row), metadata))
    return documents


def ocr_available() -> bool:
    """Whether images can be read: the tesseract program and pytesseract are installed."""
    try:
        import pytesseract  # noqa: F401
    except ImportError:
        return False
    return shutil.which("tesseract") is not None


def _load_image(path: Path, source: str, chunk_chars: int, overlap: int) -> list[Document]:
    pytesseract = require("pytesseract", "rag", "reading images (OCR)")
    if not ocr_available():
        raise IngestError(OCR_MISSING)
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            text = pytesseract.image_to_string(image.convert("RGB"), timeout=60)
    except (UnidentifiedImageError, OSError) as exc:
        raise IngestError(f"cannot read image ({type(exc).__name__})") from exc
    except RuntimeError as exc:  # pytesseract's timeout
        raise IngestError(f"OCR failed ({exc})") from exc
    if not text.strip():
        raise IngestError("OCR found no text in the image")
    return _passages(text, source, {"ocr": True}, chunk_chars, overlap)


def load_document(path: Path, source: str, chunk_chars: int = 800, overlap: int = 150) -> list[Document]:
    """The passages of one file; IngestError when it cannot be read."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise IngestError(f"unsupported file type '{suffix or '(none)'}' (supported: {', '.join(sorted(SUFFIXES))})")
    try:
        if suffix == ".csv":
            return _load_csv(path, source)
        if suffix == ".pdf":
            return _load_pdf(path, source, chunk_chars, overlap)
        if suffix in IMAGE_SUFFIXES:
            return _load_image(path, source, chunk_chars, overlap)
        return _passages(_read_text(path), source, {}, chunk_chars, overlap)
    except OSError as exc:
        raise IngestError(f"cannot read file ({exc.strerror or exc})") from exc


def ingest(paths: list[str | os.PathLike[str]], chunk_chars: int = 800, overlap: int = 150) -> IngestReport:
    """Passages from files and folders (searched recursively, hidden files skipped)."""
    report = IngestReport()
    for given in paths:
        root = Path(given)
        if not root.exists():
            report.errors.append((str(root), "no such file or folder"))
            continue
        files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")) if root.is_dir() else [root]
        for path in files:
            source = str(path.relative_to(root)) if root.is_dir() else path.name
            try:
                found = load_document(path, source, chunk_chars, overlap)
            except IngestError as exc:
                report.errors.append((str(path), str(exc)))
                continue
            if not found:
                report.errors.append((str(path), "no text found"))
                continue
            report.documents += found
            report.sources.append(source)
    return report
