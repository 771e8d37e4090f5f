"""Reading request traces (CSV, JSONL, or a JSON list of objects, each optionally gzipped)
through the column mapping of a TraceSource. Only the mapped columns are kept; every problem is one InfersimError line
naming the file, the column and, for bad values, the row (1 = first data row)."""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import InfersimError
from ..validation import MAX_TOKENS
from .schema import TraceSource

_UNIT_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def _suffix(path: Path) -> str:
    """The format suffix, looking through a trailing .gz (traces ship gzipped)."""
    suffixes = [x.lower() for x in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def _open_text(path: Path):
    return gzip.open(path, "rt") if path.suffix.lower() == ".gz" else path.open()


def file_format(path: Path, fmt: str | None) -> str:
    if fmt:
        return fmt
    suffix = _suffix(path)
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".json":
        return "json"
    raise InfersimError(f"{path}: cannot tell the format from the suffix '{suffix}'; set format: csv, jsonl or json")


def _missing(path: Path, column: str, have) -> InfersimError:
    return InfersimError(f"{path}: column '{column}' not found; columns: {', '.join(map(str, have))}")


def read_columns(
    path: Path, columns: list[str], fmt: str | None = None, nrows: int | None = None
) -> dict[str, np.ndarray]:
    """The named columns of a trace file as arrays (raw values: numbers or strings), all of
    the same length; at most `nrows` rows are read when given."""
    path = Path(path)
    if not path.is_file():
        raise InfersimError(f"{path}: {'a folder, not a file' if path.is_dir() else 'file not found'}")
    fmt = file_format(path, fmt)
    columns = list(dict.fromkeys(columns))
    try:
        if fmt == "csv":
            sep = "\t" if _suffix(path) == ".tsv" else ","  # pandas un-gzips by extension
            have = list(pd.read_csv(path, nrows=0, sep=sep).columns)
            for c in columns:
                if c not in have:
                    raise _missing(path, c, have)
            df = pd.read_csv(path, usecols=columns, nrows=nrows, sep=sep)
            return {c: df[c].to_numpy() for c in columns}
        if fmt == "jsonl":
            records = []
            with _open_text(path) as fh:
                for line in fh:
                    if line.strip():
                        records.append(json.loads(line))
                        if nrows is not None and len(records) >= nrows:
                            break
        else:
            with _open_text(path) as fh:
                records = json.load(fh)
            if not isinstance(records, list):
                raise InfersimError(f"{path}: expected a JSON list of objects, got {type(records).__name__}")
            if nrows is not None:
                records = records[:nrows]
    except pd.errors.EmptyDataError:
        raise InfersimError(f"{path}: the file is empty (no header, no rows)") from None
    except (
        json.JSONDecodeError,
        UnicodeDecodeError,
        pd.errors.ParserError,
        gzip.BadGzipFile,
        zlib.error,
        EOFError,
    ) as exc:
        raise InfersimError(f"{path}: malformed {fmt.upper()} ({str(exc).splitlines()[0]})") from None
    first = records[0] if records else {}
    if not isinstance(first, dict):
        raise InfersimError(f"{path}: row 1 is not an object")
    for c in columns:
        if c not in first:
            raise _missing(path, c, first.keys())
    out = {}
    for c in columns:
        try:
            out[c] = np.array([r[c] for r in records], dtype=object)
        except (KeyError, TypeError):
            row = next(i for i, r in enumerate(records) if not isinstance(r, dict) or c not in r)
            raise InfersimError(f"{path}: column '{c}' missing in row {row + 1}") from None
    return out


def _bad_row(path, column, mask, first_row: int, what: str) -> InfersimError:
    i = int(np.flatnonzero(mask)[0])
    return InfersimError(f"{path}: column '{column}', row {first_row + i + 1}: {what}")


def _finite(values: np.ndarray, path, column: str, first_row: int) -> np.ndarray:
    """float64 values; a non-numeric, missing or infinite value is an error."""
    if values.dtype.kind in "iuf":
        x = values.astype(np.float64)
    else:
        x = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(x)
    if bad.any():
        v = values[np.flatnonzero(bad)[0]]
        if isinstance(v, (float, np.floating)):  # a blank CSV cell reads as NaN
            what = "an empty cell or NaN" if np.isnan(v) else f"not a finite number: {float(v):g}"
        else:
            what = f"not a number: {v!r}"
        raise _bad_row(path, column, bad, first_row, what)
    return x


def to_numbers(values: np.ndarray, path, column: str, first_row: int = 0) -> np.ndarray:
    """float64 values, >= 0; a non-numeric, missing or negative value is an error."""
    x = _finite(values, path, column, first_row)
    if (x < 0).any():
        raise _bad_row(path, column, x < 0, first_row, f"negative value {x[x < 0][0]:g}")
    return x


def to_lengths(
    values: np.ndarray, path, column: str, kind: str = "tokens", scale: float = 1.0, first_row: int = 0
) -> np.ndarray:
    """Token counts (int64, >= 1): the numbers in the column, or for kind text_words the word
    count of the text; times `scale`, rounded, zeros raised to 1."""
    if kind == "text_words":
        if not all(isinstance(v, str) for v in values):
            bad = np.array([not isinstance(v, str) for v in values])
            raise _bad_row(path, column, bad, first_row, "not text (kind text_words)")
        x = pd.Series(values, dtype=object).str.split().str.len().to_numpy(dtype=np.float64)
    else:
        x = to_numbers(values, path, column, first_row)
    x = np.rint(x * scale)
    huge = x > MAX_TOKENS
    if huge.any():
        raise _bad_row(path, column, huge, first_row, f"{x[huge][0]:g} tokens, more than {MAX_TOKENS:,}")
    return np.maximum(x, 1).astype(np.int64)


def to_seconds(values: np.ndarray, path, column: str, unit: str, first_row: int = 0) -> np.ndarray:
    """Times as float64 seconds (an arbitrary origin for datetimes)."""
    if unit != "datetime":
        try:
            return _finite(values, path, column, first_row) * _UNIT_S[unit]
        except InfersimError as exc:
            numbers = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
            first_bad = values[~np.isfinite(numbers)][:1]
            dates = pd.to_datetime(pd.Series(first_bad, dtype=object), format="ISO8601", errors="coerce")
            if isinstance(first_bad[0], str) and dates.notna().all():  # a datetime: say how to read it
                raise InfersimError(f"{exc}; the column holds datetimes: set time_unit: datetime") from None
            raise
    t = pd.to_datetime(pd.Series(values, dtype=object), format="ISO8601", errors="coerce", utc=True)
    bad = t.isna().to_numpy()
    if bad.any():
        raise _bad_row(path, column, bad, first_row, f"not a datetime: {values[np.flatnonzero(bad)[0]]!r}")
    ns = t.dt.tz_localize(None).to_numpy().astype("datetime64[ns]").astype(np.int64)
    return (ns - ns.min()) * 1e-9


def to_hash_ids(values: np.ndarray, path, column: str, first_row: int = 0) -> list[list[int]]:
    """Per row, a list of non-negative integer hash ids (a JSON list in the file, or a string
    holding one in CSV)."""
    out = []
    for i, v in enumerate(values):
        if isinstance(v, np.ndarray):  # equal-length lists come back as rows of a 2-D array
            v = v.tolist()
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except json.JSONDecodeError:
                v = None
        ok = isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
        if not ok:
            raise InfersimError(
                f"{path}: column '{column}', row {first_row + i + 1}: not a list of non-negative integer hash ids"
            )
        out.append(v)
    return out


def trace_rows(src: TraceSource, path: Path) -> int | None:
    """Data rows of a CSV or JSON Lines trace after start_row, counted by streaming its lines
    (what reading it would cost is known before it is read); None for a JSON list, whose rows
    are known only once parsed, and for a file that cannot be read (the reader says why)."""
    fmt = file_format(path, src.format) if path.is_file() else None
    if fmt not in ("csv", "jsonl"):
        return None
    lines, last = 0, b"\n"
    try:
        with gzip.open(path, "rb") if path.suffix.lower() == ".gz" else path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
    except (OSError, EOFError, zlib.error):
        return None
    lines += last != b"\n"  # a last line without its newline
    header = 1 if fmt == "csv" else 0
    return max(lines - header - src.start_row, 0)


@dataclass
class TraceData:
    arrival_s: np.ndarray | None  # sorted, starting at 0, time_scale applied
    prompt_tokens: np.ndarray | None
    output_tokens: np.ndarray | None
    hash_ids: list | None = None  # per row, the prefix-block hash ids (hash_column)

    def __len__(self):
        for a in (self.arrival_s, self.prompt_tokens, self.output_tokens):
            if a is not None:
                return len(a)
        return 0


def read_trace(src: TraceSource, path: Path, count: int | None = None) -> TraceData:
    """Rows start_row .. start_row+count (all rows after start_row when count is None) of the
    trace at `path`, mapped through `src`. Arrivals are shifted to start at 0, multiplied by
    time_scale, and the rows are put in arrival order (stable) if the file is not."""
    cols = [c for c in (src.arrival_column, src.prompt_column, src.output_column, src.hash_column) if c]
    if not cols:
        raise InfersimError(f"{path}: the trace maps no column (arrival_column, prompt_column, output_column)")
    nrows = None if count is None else src.start_row + count
    raw = read_columns(path, cols, src.format, nrows=nrows)
    have = len(raw[cols[0]]) - src.start_row
    if have <= 0:
        raise InfersimError(f"{path}: no rows after start_row {src.start_row}")
    if count is not None and have < count:
        raise InfersimError(f"{path}: requests.count {count} exceeds the {have} rows after start_row {src.start_row}")
    rows = slice(src.start_row, None)
    r0 = src.start_row
    arrival = prompt = output = None
    if src.arrival_column:
        arrival = to_seconds(raw[src.arrival_column][rows], path, src.arrival_column, src.time_unit, r0)
        arrival = (arrival - arrival.min()) * src.time_scale

    def lengths(column, kind):
        scale = src.tokens_per_word if kind == "text_words" else 1.0
        return to_lengths(raw[column][rows], path, column, kind, scale, r0)

    if src.prompt_column:
        prompt = lengths(src.prompt_column, src.prompt_column_kind)
    if src.output_column:
        output = lengths(src.output_column, src.output_column_kind)
    hashes = None if not src.hash_column else to_hash_ids(raw[src.hash_column][rows], path, src.hash_column, r0)
    if arrival is not None and np.any(np.diff(arrival) < 0):
        order = np.argsort(arrival, kind="stable")
        arrival = arrival[order]
        prompt = None if prompt is None else prompt[order]
        output = None if output is None else output[order]
        hashes = None if hashes is None else [hashes[i] for i in order]
    return TraceData(arrival, prompt, output, hashes)
