"""Writing a calibrated profile: the base profile's own text (comments and key order kept) with
the fitted sections in place after `overheads:`."""

from __future__ import annotations

import re
from typing import Any

import yaml
from pydantic import BaseModel

TOP_KEY = re.compile(r"^([A-Za-z_][\w.-]*):")


def _blocks(text: str) -> list[tuple[str | None, list[str]]]:
    """The text as (top-level key, lines) blocks; comment lines go with the key below them."""
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]
    pending: list[str] = []
    for line in text.splitlines(keepends=True):
        m = TOP_KEY.match(line)
        if m:
            blocks.append((m.group(1), pending + [line]))
            pending = []
        elif line.startswith("#") or not line.strip():
            pending.append(line)
        else:
            blocks[-1][1].extend(pending + [line])
            pending = []
    blocks[-1][1].extend(pending)
    return blocks


def section_text(key: str, value: Any) -> str:
    data = value.model_dump(mode="json", exclude_none=True) if isinstance(value, BaseModel) else value
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if v not in ("", {}, [])}
    return yaml.safe_dump({key: data}, sort_keys=False, width=110, allow_unicode=True)


def with_sections(base_text: str, sections: dict[str, Any], after: str = "overheads", header: str = "") -> str:
    """base_text with each section replaced in place, or inserted after `after` (in the given
    order); `header` (comment lines) goes above the first inserted section."""
    blocks = [(k, lines) for k, lines in _blocks(base_text)]
    keys = [k for k, _ in blocks]
    new_text = {k: section_text(k, v) for k, v in sections.items()}
    out: list[str] = []
    inserted = False
    for key, lines in blocks:
        if key in new_text:  # replaced in place, comments above it included
            out.append(header + new_text[key])
            continue
        out.extend(lines)
        if key == after and not inserted:
            missing = [k for k in sections if k not in keys]
            if missing:
                out.append(header + "".join(new_text[k] for k in missing))
            inserted = True
    if not inserted:
        out.append(header + "".join(new_text[k] for k in sections if k not in keys))
    text = "".join(out)
    return text if text.endswith("\n") else text + "\n"


def renamed(base_text: str, name: str, header: str = "") -> str:
    """base_text naming another card: `name:` replaced (`header` between the base's comments and
    it) and the base's `aliases:` dropped, which name the base card, not this one."""
    out: list[str] = []
    for key, lines in _blocks(base_text):
        if key == "name":
            at = next(i for i, line in enumerate(lines) if TOP_KEY.match(line))
            out.extend([*lines[:at], header, section_text("name", name), *lines[at + 1 :]])
        elif key != "aliases":
            out.extend(lines)
    return "".join(out)
