"""User-facing errors: bad input is reported in one line and exits with status 2."""

import difflib


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


def pydantic_error_line(source: str, exc) -> str:
    """One line from a pydantic ValidationError: file, dotted field path, message."""
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(x) for x in err.get("loc", ())) or "(top level)"
        msg = err.get("msg", "invalid").removeprefix("Value error, ")  # our validators' own words
        parts.append(f"field '{loc}': {msg}")
    more = len(exc.errors()) - 3
    tail = f" (+{more} more)" if more > 0 else ""
    return f"{source}: " + "; ".join(parts) + tail
