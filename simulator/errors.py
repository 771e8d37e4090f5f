"""User-facing errors: bad input is reported in one line and exits with status 2."""

import difflib
import re


class InfersimError(Exception):
    """A problem with the user's input (file, name, option). The CLI prints it in one line
    and exits 2; anything else is a bug and keeps its traceback."""

    exit_code = 2


def did_you_mean(name: str, known: list[str]) -> str:
    """ " (did you mean 'X'?)" for the known name nearest a typo (case aside), else ""."""
    lowered = {k.lower(): k for k in known}
    close = difflib.get_close_matches(str(name).lower(), list(lowered), n=1, cutoff=0.75)
    return f" (did you mean '{lowered[close[0]]}'?)" if close else ""


class UnknownNameError(InfersimError):
    """A model, hardware profile, workload or policy name that is not in its catalog."""

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind, self.name, self.known = kind, name, sorted(known)
        super().__init__(f"unknown {kind} '{name}'{did_you_mean(name, self.known)}; known: {', '.join(self.known)}")


# the labels pydantic puts in an error's location for the member of a union that failed
# (`Union[int, float]` gives '...high.int' and '...high.float'); they name no field of the file
_UNION_MEMBER = re.compile(r"^(int|float|str|bool|bytes|none|list\[.*\]|dict\[.*\]|tuple\[.*\]|literal\[.*\])$")


def _field_path(loc) -> str:
    return ".".join(str(x) for x in loc if not _UNION_MEMBER.match(str(x))) or "(top level)"


def pydantic_error_line(source: str, exc) -> str:
    """One line from a pydantic ValidationError: file, dotted field path, message. A value no
    member of a union accepts is one field with each member's complaint."""
    by_field: dict[str, list[str]] = {}
    for err in exc.errors():
        msg = err.get("msg", "invalid").removeprefix("Value error, ")  # our validators' own words
        msgs = by_field.setdefault(_field_path(err.get("loc", ())), [])
        if msg not in msgs:
            msgs.append(msg)
    parts = [f"field '{loc}': " + " / ".join(msgs) for loc, msgs in list(by_field.items())[:3]]
    more = len(by_field) - 3
    tail = f" (+{more} more)" if more > 0 else ""
    return f"{source}: " + "; ".join(parts) + tail
