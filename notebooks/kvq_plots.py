#!/usr/bin/env python3
"""Figures from kvq results: what quantizing the KV cache costs, for readers who never saw the code.

    python notebooks/kvq_plots.py results/sweep --dump data/dumps/stories260k.h5

reads sweep.csv (and sweep_heads.csv) from the results directory and writes PNGs to
RESULTS/plots: error vs group size, SQNR per layer, per-head error heatmap, K per-channel
magnitude (needs --dump), and the error vs latency trade-off (error vs memory until a GPU run adds
latency columns) with its Pareto front.
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

FAMILY_STYLE = {  # (code format, asymmetric) -> colour, marker
    ("int8", 0): ("tab:blue", "o"), ("int8", 1): ("tab:cyan", "s"), ("int4", 0): ("tab:red", "o"),
    ("int4", 1): ("tab:orange", "s"), ("fp8-e4m3", 0): ("tab:purple", "D"), ("fp8-e5m2", 0): ("tab:pink", "D")}


def code_format(scheme):
    """int8, int4, fp8-e4m3 or fp8-e5m2 from a scheme name."""
    parts = scheme.split("+")[0].split("-")
    return "-".join(parts[:2]) if parts[0] == "fp8" else parts[0]


def modifiers(scheme):
    """The modifiers of a scheme name, e.g. '+had' or '+w128', '' for none."""
    return "".join("+" + m for m in scheme.split("+")[1:])


def load(results_dir):
    """(sweep rows, per-head rows or None) from a kvq sweep output directory."""
    csv = os.path.join(results_dir, "sweep.csv")
    if not os.path.exists(csv):
        raise FileNotFoundError(f"{csv}: no sweep results here (run kvq sweep --out {results_dir})")
    rows = pd.read_csv(csv)
    heads_csv = os.path.join(results_dir, "sweep_heads.csv")
    heads = pd.read_csv(heads_csv) if os.path.exists(heads_csv) else None
    return rows, heads


def family_label(fmt, asym, mods=""):
    """e.g. 'int4 asymmetric', 'int4 asymmetric +had' (rotated), 'fp8-e4m3' (FP8 is symmetric only)."""
    label = fmt if fmt.startswith("fp8") else f"{fmt} {'asymmetric' if asym else 'symmetric'}"
    return f"{label} {mods}" if mods else label


def pareto_front(x, y):
    """Indices of the points no other point beats on both x and y (lower is better), by x."""
    order = np.lexsort((np.asarray(y), np.asarray(x)))
    front, best_y = [], np.inf
    for i in order:
        if y[i] < best_y:
            front.append(int(i))
            best_y = y[i]
    return front


def _save(fig, out_dir, name):
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_error_vs_group_size(rows, out_dir):
    """Reconstruction error of K and V against how many elements share one scale."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, t in zip(axes, ("k", "v")):
        per_scheme = (rows.groupby([f"{t}_scheme", f"{t}_bits", f"{t}_asym", f"{t}_granularity", f"{t}_group_elems"])
                      [f"{t}_sqnr_db"].mean().reset_index())
        per_scheme["rel_rms"] = 10 ** (-per_scheme[f"{t}_sqnr_db"] / 20)  # ||x - x'|| / ||x||
        per_scheme["format"] = per_scheme[f"{t}_scheme"].map(code_format)
        per_scheme["mods"] = per_scheme[f"{t}_scheme"].map(modifiers)
        per_scheme = per_scheme[per_scheme["rel_rms"] > 0]  # a window over every token: lossless, off the log axis
        for (fmt, asym, mods), g in per_scheme.groupby(["format", f"{t}_asym", "mods"]):
            colour, marker = FAMILY_STYLE.get((fmt, asym), ("gray", "x"))
            line = g[g[f"{t}_granularity"] != "channel"].sort_values(f"{t}_group_elems")
            # Rotated (+had) and windowed (+wW) families: the same colour, dashed / dotted.
            ax.plot(line[f"{t}_group_elems"], line["rel_rms"], marker=marker, color=colour,
                    linestyle="--" if "+had" in mods else ":" if mods else "-", label=family_label(fmt, asym, mods))
            names = {"group": None, "none": "scale-free"}  # none: FP8 without a scale, at the tensor's size
            for _, r in line.iterrows():
                gran = r[f"{t}_granularity"]
                ax.annotate(names.get(gran, gran) or f"g{r[f'{t}_group_elems']}",
                            (r[f"{t}_group_elems"], r["rel_rms"]), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, color=colour)
            chan = g[g[f"{t}_granularity"] == "channel"]
            if len(chan):
                ax.scatter(chan[f"{t}_group_elems"], chan["rel_rms"], marker="*", s=140, color=colour,
                           edgecolor="black", zorder=5, label=f"{family_label(fmt, asym, mods)}, per-channel")
                for _, r in chan.iterrows():
                    ax.annotate(r[f"{t}_scheme"].split("-", 1)[1], (r[f"{t}_group_elems"], r["rel_rms"]),
                                textcoords="offset points", xytext=(6, -10), fontsize=7, color=colour)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("elements sharing one scale (log scale)")
        ax.set_title(f"{t.upper()} reconstruction error")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("relative RMS error ||x - x'|| / ||x||  (log scale)")
    fig.suptitle("Quantization error vs scale-group size (mean over layers): smaller groups cost memory, save error")
    return _save(fig, out_dir, "error_vs_group_size.png")


def scheme_style(scheme, asym, granularity, group_elems):
    """Colour by granularity (and group size); solid int8, dashed int4, dotted FP8; circle symmetric, square
    asymmetric, triangle rotated (+had), diamond windowed (+wW)."""
    order = ["tensor", "token", "head", "g64", "g32", "g16", "g8", "channel"]
    key = f"g{group_elems}" if granularity == "group" else granularity
    colour = plt.get_cmap("tab10")(order.index(key) if key in order else 9)
    fmt, mods = code_format(scheme), modifiers(scheme)
    marker = "^" if "+had" in mods else "D" if "+w" in mods else "s" if asym else "o"
    return {"color": colour, "linestyle": ":" if fmt.startswith("fp8") else "-" if fmt == "int8" else "--",
            "marker": marker}


def plot_sqnr_per_layer(rows, out_dir):
    """SQNR of every K and V scheme, layer by layer."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    handles = {}
    for ax, t in zip(axes, ("k", "v")):
        per = rows.groupby([f"{t}_scheme", "layer"])[f"{t}_sqnr_db"].mean().reset_index()
        for scheme, g in per.groupby(f"{t}_scheme"):
            first = rows[rows[f"{t}_scheme"] == scheme].iloc[0]
            style = scheme_style(scheme, first[f"{t}_asym"], first[f"{t}_granularity"], first[f"{t}_group_elems"])
            (line,) = ax.plot(g["layer"], g[f"{t}_sqnr_db"], label=scheme, **style)
            handles.setdefault(scheme, line)
        ax.set_xlabel("layer")
        ax.set_xticks(sorted(rows["layer"].unique()))
        ax.set_title(f"{t.upper()} reconstruction SQNR")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("SQNR (dB, higher is better)")
    names = sorted(handles)
    fig.legend([handles[n] for n in names], names, fontsize=7, ncol=1, loc="center left", bbox_to_anchor=(0.91, 0.5),
               title="scheme (solid int8, dashed int4, dotted FP8;\n^ +had, diamond +wW)", title_fontsize=7)
    fig.suptitle("SQNR per layer: 10 log10(sum x^2 / sum (x - x')^2)")
    fig.subplots_adjust(right=0.9)
    return _save(fig, out_dir, "sqnr_per_layer.png")


def default_heatmap_pair(rows):
    """The int4 per-head asymmetric pair if present (a typical candidate), else the first pair."""
    for k in ("int4-head-asym", "int4-g32-asym", "int8-head"):
        match = rows[(rows.k_scheme == k) & (rows.v_scheme == k)]
        if len(match):
            return k, k
    return rows.k_scheme.iloc[0], rows.v_scheme.iloc[0]


def plot_head_heatmap(heads, k_scheme, v_scheme, out_dir):
    """Attention output rel-L2 of every (layer, query head), averaged over the batch."""
    sel = heads[(heads.k_scheme == k_scheme) & (heads.v_scheme == v_scheme)]
    if sel.empty:
        raise ValueError(f"--pair {k_scheme}/{v_scheme}: no per-head results for that pair in the sweep")
    grid = sel.groupby(["layer", "q_head"])["rel_l2"].mean().unstack("q_head")
    fig, ax = plt.subplots(figsize=(1.2 + 0.45 * grid.shape[1], 1.2 + 0.45 * grid.shape[0]))
    values = grid.to_numpy(dtype=float)
    positive = values[np.isfinite(values) & (values > 0)]
    norm = matplotlib.colors.LogNorm(vmin=positive.min(), vmax=positive.max()) if positive.size else None
    im = ax.imshow(values, cmap="magma_r", norm=norm, aspect="auto")
    ax.set_xticks(range(grid.shape[1]), grid.columns)
    ax.set_yticks(range(grid.shape[0]), grid.index)
    ax.set_xlabel("query head")
    ax.set_ylabel("layer")
    fig.colorbar(im, ax=ax, label="attention output rel-L2  ||O' - O|| / ||O||")
    ax.set_title(f"Per-head attention error, K {k_scheme} / V {v_scheme}")
    return _save(fig, out_dir, "head_error_heatmap.png")


def dump_source(f):
    source = f.attrs.get("source", "")
    return source.decode("utf-8") if isinstance(source, bytes) else str(source)


def plot_k_channel_magnitude(dump_path, out_dir, swept_sources=None):
    """max |K| of every channel in every layer: per-channel outliers show as bright columns.
    swept_sources: the sweep's sources; a dump that is not one of them is refused (its figure would
    sit among another capture's)."""
    import h5py
    try:
        f = h5py.File(dump_path, "r")
    except OSError as e:
        raise ValueError(f"--dump {dump_path}: not a readable HDF5 file ({e})") from None
    with f:
        if "layers" not in f or not len(f["layers"]):
            raise ValueError(f"--dump {dump_path}: no /layers group (not a kvq dump)")
        if swept_sources is not None and dump_source(f) not in swept_sources:
            raise ValueError(f"--dump {dump_path}: its source {dump_source(f)!r} is not one the sweep swept "
                             f"({', '.join(map(repr, sorted(swept_sources)))})")
        layers = sorted(f["layers"], key=int)
        seq_lens = f["seq_lens"][...] if "seq_lens" in f else None
        rows = []
        for name in layers:
            k = f[f"layers/{name}/k"].astype("float32")[...]
            if seq_lens is not None:  # padding may hold anything
                mask = np.arange(k.shape[2])[None, :] < seq_lens[:, None]
                k = np.where(mask[:, None, :, None], k, 0.0)
            rows.append(np.nanmax(np.abs(k), axis=(0, 1, 2)))
        source = dump_source(f)
    grid = np.stack(rows)
    fig, ax = plt.subplots(figsize=(max(6, 0.09 * grid.shape[1] + 3), 1.5 + 0.4 * grid.shape[0]))
    im = ax.imshow(grid, cmap="viridis", aspect="auto")
    ax.set_yticks(range(len(layers)), layers)
    ax.set_xlabel("K channel (index along head_dim)")
    ax.set_ylabel("layer")
    fig.colorbar(im, ax=ax, label="max |K| over batch, heads and tokens")
    ax.set_title(f"K per-channel magnitude: outlier channels favour per-channel K\n{source}", fontsize=9)
    return _save(fig, out_dir, "k_channel_magnitude.png")


def tradeoff_x_column(rows):
    """latency_us when a GPU run filled it, else memory."""
    has_latency = "latency_us" in rows.columns and rows["latency_us"].notna().any()
    return "latency_us" if has_latency else "kv_bits_per_element"


def plot_tradeoff(rows, out_dir):
    """Attention error vs latency (when the results have latency_us) or memory, Pareto front marked."""
    xcol = tradeoff_x_column(rows)
    has_latency = xcol == "latency_us"
    # pairs no decode kernel reads (e.g. per-channel K) have no latency: they are left out of this figure
    pairs = rows.dropna(subset=["out_rel_l2_mean", xcol]).groupby(["k_scheme", "v_scheme"])[[xcol, "out_rel_l2_mean"]].mean()
    if pairs.empty:
        raise ValueError("no attention metrics in the results (the dumps had no decode queries)")
    pairs = pairs.reset_index()
    x, y = pairs[xcol].to_numpy(), pairs["out_rel_l2_mean"].to_numpy()
    front = pareto_front(x, y)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ax.scatter(x, y, color="lightgray", edgecolor="gray", label="scheme pair (K / V)")
    ax.plot(x[front], y[front], "-o", color="tab:green", label="Pareto front: nothing is both smaller and better")
    for i in front:
        label = pairs.k_scheme[i] if pairs.k_scheme[i] == pairs.v_scheme[i] else f"{pairs.k_scheme[i]} / {pairs.v_scheme[i]}"
        ax.annotate(label, (x[i], y[i]), textcoords="offset points", xytext=(5, 3), fontsize=8, color="tab:green")
    ax.set_yscale("log")
    shape = rows["latency_shape"].dropna().iloc[0] if has_latency and "latency_shape" in rows.columns else ""
    ax.set_xlabel(f"decode latency at {shape} (us, GPU)" if has_latency
                  else "bits per element, K and V averaged (incl. scales)")
    ax.set_ylabel("attention output rel-L2 vs fp64 reference\n(mean over heads and layers, log scale)")
    ax.set_title("Error vs latency" if has_latency else "Error vs memory (latency columns come with a GPU run)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out_dir, "tradeoff.png")


def rank_correlation(x, y):
    """Spearman's rank correlation (ties broken by order; enough for a figure's caption)."""
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1]) if len(x) > 2 else float("nan")


def plot_eval(rows, out_dir, title=""):
    """End-to-end KL divergence vs memory (kvq eval), with the attention-level rel-L2 of the same
    pairs beside it on the same axis: how well the cheap proxy ranks the pairs."""
    rows = pd.DataFrame(rows)
    x = rows["kv_bits_per_element"].to_numpy()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), sharex=True)
    for ax, column, label in ((axes[0], "kld_mean", "end to end: mean KL(P_fp || P_q) of next-token\ndistributions (nats)"),
                              (axes[1], "out_rel_l2_mean", "attention level: output rel-L2 vs fp64 reference\n"
                                                           "(mean over heads and layers)")):
        y = rows[column].to_numpy()
        for i, r in rows.iterrows():
            k = r.k_scheme
            bits = (8 if "int8" in k or k.startswith("q8_0") else 80 if "fp8" in k
                    else 4 if "int4" in k or k.startswith(("q4_", "q5_", "iq4_nl", "mxfp4", "nvfp4")) else 16)
            color = {8: "tab:blue", 4: "tab:red", 80: "tab:purple", 16: "gray"}[bits]
            ax.scatter(x[i], y[i], color=color, edgecolor="black", linewidth=0.5, zorder=3)
            name = r.k_scheme if r.k_scheme == r.v_scheme else f"{r.k_scheme} / {r.v_scheme}"
            ax.annotate(name, (x[i], y[i]), textcoords="offset points", xytext=(4, 2), fontsize=7)
        positive = y[y > 0]
        ax.set_yscale("symlog", linthresh=positive.min() if len(positive) else 1e-12)  # exact pairs (0) stay visible
        ax.set_xlabel("bits per element, K and V averaged (incl. scales)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    both = (rows["kld_mean"] > 0) & (rows["out_rel_l2_mean"] > 0)
    rho = rank_correlation(rows.loc[both, "kld_mean"].to_numpy(), rows.loc[both, "out_rel_l2_mean"].to_numpy())
    fig.suptitle(f"{title}: KV cache quantized on append\nrank correlation of the two errors over the pairs: {rho:.2f}")
    return _save(fig, out_dir, "eval.png")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="directory holding sweep.csv (kvq sweep --out)")
    ap.add_argument("--dump", help="the dump that was swept, for the K channel-magnitude figure")
    ap.add_argument("--pair", help="K/V pair for the head heatmap, e.g. int4-head-asym/int8-head")
    ap.add_argument("--out", help="output directory (default RESULTS/plots)")
    args = ap.parse_args(argv)
    if args.pair is not None and len(args.pair.split("/")) != 2:
        ap.error(f"--pair {args.pair!r}: expected K/V, e.g. int4-head-asym/int8-head")
    try:
        rows, heads = load(args.results)
    except FileNotFoundError as e:
        print(f"kvq_plots: {e}", file=sys.stderr)
        return 3
    out = args.out or os.path.join(args.results, "plots")
    os.makedirs(out, exist_ok=True)
    try:
        written = [plot_error_vs_group_size(rows, out), plot_sqnr_per_layer(rows, out)]
        if rows["out_rel_l2_mean"].notna().any():
            written.append(plot_tradeoff(rows, out))
            if heads is not None and len(heads):
                k, v = args.pair.split("/") if args.pair else default_heatmap_pair(rows)
                written.append(plot_head_heatmap(heads, k, v, out))
        else:
            print("kvq_plots: no attention metrics (no decode queries): skipping the trade-off and head figures")
        if args.dump:
            written.append(plot_k_channel_magnitude(args.dump, out, set(rows["source"].astype(str))))
    except ValueError as e:
        print(f"kvq_plots: {e}", file=sys.stderr)
        return 3
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
