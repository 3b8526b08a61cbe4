"""The plotting module and notebooks over sweep results. KVQ_BIN names the kvq binary."""
import os
import subprocess
import sys

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "notebooks"))
import kvq_plots  # noqa: E402

BUNDLED_DUMP = os.path.join(ROOT, "data", "dumps", "stories260k.h5")
BUNDLED_RESULTS = os.path.join(ROOT, "experiments", "results", "stories260k")


def kvq(*args):
    binary = os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True)


def test_pareto_front_keeps_exactly_the_undominated_points():
    x = np.array([4.0, 4.5, 5.0, 8.0, 8.0, 9.0, 12.0])
    y = np.array([0.9, 0.95, 0.2, 0.1, 0.3, 0.01, 0.02])
    assert kvq_plots.pareto_front(x, y) == [0, 2, 3, 5]


def test_all_figures_are_drawn_from_the_bundled_results(tmp_path):
    assert kvq_plots.main([BUNDLED_RESULTS, "--dump", BUNDLED_DUMP, "--out", str(tmp_path)]) == 0
    names = ["error_vs_group_size.png", "sqnr_per_layer.png", "tradeoff.png", "head_error_heatmap.png",
             "k_channel_magnitude.png"]
    for name in names:
        img = matplotlib.image.imread(tmp_path / name)
        assert img.shape[0] > 300 and img.shape[1] > 500, name
        assert img[..., :3].std() > 0.05, f"{name} is blank"


def test_tradeoff_uses_latency_when_the_results_have_it(tmp_path):
    rows, _ = kvq_plots.load(BUNDLED_RESULTS)
    rows["latency_us"] = rows["kv_bits_per_element"] * 3.0
    path = kvq_plots.plot_tradeoff(rows, str(tmp_path))
    assert os.path.exists(path)
    assert kvq_plots.tradeoff_x_column(rows) == "latency_us"
    assert kvq_plots.tradeoff_x_column(rows.drop(columns="latency_us")) == "kv_bits_per_element"


def test_missing_results_give_a_clear_error(tmp_path, capsys):
    assert kvq_plots.main([str(tmp_path)]) == 3
    assert "no sweep results here" in capsys.readouterr().err


def test_a_dump_or_pair_the_sweep_does_not_have_is_refused(tmp_path, capsys):
    out = ["--out", str(tmp_path / "plots")]
    (tmp_path / "not.h5").write_text("x")
    assert kvq_plots.main([BUNDLED_RESULTS, "--dump", str(tmp_path / "not.h5")] + out) == 3
    assert "not.h5: not a readable HDF5 file" in capsys.readouterr().err
    other = tmp_path / "other.h5"  # a dump the bundled results did not sweep
    assert kvq("synth", "--out", other, "--tokens", "16", "--head-dim", "16", "--q-heads", "2", "--kv-heads", "1").returncode == 0
    assert kvq_plots.main([BUNDLED_RESULTS, "--dump", str(other)] + out) == 3
    assert "its source 'synthetic:llm-shaped(" in capsys.readouterr().err
    assert not (tmp_path / "plots" / "k_channel_magnitude.png").exists()
    assert kvq_plots.main([BUNDLED_RESULTS, "--pair", "int8-head/int5-head"] + out) == 3
    assert "--pair int8-head/int5-head: no per-head results for that pair" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kvq_plots.main([BUNDLED_RESULTS, "--pair", "int8-head"] + out)
    assert "expected K/V" in capsys.readouterr().err


def test_bundled_results_are_current(tmp_path):
    """The committed results equal a fresh sweep of the bundled dump (regenerate them after a metric change:
    build/experiments/kvq sweep --out experiments/results/stories260k)."""
    r = kvq("sweep", "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    meta = pd.read_json(tmp_path / "sweep.json")  # pandas reads the metadata directly, a row per source
    assert meta.loc[0, "source"].startswith("llama2.c:stories260K") and meta.loc[0, "result_rows"] == 110
    assert {"kvq_version", "kvq_commit", "cpu", "hostname", "file"} <= set(meta.columns)
    for name in ("sweep.csv", "sweep_heads.csv"):
        fresh, committed = pd.read_csv(tmp_path / name), pd.read_csv(os.path.join(BUNDLED_RESULTS, name))
        assert list(fresh.columns) == list(committed.columns) and len(fresh) == len(committed), name
        for col in fresh.columns:
            if fresh[col].dtype.kind == "f":
                np.testing.assert_allclose(fresh[col], committed[col], rtol=1e-9, equal_nan=True, err_msg=col)
            else:
                assert (fresh[col] == committed[col]).all(), col


@pytest.mark.parametrize("notebook", ["error_vs_group_size.ipynb", "tradeoff.ipynb"])
def test_notebooks_execute_headless(tmp_path, notebook):
    r = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute", "--output-dir",
                        str(tmp_path), os.path.join(ROOT, "notebooks", notebook)],
                       capture_output=True, text=True, env={**os.environ, "KVQ_FIGURES": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    import nbformat
    nb = nbformat.read(tmp_path / notebook, 4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2
