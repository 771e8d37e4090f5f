"""`sim calibrate` as a function: tables -> fitted sections -> profile YAML (nothing written
unless every table reads and fits)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import InfersimError
from ..hardware.catalog import load_hardware, profile_path, with_shapes_path
from ..hardware.profile import HardwareProfile
from ..metrics.rundir import check_out_file, staged_files
from ..progress import ProgressBar
from ..yamlio import validate
from .checks import check_fit, check_repeats
from .fit import unfitted_notes, with_measured_shapes
from .fit_plot import fit_series, plot_fit
from .profile_writer import renamed, with_sections
from .rows import KernelRow
from .tables import recognise

SHAPES_SUFFIX = ".gemm-shapes.csv.gz"
PLOT_SUFFIXES = (".png", ".svg")
PROFILE_SUFFIXES = (".yaml", ".yml")

# the comment above each section `sim calibrate` writes
SECTION_HEADERS = {
    "calibration": "# Kernel time models fitted by `sim calibrate` (docs/profiling.md); they price the GEMMs and the\n"
    "# elementwise kernels. `efficiency:` prices the operators no table measured.\n",
    "collectives": "# Measured NCCL collectives, fitted by `sim calibrate` (docs/profiling.md)\n",
}


@dataclass
class CalibrateOptions:
    tables: list[Path]
    hardware: str
    out: Path
    device: str | None = None
    source: str | None = None
    force: bool = False
    plot: Path | None = None  # a figure of the fit on its rows (PNG or SVG), written beside the profile
    name: str | None = None  # the profile's name; None: the --out file's stem


@dataclass
class CalibrateResult:
    out: Path
    profile: HardwareProfile
    sections: dict[str, Any] = field(default_factory=dict)
    plot: Path | None = None
    notes: list[str] = field(default_factory=list)  # what was read but not fitted, for stderr

    def summary_lines(self) -> list[str]:
        lines = [f"wrote {self.out}"] + ([f"wrote {self.plot}"] if self.plot else [])
        # the sections this run fitted: a section the base profile had is carried, not fitted
        cal = self.profile.calibration if "calibration" in self.sections else None
        if cal and cal.gemm:
            g = cal.gemm
            lines.append(
                f"  gemm: compute {g.compute:.3f}, memory {g.memory:.3f}, launch {g.launch_us:.2f} us, "
                f"corner p {g.corner_exponent:.2f}, tile {g.tile_tokens} tokens ({g.tile_share:.2f} of M; the "
                f"rest 2 x {g.tile_tokens}), wave exponent "
                f"{g.wave_exponent:.2f}, wave latency {g.wave_latency_us:.2f} us; {g.rows} rows, "
                f"MAPE {g.mape_pct:.1f}%, bias {g.bias_pct:+.1f}%"
            )
            if g.measured_shapes:
                m = g.measured_shapes
                lines.append(
                    f"  gemm measured shapes: {m.rows} in {m.file} (K carried {m.k_width_octaves} octave); "
                    f"corrected MAPE {m.mape_pct:.1f}%, bias {m.bias_pct:+.1f}%"
                )
        for k, e in cal.elementwise.items() if cal else ():
            lines.append(
                f"  {k}: memory {e.memory:.3f}, launch {e.launch_us:.2f} us, saturation "
                f"{e.saturation_tokens} tokens"
                + (f", first {e.cache_mb:.3g} MB from cache at {e.cache_memory:.3f}" if e.cache_mb else "")
                + (
                    f", up to {e.gather_tokens} tokens {e.gather_us:.2f} us + {e.gather_us_per_token:.2f} us a token"
                    if e.gather_tokens
                    else ""
                )
                + f"; {e.rows} rows, MAPE {e.mape_pct:.1f}%, bias {e.bias_pct:+.1f}%"
            )
        coll = self.profile.collectives if "collectives" in self.sections else None
        for name in ("all_reduce", "send_recv"):
            for fit in getattr(coll, name) if coll else ():
                lines.append(
                    f"  {name} {fit.workers} workers ({fit.topology}): {fit.rows} rows, "
                    f"MAPE {fit.mape_pct:.1f}%, bias {fit.bias_pct:+.1f}%"
                )
        return lines


def shapes_path(out: Path) -> Path:
    """Where `sim calibrate` writes the measured GEMM table of a profile written to `out`."""
    return out.with_name(out.name.removesuffix(out.suffix) + SHAPES_SUFFIX)


def _refuse_existing(target: Path, force: bool) -> None:
    if target.is_dir():  # even with --force: a folder is never replaced by a file
        raise InfersimError(f"{target}: is a folder; name a profile file (.yaml)")
    if target.exists() and not force:
        raise InfersimError(f"{target}: exists; refusing to overwrite it (--force replaces it)")


def _carried_shapes(text: str, base_path: Path, out: Path) -> tuple[str, Path | None]:
    """A base profile's measured GEMM table, kept by a step that fits other sections: the text
    names the copy written beside `out`; and the file to copy."""
    profile = with_shapes_path(validate(HardwareProfile, yaml.safe_load(text), str(base_path)), base_path)
    cal = profile.calibration
    shapes = cal.gemm.measured_shapes if cal is not None and cal.gemm is not None else None
    if shapes is None:
        return text, None
    src = Path(shapes.file)  # resolved against the base profile's folder, and there
    moved = shapes.model_copy(update={"file": shapes_path(out).name})
    new = cal.model_copy(update={"gemm": cal.gemm.model_copy(update={"measured_shapes": moved})})
    return with_sections(text, {"calibration": new}, header=SECTION_HEADERS["calibration"]), src


def _fit_sections(kinds: list[tuple[Any, list]], base: HardwareProfile, source: str, opts: CalibrateOptions):
    """Each kind's fitted sections, and the measured GEMM table; a progress bar names the kernel
    kind being fitted (a large table's GEMM fit takes half a minute)."""
    sections: dict[str, Any] = {}
    table = None
    fits = sum(len({r.kernel if isinstance(r, KernelRow) else "collectives" for r in rows}) for _, rows in kinds)
    quiet = not sys.stdout.isatty()  # piped or captured: the summary lines alone
    with ProgressBar(
        "sim calibrate", quiet=quiet, total=fits, fields="{task.fields[note]}", transient=True, note=""
    ) as bar:
        started = iter(range(fits))

        def on_kernel(kernel: str, rows: int) -> None:
            bar.update(completed=next(started, fits), note=f"fitting {kernel} ({rows:,} rows)")

        for kind, rows in kinds:
            for key, value in kind.fit(rows, base, source, on_kernel).items():
                if key in sections:
                    raise InfersimError(
                        f"{opts.tables[0]}: two table kinds fit the same section '{key}'; calibrate them one at a time"
                    )
                if key == "calibration" and value.gemm is not None:
                    value, table = with_measured_shapes(value, rows, base, shapes_path(opts.out).name)
                sections[key] = value
    return sections, table


def calibrate(opts: CalibrateOptions) -> CalibrateResult:
    check_out_file(opts.out, PROFILE_SUFFIXES, option="--out", force=opts.force)
    if opts.plot is not None:  # everything that could stop the figure after the profile is written
        check_out_file(opts.plot, PLOT_SUFFIXES, option="--plot", force=opts.force)
    base = load_hardware(opts.hardware + ":datasheet" if ":" not in opts.hardware else opts.hardware)
    base_path = profile_path(opts.hardware.split(":")[0])
    kinds: dict[str, tuple[Any, list]] = {}
    for path in opts.tables:
        if not path.is_file():
            raise InfersimError(f"{path}: file not found")
        kind = recognise(path)
        rows = kind.read(path, opts.device)
        kinds.setdefault(type(kind).fit, (kind, []))[1].extend(rows)  # kinds sharing a fit pool their rows
    source = opts.source or ", ".join(p.name for p in opts.tables)
    kernel_rows = [r for _, rows in kinds.values() for r in rows if isinstance(r, KernelRow)]
    check_repeats(kernel_rows)
    if opts.plot is not None and not kernel_rows:
        raise InfersimError(f"--plot {opts.plot}: the tables hold no kernel rows to plot (collectives only)")
    sections, table = _fit_sections(list(kinds.values()), base, source, opts)
    text = base_path.read_text()
    name, base_name = opts.name or opts.out.stem, base.name.split(":")[0]
    if name != base_name:
        header = f"# {name}: kernel times fitted by `sim calibrate` on {base_name}'s peaks, memory and links.\n"
        text = renamed(text, name, header)
    for key, value in sections.items():  # each section under its own comment
        text = with_sections(text, {key: value}, header=SECTION_HEADERS.get(key, ""))
    carried = None
    if "calibration" not in sections:
        text, carried = _carried_shapes(text, base_path, opts.out)
    profile = validate(HardwareProfile, yaml.safe_load(text), str(opts.out))
    if "calibration" in sections:
        check_fit(kernel_rows, profile, base_name)
    shapes = shapes_path(opts.out) if table is not None or carried is not None else None
    if shapes is not None:
        _refuse_existing(shapes, opts.force)
    _refuse_existing(opts.out, opts.force)
    # the table, the figure and the profile naming the table, moved into place together
    with staged_files(shapes, opts.plot, opts.out) as staged:
        if table is not None:
            table.write(staged.path(shapes), source)
        elif carried is not None and carried.resolve() != shapes.resolve():
            staged.path(shapes).write_bytes(carried.read_bytes())
        if opts.plot is not None:
            plot_fit(fit_series(kernel_rows, profile, table), staged.path(opts.plot), profile.name)
        staged.path(opts.out).write_text(text)
    return CalibrateResult(opts.out, profile, sections, opts.plot, unfitted_notes(kernel_rows))
