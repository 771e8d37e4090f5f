"""`sim calibrate`: the three table kinds, the profile it writes, and bad tables (one line,
exit 2, nothing written)."""

from pathlib import Path

import pytest
import yaml

from infersim.cli.main import main
from infersim.simulator.hardware.catalog import load_hardware

DATA = Path(__file__).resolve().parents[1] / "data"
SAMPLE = DATA / "linear_ops_a100_llama3_8b.csv"


def _calibrate(tmp_path, table, *extra):
    out = tmp_path / "out.yaml"
    return main(["calibrate", str(table), "--hardware", "a100-80gb-sxm", "--out", str(out), *extra]), out


def test_writes_profile_with_sources_rows_and_errors(tmp_path, capsys):
    rc, out = _calibrate(tmp_path, SAMPLE, "--source", "vidur sample")
    assert rc == 0
    hw = load_hardware(str(out))
    g = hw.calibration.gemm
    assert g.source == "vidur sample" and g.rows == 4 * 28 and g.fitted_on == ["meta-llama/Meta-Llama-3-8B"]
    assert set(hw.calibration.elementwise) == {"norm", "act", "rope", "add", "emb"}
    text = out.read_text()
    # the base profile's keys keep their order; calibration follows overheads
    keys = [k for k in yaml.safe_load(text)]
    assert keys.index("calibration") == keys.index("overheads") + 1
    assert "# NVIDIA A100 80GB SXM4." in text  # comments kept
    # every fitted parameter is written, the wave terms and each kind's saturation included
    written = yaml.safe_load(text)["calibration"]
    assert {"wave_exponent", "wave_latency_us", "tile_tokens", "corner_exponent"} <= set(written["gemm"])
    assert all("saturation_tokens" in e for e in written["elementwise"].values())


def test_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "out.yaml"
    out.write_text("mine\n")
    rc, _ = _calibrate(tmp_path, SAMPLE)
    assert rc == 2 and out.read_text() == "mine\n"
    assert f"--out {out}: exists; name another file, or pass --force to replace it" in capsys.readouterr().err
    rc, _ = _calibrate(tmp_path, SAMPLE, "--force")
    assert rc == 0 and load_hardware(str(out)).calibration.gemm.rows == 112


def _vidur_copy(tmp_path) -> Path:
    """The sample in vidur's own mlp.csv spelling (no device column)."""
    import pandas as pd

    d = pd.read_csv(SAMPLE)
    cols = {c: f"time_stats.{c[:-len('_median_ms')]}.median" for c in d.columns if c.endswith("_median_ms")}
    v = d.rename(columns={**cols, "tp": "num_tensor_parallel_workers"}).drop(columns=["device", "model"])
    v = v[[c for c in v.columns if not c.endswith("_std_ms")]].assign(use_gated_mlp=True, vocab_size=128256)
    path = tmp_path / "mlp.csv"
    v.to_csv(path, index=False)
    return path


def test_vidur_mlp_csv_gives_the_same_fit(tmp_path, capsys):
    path = _vidur_copy(tmp_path)
    rc, _ = _calibrate(tmp_path, path)
    assert rc == 2 and "--device" in capsys.readouterr().err  # no device column: say which
    rc, out = _calibrate(tmp_path, path, "--device", "a100")
    assert rc == 0
    (tmp_path / "b").mkdir()
    rc, ref = _calibrate(tmp_path / "b", SAMPLE)
    a, b = load_hardware(str(out)).calibration, load_hardware(str(ref)).calibration
    assert a.gemm.compute == b.gemm.compute and a.gemm.mape_pct == b.gemm.mape_pct


def _generic_lines() -> list[str]:
    """A generic GEMM table: 5 us launch + max(weights at 1.6 TB/s, FLOPs at 220 TFLOP/s)."""
    lines = ["device,op,tokens,k,n,median_ms"]
    for t in (1, 8, 64, 128, 256, 512, 1024, 2048, 4096):
        for k, n in ((4096, 4096), (4096, 11008)):
            ms = 0.005 + max(k * n * 2 / 1.6e12, 2 * t * k * n / 2.2e14) * 1e3
            lines.append(f"mygpu,gemm,{t},{k},{n},{ms:.6f}")
    return lines


def test_generic_gemm_table(tmp_path, capsys):
    path = tmp_path / "mine.csv"
    path.write_text("\n".join(_generic_lines()) + "\n")
    rc, out = _calibrate(tmp_path, path)
    assert rc == 0
    g = load_hardware(str(out)).calibration.gemm
    assert g.rows == 18 and g.mape_pct < 5


def _set(rows, i, column, value):
    header = rows[0].split(",")
    cells = rows[i].split(",")
    cells[header.index(column)] = value
    rows[i] = ",".join(cells)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda rows: _set(rows, 3, "attn_pre_proj_median_ms", "fast"), "row 4, column 'attn_pre_proj_median_ms'"),
        (lambda rows: _set(rows, 4, "mlp_act_median_ms", "-0.01"), "row 5, column 'mlp_act_median_ms'"),
        (
            lambda rows: rows.__setitem__(
                5,
                rows[5].replace(
                    "a100,meta-llama/Meta-Llama-3-8B,32,8,4096", "a100,meta-llama/Meta-Llama-3-8B,32,8,5120"
                ),
            ),
            "row 6, column 'n_embd'",
        ),
        (lambda rows: rows.__setitem__(2, rows[2].replace(",1,2,", ",3,2,", 1)), "row 3, column 'tp'"),
        (lambda rows: rows.__setitem__(0, rows[0].replace("num_tokens", "tokens_n")), "row 1, column 'num_tokens'"),
    ],
)
def test_bad_table_one_line_exit_2_nothing_written(tmp_path, capsys, edit, message):
    rows = SAMPLE.read_text().splitlines()
    edit(rows)
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(rows) + "\n")
    rc, out = _calibrate(tmp_path, bad)
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert len(err.strip().splitlines()) == 1 and str(bad) in err and message in err, err


def test_the_profile_is_named_after_its_file_or_name(tmp_path, capsys):
    """A profile of another card takes its own name (the --out stem, or --name) and leaves the
    base card's aliases behind; one written under the base's own name keeps both."""
    path = tmp_path / "mine.csv"
    path.write_text("\n".join(_generic_lines()) + "\n")
    rc, out = _calibrate(tmp_path, path)
    written = yaml.safe_load(out.read_text())
    assert rc == 0 and written["name"] == "out" and "aliases" not in written
    assert load_hardware(str(out)).name == "out"
    assert (
        main(["calibrate", str(path), "--hardware", "a100-80gb-sxm", "--out", str(out), "--name", "x1", "--force"]) == 0
    )
    assert yaml.safe_load(out.read_text())["name"] == "x1"
    same = tmp_path / "a100-80gb-sxm.yaml"
    assert main(["calibrate", str(path), "--hardware", "a100-80gb-sxm", "--out", str(same)]) == 0
    written = yaml.safe_load(same.read_text())
    assert written["name"] == "a100-80gb-sxm" and "a100-sxm" in " ".join(written["aliases"]).lower()


def _times_ms(lines: list[str], i: int, factor: float) -> str:
    cells = lines[i].split(",")
    return ",".join(cells[:-1] + [f"{float(cells[-1]) * factor:.6f}"])


@pytest.mark.parametrize(
    "edit, message",
    [
        # the 4096 x 4096 GEMM at 8 tokens timed again at 3x the first time: 0.02597 ms (5 us +
        # 33.6 MB at 1.6 TB/s) and 0.0779 ms cannot both be right
        (lambda ls: ls.insert(4, _times_ms(ls, 3, 3.0)), "row 5, column 'median_ms': 0.0779"),
        # the 4096 x 11008 GEMM at 4,096 tokens written in microseconds: 1,684 "ms" where 5 us +
        # 369 GFLOP at 220 TFLOP/s gives 1.684 ms, a thousand times what the other rows say
        (lambda ls: ls.__setitem__(18, _times_ms(ls, 18, 1000.0)), "row 19, column 'median_ms': 1684 ms is"),
        (lambda ls: ls.__setitem__(0, ls[0].replace("median_ms", "median")), "row 1, column 'median_ms': missing"),
    ],
)
def test_bad_generic_table_is_refused_and_the_old_profile_kept(tmp_path, capsys, edit, message):
    lines = _generic_lines()
    edit(lines)
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n")
    (tmp_path / "out.yaml").write_text("mine\n")
    rc, out = _calibrate(tmp_path, bad, "--force")
    err = capsys.readouterr().err
    assert rc == 2 and out.read_text() == "mine\n" and not (tmp_path / "out.gemm-shapes.csv.gz").exists()
    assert len(err.strip().splitlines()) == 1 and str(bad) in err and message in err, err


def test_repeated_measurements_that_agree_are_all_fitted(tmp_path, capsys):
    lines = _generic_lines()
    lines.insert(4, _times_ms(lines, 3, 1.2))  # a repeat 20% apart, as vidur's repeats differ
    path = tmp_path / "mine.csv"
    path.write_text("\n".join(lines) + "\n")
    rc, out = _calibrate(tmp_path, path)
    assert rc == 0 and load_hardware(str(out)).calibration.gemm.rows == 19


def test_an_elementwise_kind_with_one_row_is_named_on_stderr_and_not_fitted(tmp_path, capsys):
    """A norm measured at one size cannot give a launch cost and a bandwidth: the profile is
    written without it (`sim profile` relies on the skip), and stderr says which kind and why."""
    lines = _generic_lines()
    lines[0] += ",n_head,n_kv_head,n_embd,n_expanded_embd,tp"
    lines[1:] = [line + ",,,,," for line in lines[1:]]
    lines.append("mygpu,input_layernorm,64,,,0.004,32,8,4096,14336,1")
    path = tmp_path / "mine.csv"
    path.write_text("\n".join(lines) + "\n")
    rc, out = _calibrate(tmp_path, path)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert load_hardware(str(out)).calibration.elementwise == {}
    (note,) = captured.err.strip().splitlines()
    assert note.startswith("note: norm: 1 row (") and f"{path}, row 20" in note and "not fitted" in note, note
    # the summary lists what this run fitted: not the norm, nor the base profile's collectives
    assert "norm" not in captured.out and "all_reduce" not in captured.out and "gemm:" in captured.out


def test_sim_hardware_shows_measured_derived_and_datasheet(capsys):
    assert main(["hardware", "l40"]) == 0
    out = capsys.readouterr().out
    assert "calibration: derived, inherits a40" in out


def _collectives_table(tmp_path) -> Path:
    """A synthetic NCCL table, all-reduce over 2 and 4 NVSwitch workers at 20 us + bytes / 100 GB/s."""
    table = tmp_path / "collectives.csv"
    lines = ["setup,collective,num_workers,size,devices_per_node,max_devices_per_node,median_ms,std_ms"]
    for workers in (2, 4):
        for size in (2**k for k in range(10, 26)):
            lines.append(f"lab_dgx,all_reduce,{workers},{size},{workers},8,{(20e-6 + 2 * size / 100e9) * 1e3:.9f},0")
    table.write_text("\n".join(lines) + "\n")
    return table


def test_collective_table_fits_the_collectives_section(tmp_path, capsys):
    """`sim calibrate` recognises the NCCL layout and writes a `collectives:` section that recovers
    the table's latency and bandwidth."""
    rc, out = _calibrate(tmp_path, _collectives_table(tmp_path), "--source", "lab")
    assert rc == 0, capsys.readouterr().err
    section = load_hardware(str(out)).collectives
    assert section.setup == "lab_dgx" and section.source == "lab"
    assert [f.workers for f in section.all_reduce] == [2, 4]
    for fit in section.all_reduce:
        assert fit.rows == 16 and fit.mape_pct < 0.1
        seg = fit.segments[-1]
        assert seg.latency_us == pytest.approx(20.0, rel=1e-3) and seg.bandwidth_gbps == pytest.approx(100.0, rel=1e-3)


def test_collective_timed_twice_far_apart_is_refused_and_nothing_written(tmp_path, capsys):
    """The GEMM rule for repeats holds for collectives: the same all-reduce size timed at 2x is
    one line naming the file, the row and the column, exit status 2, no profile."""
    table = _collectives_table(tmp_path)
    lines = table.read_text().splitlines()
    cells = lines[3].split(",")
    lines.append(",".join(cells[:6] + [f"{float(cells[6]) * 2:.9f}", "0"]))
    table.write_text("\n".join(lines) + "\n")
    rc, out = _calibrate(tmp_path, table)
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists() and len(err.strip().splitlines()) == 1
    assert f"{table}: row 33 (line 34), column 'median_ms'" in err and "as row 3 (line 4," in err, err


def test_vidur_network_table_in_the_current_folder_takes_its_setup_from_device(tmp_path, capsys, monkeypatch):
    """vidur's all_reduce.csv has no setup column (its folder names the setup): a copy in the
    current folder takes the setup --device names (a bare file name has no folder to name it)."""
    rows = _collectives_table(tmp_path).read_text().splitlines()
    vidur = ["collective,num_workers,size,devices_per_node,max_devices_per_node,time_stats.all_reduce.median"]
    vidur += [",".join(r.split(",")[1:7]) for r in rows[1:]]
    (tmp_path / "all_reduce.csv").write_text("\n".join(vidur) + "\n")
    monkeypatch.chdir(tmp_path)
    argv = ["calibrate", "all_reduce.csv", "--hardware", "a100-80gb-sxm", "--device", "my_nvlink", "--out", "tp.yaml"]
    assert main(argv) == 0, capsys.readouterr().err
    section = load_hardware("tp.yaml").collectives
    assert section.setup == "my_nvlink" and section.all_reduce[-1].segments[-1].latency_us == pytest.approx(
        20.0, rel=1e-3
    )


def test_writes_the_measured_gemm_table_beside_the_profile(tmp_path, capsys):
    rc, out = _calibrate(tmp_path, SAMPLE)
    assert rc == 0
    table = tmp_path / "out.gemm-shapes.csv.gz"
    shapes = load_hardware(str(out)).calibration.gemm.measured_shapes
    assert (
        table.is_file()
        and yaml.safe_load(out.read_text())["calibration"]["gemm"]["measured_shapes"]["file"] == table.name
    )
    assert shapes.rows == 4 * 28 and shapes.mape_pct < load_hardware(str(out)).calibration.gemm.mape_pct
    assert "gemm measured shapes: 112" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["out.txt", "out.yaml/"])
def test_an_out_that_is_not_a_yaml_file_is_refused_before_reading(tmp_path, capsys, name):
    out = f"{tmp_path}/{name}"
    assert main(["calibrate", str(SAMPLE), "--hardware", "a100-80gb-sxm", "--out", out]) == 2
    assert capsys.readouterr().err.startswith(f"sim calibrate: error: --out {out}: ")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_table_is_not_overwritten_without_force(tmp_path, capsys):
    table = tmp_path / "out.gemm-shapes.csv.gz"
    table.write_bytes(b"mine")
    rc, out = _calibrate(tmp_path, SAMPLE)
    assert rc == 2 and table.read_bytes() == b"mine" and not out.exists()
    assert "refusing to overwrite" in capsys.readouterr().err


def test_a_later_step_into_another_folder_carries_the_table(tmp_path, capsys):
    """Collectives fitted onto a calibrated profile written elsewhere: the table goes along."""
    rc, first = _calibrate(tmp_path, SAMPLE)
    assert rc == 0
    table = tmp_path / "coll.csv"
    rows = ["setup,collective,num_workers,size,devices_per_node,max_devices_per_node,median_ms,std_ms"]
    rows += [f"lab_dgx,all_reduce,2,{2**k},2,8,{0.02 + k * 1e-3:.6f},0" for k in range(10, 20)]
    table.write_text("\n".join(rows) + "\n")
    other = tmp_path / "elsewhere"
    other.mkdir()
    out = other / "tp.yaml"
    assert main(["calibrate", str(table), "--hardware", str(first), "--out", str(out)]) == 0
    hw = load_hardware(str(out))
    assert (other / "tp.gemm-shapes.csv.gz").read_bytes() == (tmp_path / "out.gemm-shapes.csv.gz").read_bytes()
    assert hw.calibration.gemm.measured_shapes.rows == 112 and hw.collectives is not None


def test_a_profile_naming_a_missing_table_is_refused_in_one_line(tmp_path, capsys):
    rc, out = _calibrate(tmp_path, SAMPLE)
    assert rc == 0
    (tmp_path / "out.gemm-shapes.csv.gz").unlink()
    capsys.readouterr()
    assert (
        main(["run", "--workload", "chatbot.yaml", "--hardware", str(out), "-n", "5", "--out", str(tmp_path / "r")])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "measured_shapes.file" in err and str(out) in err


def test_plot_draws_each_kind_with_the_error_the_profile_records(tmp_path, capsys):
    """--plot writes the figure beside the profile; its panels' MAPEs are the recorded ones (the
    GEMM with measured shapes, the corrected one); an existing figure (without --force), a
    format other than PNG or SVG and a folder are refused before anything is written."""
    from infersim.simulator.calibration.calibrate import shapes_path
    from infersim.simulator.calibration.fit_plot import fit_series
    from infersim.simulator.calibration.tables import recognise
    from infersim.simulator.costmodel.measured_gemms import MeasuredGemms

    plot = tmp_path / "fit.png"
    rc, out = _calibrate(tmp_path, SAMPLE, "--plot", str(plot))
    assert rc == 0 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {plot}" in capsys.readouterr().out
    hw = load_hardware(str(out))
    series = fit_series(recognise(SAMPLE).read(SAMPLE, None), hw, MeasuredGemms.read(shapes_path(out)))
    recorded = {
        "GEMM (fitted model)": hw.calibration.gemm.mape_pct,
        "GEMM (measured shapes)": hw.calibration.gemm.measured_shapes.mape_pct,
        **{k: e.mape_pct for k, e in hw.calibration.elementwise.items()},
    }
    assert {s.title: round(s.mape_pct, 3) for s in series} == recorded

    plot.write_bytes(b"mine")
    again = tmp_path / "again" / "p.yaml"
    refusals = (
        (plot, f"--plot {plot}: exists; name another file, or pass --force"),  # left as it was
        (tmp_path / "fit.txt", "unsupported extension '.txt'; use .png, .svg"),  # matplotlib would refuse it
        (tmp_path, f"--plot {tmp_path}: is a folder; name a file (.png, .svg)"),
    )
    for bad, message in refusals:
        rc = main(["calibrate", str(SAMPLE), "--hardware", "a100-80gb-sxm", "--out", str(again), "--plot", str(bad)])
        err = capsys.readouterr().err
        assert rc == 2 and message in err and len(err.strip().splitlines()) == 1
        assert not again.exists()  # refused before anything is written
    assert plot.read_bytes() == b"mine"


def test_plot_of_a_collectives_only_table_is_refused_before_writing(tmp_path, capsys):
    rc, out = _calibrate(tmp_path, _collectives_table(tmp_path), "--plot", str(tmp_path / "fit.png"))
    err = capsys.readouterr().err
    assert rc == 2 and "no kernel rows to plot" in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "fit.png").exists()
