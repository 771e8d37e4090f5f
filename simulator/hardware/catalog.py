"""Hardware profiles by name (hwprofiles/*.yaml) or path, with an optional host-link preset
(simulator/catalog/host_links.yaml) in place of the profile's own: the host link belongs to
the machine the GPU sits in, so one GPU profile serves hosts with different PCIe generations."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ..catalog_loader import canonical_names, resolve
from ..errors import InfersimError, UnknownNameError
from ..paths import catalog_dir, hwprofiles_dir
from ..registry import name_key
from ..yamlio import load_mapping, validate
from .profile import ElementwiseFit, HardwareProfile, HostLink, Overheads


def list_hardware() -> list[str]:
    return canonical_names(hwprofiles_dir())


def list_host_links() -> list[str]:
    return sorted(_host_links())


def load_host_link(name: str) -> HostLink:
    presets = _host_links()
    found = presets.get(name_key(name))
    if found is None:
        raise UnknownNameError("host link", name, list(presets))
    return found.model_copy(deep=True)


DATASHEET_SUFFIX = ":datasheet"


def split_mode(name_or_path: str) -> tuple[str, bool]:
    """("a100-80gb-sxm", True) for "a100-80gb-sxm:datasheet": the pure roofline of a profile."""
    text = str(name_or_path)
    if text.lower().endswith(DATASHEET_SUFFIX):
        return text[: -len(DATASHEET_SUFFIX)], True
    base, colon, variant = text.rpartition(":")
    looks_like_file = any(sep in text for sep in "/\\") or Path(text).suffix in (".yaml", ".yml", ".json")
    if colon and base and not looks_like_file and not Path(text).exists():
        raise InfersimError(
            f"unknown variant ':{variant}' of hardware profile '{base}'; the one variant is "
            f"NAME{DATASHEET_SUFFIX} (did you mean '{base}{DATASHEET_SUFFIX}'?)"
        )
    return text, False


def profile_path(name_or_path: str) -> Path:
    name, _ = split_mode(name_or_path)
    as_path = Path(name).expanduser()
    if as_path.suffix in (".yaml", ".yml", ".json") and not as_path.exists():
        raise InfersimError(f"{as_path}: file not found")
    return resolve("hardware profile", name, hwprofiles_dir())


def load_hardware(name_or_path: str, host_link: str | None = None, all_reduce: str | None = None) -> HardwareProfile:
    """A profile by name or path. Calibrated profiles price kernels with their fitted models;
    NAME:datasheet drops the calibration and the engine overhead (the pure datasheet roofline); a derived profile's
    calibration is the measured card's fits it names in `calibration.inherits`. `host_link` and
    `all_reduce` (a workload's choices) replace the profile's own."""
    _, datasheet = split_mode(name_or_path)
    path = profile_path(name_or_path)
    profile = _load_resolved(path)
    # Profiles are mutable pydantic models; a copy keeps one caller's edits from leaking into
    # every later load of the same name.
    update = {"host_link": load_host_link(host_link)} if host_link else {}
    if all_reduce is not None:
        update["all_reduce"] = all_reduce
    if datasheet:  # named apart, so reports and plans comparing both modes tell them apart
        # the pure roofline: neither the fitted kernel models nor the engine overhead fitted on
        # end-to-end runs
        update.update(calibration=None, overheads=Overheads(status="none", source="datasheet roofline: none"))
        update["name"] = profile.name + DATASHEET_SUFFIX
    else:
        if profile.calibration is not None and profile.calibration.status == "derived":
            update["calibration"] = _inherited(profile, path)
        if profile.overheads.inherits:
            update["overheads"] = _inherited_overheads(profile, path)
    return profile.model_copy(deep=True, update=update)


OVERHEAD_NUMBERS = ("kernel_launch_us", "iteration_us", "tp_worker_us")


def _inherited_overheads(profile: HardwareProfile, path: Path) -> Overheads:
    """The engine overhead of the profile `overheads.inherits` names, under this card's own
    status and reason; numbers this card's entry sets itself stay its own (a copy of a profile
    that changes one of them keeps its change)."""
    own = profile.overheads
    parent = _load_resolved(profile_path(own.inherits)) if own.inherits != profile.name else None
    if parent is None or parent.overheads.inherits or parent.overheads.status != "measured":
        raise InfersimError(
            f"{path}: field 'overheads.inherits': '{own.inherits}' is not a profile whose own overhead is measured"
        )
    carried = {k: getattr(parent.overheads, k) for k in OVERHEAD_NUMBERS if k not in own.model_fields_set}
    if "source" not in own.model_fields_set:
        carried["source"] = f"{parent.name}'s: {parent.overheads.source}"
    return own.model_copy(update=carried)


def _load_resolved(path: Path) -> HardwareProfile:
    stat = path.stat()
    return _load(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


def _inherited(profile: HardwareProfile, path: Path):
    """The measured card's fitted models under the derived card's own status and reason."""
    own = profile.calibration
    parent = _load_resolved(profile_path(own.inherits)) if own.inherits != profile.name else None
    if parent is None or parent.calibration is None or parent.calibration.status != "measured":
        raise InfersimError(f"{path}: field 'calibration.inherits': '{own.inherits}' is not a measured profile")
    pc = parent.calibration
    gemm = pc.gemm
    if gemm is not None and gemm.measured_shapes is not None and parent.sm_count != profile.sm_count:
        # the measured staircase follows the waves of output tiles over the SMs: another SM
        # count steps elsewhere, so only the fitted model carries over
        gemm = gemm.model_copy(update={"measured_shapes": None})
    return own.model_copy(
        update={
            "gemm": gemm,
            "elementwise": {k: _cache_scaled(e, parent, profile) for k, e in pc.elementwise.items()},
            "source": own.source or f"inherited from {parent.name}: {pc.source}",
        }
    )


def _cache_scaled(fit: ElementwiseFit, parent: HardwareProfile, profile: HardwareProfile) -> ElementwiseFit:
    """An inherited elementwise fit whose cached working set is the same share of the derived
    card's own L2 (a card without a datasheet L2 keeps the measured card's)."""
    if not fit.cache_mb or not parent.l2_cache_mb or not profile.l2_cache_mb:
        return fit
    return fit.model_copy(update={"cache_mb": fit.cache_mb * (profile.l2_cache_mb / parent.l2_cache_mb)})


@lru_cache(maxsize=None)
def _load(path: str, _mtime_ns: int, _size: int) -> HardwareProfile:
    return with_shapes_path(validate(HardwareProfile, load_mapping(path), path), Path(path))


def with_shapes_path(profile: HardwareProfile, path: Path) -> HardwareProfile:
    """The profile with its measured GEMM table's file resolved against the profile's folder
    (so a derived card that inherits the fits finds it); refused in one line if missing."""
    cal = profile.calibration
    shapes = cal.gemm.measured_shapes if cal is not None and cal.gemm is not None else None
    if shapes is None:
        return profile
    file = (path.parent / shapes.file).resolve()
    if not file.is_file():
        raise InfersimError(f"{path}: field 'calibration.gemm.measured_shapes.file': {shapes.file} not found")
    gemm = cal.gemm.model_copy(update={"measured_shapes": shapes.model_copy(update={"file": str(file)})})
    return profile.model_copy(update={"calibration": cal.model_copy(update={"gemm": gemm})})


@lru_cache(maxsize=None)
def _host_links() -> dict[str, HostLink]:
    path = catalog_dir() / "host_links.yaml"
    return {
        name_key(key): validate(HostLink, entry if isinstance(entry, dict) else {}, f"{path}: {key}")
        for key, entry in load_mapping(path).items()
    }
