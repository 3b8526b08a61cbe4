#!/usr/bin/env python3
"""The main job's answer: which K/V cache scheme pair to adopt for a model, per KL budget.

    python experiments/eval/which_scheme.py results/eval/eval.csv --sweep results/sweep/sweep.csv \\
        --max-kld 1e-3,1e-2

For each budget (mean KL(P_fp || P_q) of the next-token distributions, nats, from kvq eval) it
picks the pair with the fewest bits per element within it (ties: lower KLD), and prints its bits,
end-to-end KLD, top-1 agreement, perplexity change and attention-level error (kvq sweep's rel-L2 of
the attention output, mean over layers). With the sweep it also says, per layer, where the
attention-level proxy would pick a cheaper or a dearer pair than the global one: the smallest pair
whose rel-L2 on that layer stays within the global pick's mean rel-L2. That per-layer plan is the
proxy's suggestion, not an end-to-end measurement (kvq eval quantizes every layer alike). Last, how
well the proxy ranks the pairs: Spearman's rank correlation between each layer's rel-L2 and the
end-to-end KLD over the pairs both measured.
"""
import argparse
import csv
import sys
from collections import defaultdict

from kvq import llamacpp


NUMERIC = ("kv_bits_per_element", "kld_mean", "top1_agreement", "ppl_delta", "out_rel_l2_mean")  # eval.csv's


def read_csv(path, needed, expected=None):
    """The rows of the CSV at `path`; ValueError naming the columns of `needed` it lacks (and what the
    file should have been, `expected`)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = set(needed) - set(reader.fieldnames or [])
        if missing:
            hint = f" (expected {expected})" if expected else ""
            raise ValueError(f"{path}: no column {', '.join(sorted(missing))}{hint}")
        return list(reader)


def pick(rows, budget):
    within = [r for r in rows if float(r["kld_mean"]) <= budget and r["k_scheme"] != "none"]
    return min(within, key=lambda r: (float(r["kv_bits_per_element"]), float(r["kld_mean"]))) if within else None


def llamacpp_flags(row):
    """How llama.cpp runs the row's pair ('-ctk ... -ctv ...', with LLAMA_ATTN_ROT_DISABLE=1 where
    kvq evaluated the unrotated types), or None: not a llama.cpp cache, or a row without head_dim."""
    try:
        return llamacpp.describe_pair(row["k_scheme"], row["v_scheme"], int(row.get("head_dim") or 0))
    except ValueError:
        return None


def model_of(source):
    """The model a results row came from: its source without the details in parentheses (a capture's
    'gguf:SmolLM2-135M-Instruct.Q4_1 (kvq_essays.txt, 1024 tokens, ...)' and an eval's
    'gguf:SmolLM2-135M-Instruct.Q4_1' are one model)."""
    return source.split(" (")[0]


def rows_of_model(path, rows, source):
    """kvq sweep's rows at `path` that are of `source`'s model; ValueError if none is: another model's
    attention error beside this one's end-to-end numbers would read as a prediction of them."""
    mine = [r for r in rows if model_of(r["source"]) == model_of(source)]
    if not mine:
        models = sorted({model_of(r["source"]) for r in rows})
        raise ValueError(f"{path}: kvq sweep results of {', '.join(models) or 'no model'}, not of "
                         f"{model_of(source)} (the evaluated model): give the sweep of this model's capture")
    return mine


def sweep_table(path, source):
    """{(K, V): {layer: (rel-L2 mean, bits)}} over the rows with attention metrics, of `source`'s model;
    a layer swept in several dumps (captures of several texts) gets the mean over them."""
    per_layer = defaultdict(lambda: defaultdict(list))
    rows = read_csv(path, ("source", "layer", "k_scheme", "v_scheme", "out_rel_l2_mean", "kv_bits_per_element"))
    for r in rows_of_model(path, rows, source):
        if r["out_rel_l2_mean"]:
            per_layer[(r["k_scheme"], r["v_scheme"])][int(r["layer"])].append(
                (float(r["out_rel_l2_mean"]), float(r["kv_bits_per_element"])))
    return {pair: {layer: (sum(e for e, _ in v) / len(v), v[0][1]) for layer, v in layers.items()}
            for pair, layers in per_layer.items()}


def layer_plan(table, pair, candidates):
    """Per layer: the fewest-bits pair among candidates whose rel-L2 there is <= the pair's mean
    rel-L2 over layers. Returns (that mean, [(layer, pair, bits, rel-L2, the pair's own rel-L2)])."""
    errors = table.get(pair)
    if not errors:
        return None, []
    target = sum(e for e, _ in errors.values()) / len(errors)
    plan = []
    for layer in sorted(errors):
        options = [(table[p][layer][1], table[p][layer][0], p) for p in candidates
                   if p in table and layer in table[p] and table[p][layer][0] <= target]
        bits, err, best = min(options, default=(errors[layer][1], errors[layer][0], pair))
        plan.append((layer, best, bits, err, errors[layer][0]))
    return target, plan


def layer_list(layers):
    """[1, 2, 3, 7] -> '1-3, 7'"""
    runs, start = [], None
    for i, layer in enumerate(layers):
        if start is None:
            start = layer
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            runs.append(f"{start}" if start == layer else f"{start}-{layer}")
            start = None
    return ", ".join(runs)


def ranks(values):
    """Ranks 1..n, ties sharing their mean rank (for Spearman's correlation)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x, y):
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else float("nan")


def proxy_correlation(rows, table):
    """{layer: Spearman(rel-L2 on that layer, end-to-end KLD)} over the quantized pairs in both."""
    kld = {(r["k_scheme"], r["v_scheme"]): float(r["kld_mean"]) for r in rows}
    layers = sorted({layer for errors in table.values() for layer in errors})
    out, counts = {}, set()
    for layer in layers:
        pairs = [p for p in kld if p in table and layer in table[p]]
        if len(pairs) >= 3:
            out[layer] = spearman([table[p][layer][0] for p in pairs], [kld[p] for p in pairs])
            counts.add(len(pairs))
    return out, max(counts, default=0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("eval_csv", help="kvq eval results (eval.csv)")
    ap.add_argument("--sweep", help="kvq sweep results (sweep.csv) of the same model's capture")
    ap.add_argument("--max-kld", default="1e-3,1e-2", help="KL budgets in nats, comma-separated (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        budgets = [float(b) for b in args.max_kld.split(",")]
        if not all(b >= 0 for b in budgets):  # NaN too: it would hold no pair, as if none were good enough
            raise ValueError
    except ValueError:
        ap.error(f"--max-kld {args.max_kld!r}: expected non-negative numbers, comma-separated")
    try:
        rows = read_csv(args.eval_csv, ("source", "k_scheme", "v_scheme") + NUMERIC)
        if not rows:
            raise ValueError(f"{args.eval_csv}: no rows")
        for line, r in enumerate(rows, start=2):  # every number is read later: a bad one is named now
            for column in NUMERIC:
                try:
                    float(r[column])
                except (TypeError, ValueError):
                    raise ValueError(f"{args.eval_csv}: line {line}, column {column}: expected a number, got "
                                     f"{r[column]!r}") from None
        table = sweep_table(args.sweep, rows[0]["source"]) if args.sweep else {}
    except (OSError, ValueError) as e:
        print(f"which_scheme: error: {e}", file=sys.stderr)
        return 2
    print(f"Which KV cache scheme for {rows[0]['source']} ({rows[0].get('tokens', '?')} tokens evaluated)?")
    # A GGUF model is llama.cpp's: its answer also names llama.cpp's cache types as llama.cpp runs them
    # (quantized types rotated where head_dim % 64 == 0; kvq.llamacpp).
    gguf = rows[0]["source"].startswith("gguf:") and bool(rows[0].get("head_dim"))
    for budget in budgets:
        best = pick(rows, budget)
        print(f"\nKLD budget {budget:g} nats:")
        if best is None:
            print("  no scheme pair stays within it")
            continue
        pair = (best["k_scheme"], best["v_scheme"])
        sweep_err = table.get(pair)
        sweep_mean = (f", sweep rel-L2 {sum(e for e, _ in sweep_err.values()) / len(sweep_err):.3e} over "
                      f"{len(sweep_err)} layers") if sweep_err else ""
        print(f"  K {pair[0]}, V {pair[1]}: {float(best['kv_bits_per_element']):.2f} bits per element, "
              f"KLD {float(best['kld_mean']):.3e}, top-1 {float(best['top1_agreement']):.3f}, "
              f"ppl {float(best['ppl_delta']):+.4f}, attention rel-L2 {float(best['out_rel_l2_mean']):.3e}{sweep_mean}")
        if gguf:  # a llama.cpp user's answer: the fewest-bits pair llama.cpp itself can run, as it runs it
            runnable = [r for r in rows if llamacpp_flags(r) and r["k_scheme"] != "none"]
            mine = pick(runnable, budget)
            if mine is None:
                print("  in llama.cpp: no cache type pair evaluated stays within it")
            else:
                print(f"  in llama.cpp: {llamacpp_flags(mine)} (kvq: K {mine['k_scheme']}, V {mine['v_scheme']}), "
                      f"{float(mine['kv_bits_per_element']):.2f} bits per element, KLD {float(mine['kld_mean']):.3e}")
        candidates = {(r["k_scheme"], r["v_scheme"]) for r in rows}  # what kvq eval can run: no per-tensor
        target, plan = layer_plan(table, pair, candidates)
        by_pair = defaultdict(list)
        for layer, p, bits, _, _ in plan:
            by_pair[(p, bits)].append(layer)
        if len(by_pair) == 1 and plan:
            print(f"  per layer (attention proxy, rel-L2 <= {target:.3e}): the same pair is the smallest on every layer")
        elif plan:
            print(f"  per layer, the attention proxy's suggestion (the fewest bits with rel-L2 <= the pick's mean, "
                  f"{target:.3e}; bits at the sweep's cache length):")
            for (p, bits), layers in sorted(by_pair.items(), key=lambda item: (item[0][1], item[1])):
                print(f"    K {p[0]}, V {p[1]} ({bits:.2f} bits): layers {layer_list(layers)}")
    rho, n_pairs = proxy_correlation(rows, table)
    if rho:
        worst = min(rho, key=rho.get)
        print(f"\nHow well attention rel-L2 ranks the pairs by end-to-end KLD (Spearman over {n_pairs} pairs, per "
              f"layer): mean {sum(rho.values()) / len(rho):.3f}, lowest {rho[worst]:.3f} (layer {worst}), highest "
              f"{max(rho.values()):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
