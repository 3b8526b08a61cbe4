#!/usr/bin/env python3
"""Captures K, V and Q from a llama2.c checkpoint into a kvq dump (schema v1).

Runs the model (numpy, fp64 arithmetic) on a prompt, or greedily from BOS, and writes for every
layer the post-RoPE K and V [1, Hkv, T, D], the query of every position Q [1, Hq, T, D] (row i is
the decode query at position i: causal attention over keys 0..i), the token ids and seq_lens.

    python data/capture_llama2c.py --model data/models/stories260K/stories260K.bin \\
        --tokenizer data/models/stories260K/tok512.bin --tokens 256 --out data/dumps/stories260k.h5
"""
import argparse
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvq_dump  # noqa: E402
# The forward pass is llama_forward's (llama2.c's defaults: RoPE base 10000 on adjacent pairs, eps
# 1e-5, fp64 arithmetic for a Checkpoint's float64 weights); the names stay importable from here.
from llama_forward import KvCache, forward, rmsnorm, rope  # noqa: E402,F401

BOS = 1


class Checkpoint:
    """A llama2.c "legacy" checkpoint: 7 int32 header fields, then fp32 weights."""

    def __init__(self, path):
        with open(path, "rb") as f:
            header = f.read(28)
            if len(header) < 28:
                raise ValueError(f"{path}: {len(header)} bytes, too short for a llama2.c header (28 bytes)")
            (self.dim, self.hidden_dim, self.n_layers, self.n_heads, self.n_kv_heads, vocab, self.seq_len) = struct.unpack(
                "7i", header)
            weights = np.frombuffer(f.read(), dtype=np.float32)
        self.shared_classifier = vocab > 0
        self.vocab_size = abs(vocab)
        if min(self.dim, self.hidden_dim, self.n_layers, self.n_heads, self.n_kv_heads, self.seq_len) <= 0 or \
                self.dim % self.n_heads or self.n_heads % self.n_kv_heads or self.dim // self.n_heads % 2:
            raise ValueError(f"{path}: implausible header dim={self.dim} heads={self.n_heads} "
                             f"kv_heads={self.n_kv_heads} "
                             "(expected heads dividing dim into an even head_dim, as RoPE rotates pairs, and kv_heads "
                             "dividing heads)")
        self.head_dim = self.dim // self.n_heads
        kv_dim = self.n_kv_heads * self.head_dim
        L, d, h = self.n_layers, self.dim, self.hidden_dim
        shapes = [("emb", (self.vocab_size, d)), ("rms_att", (L, d)), ("wq", (L, d, d)), ("wk", (L, kv_dim, d)),
                  ("wv", (L, kv_dim, d)), ("wo", (L, d, d)), ("rms_ffn", (L, d)), ("w1", (L, h, d)),
                  ("w2", (L, d, h)), ("w3", (L, h, d)), ("rms_final", (d,)),
                  ("freq_real", (self.seq_len, self.head_dim // 2)), ("freq_imag", (self.seq_len, self.head_dim // 2))]
        if not self.shared_classifier:
            shapes.append(("wcls", (self.vocab_size, d)))
        offset = 0
        for name, shape in shapes:
            n = int(np.prod(shape))
            if offset + n > weights.size:
                raise ValueError(f"{path}: truncated: weights end before {name} (need {offset + n} floats, "
                                 f"have {weights.size})")
            setattr(self, name, weights[offset:offset + n].reshape(shape).astype(np.float64))
            offset += n
        if self.shared_classifier:
            self.wcls = self.emb


class Tokenizer:
    """llama2.c tokenizer.bin: int32 max_token_length, then per token (float32 score, int32 length, bytes)."""

    def __init__(self, path, vocab_size):
        self.pieces, self.scores = [], []
        with open(path, "rb") as f:
            f.read(4)
            for i in range(vocab_size):
                head = f.read(8)
                if len(head) < 8:
                    raise ValueError(f"{path}: truncated at token {i} of {vocab_size}")
                score, length = struct.unpack("fi", head)
                self.scores.append(score)
                self.pieces.append(f.read(length))
        self.lookup = {p: i for i, p in enumerate(self.pieces)}

    def piece_bytes(self, token):
        p = self.pieces[token]
        if len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">"):  # raw byte tokens like <0x0A>
            return bytes([int(p[3:5], 16)])
        return p

    def decode(self, tokens):
        return b"".join(self.piece_bytes(t) for t in tokens if t != BOS).decode("utf-8", errors="replace")

    def encode(self, text):
        """BOS, a dummy-prefix space, characters (bytes as <0xXX> fallback), then greedy best-score merges."""
        ids = [BOS]
        if text:
            ids.append(self.lookup[b" "])
        for ch in text:
            b = ch.encode("utf-8")
            if b in self.lookup:
                ids.append(self.lookup[b])
            else:
                ids.extend(byte + 3 for byte in b)
        while True:
            best, best_i, best_id = -1e10, -1, -1
            for i in range(1, len(ids) - 1):  # never merge into BOS
                merged = self.pieces[ids[i]] + self.pieces[ids[i + 1]]
                j = self.lookup.get(merged, -1)
                if j >= 0 and self.scores[j] > best:
                    best, best_i, best_id = self.scores[j], i, j
            if best_i < 0:
                return ids
            ids[best_i:best_i + 2] = [best_id]


def run(model, tokens_in, total):
    """Feeds tokens_in, then greedy argmax tokens until `total` positions. Returns the tokens and the
    per-layer K, V [Hkv, T, D] and Q [Hq, T, D] (post-RoPE)."""
    cache = KvCache(model, total)
    Q = np.zeros((model.n_layers, model.n_heads, total, model.head_dim))
    tokens = list(tokens_in[:total])
    for pos in range(total):
        logits = forward(model, tokens[pos], pos, cache, Q)
        if pos + 1 < total and pos + 1 >= len(tokens):
            tokens.append(int(np.argmax(logits)))
    return tokens, cache.k, cache.v, Q


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="llama2.c checkpoint (.bin)")
    ap.add_argument("--tokenizer", required=True, help="llama2.c tokenizer (.bin)")
    ap.add_argument("--prompt", default="", help="text to feed after BOS; empty: greedy from BOS")
    ap.add_argument("--tokens", type=int, help="positions T to capture (prompt + greedy; default: 256, or the "
                                               "model's context if shorter)")
    ap.add_argument("--dtype", default="float32", choices=kvq_dump.DTYPES, help="stored dtype")
    ap.add_argument("--out", required=True, help="output dump (.h5)")
    args = ap.parse_args(argv)

    try:
        model = Checkpoint(args.model)
        tok = Tokenizer(args.tokenizer, model.vocab_size)
    except (OSError, ValueError) as e:  # a missing or foreign file: one line, not a traceback
        print(f"kvq capture: error: {e}", file=sys.stderr)
        return 2
    prompt = tok.encode(args.prompt) if args.prompt else [BOS]
    if args.tokens is None:  # the default must suit a model of a shorter context too
        args.tokens = min(256, model.seq_len)
    if not 1 <= args.tokens <= model.seq_len:
        ap.error(f"--tokens {args.tokens}: the model's context is 1..{model.seq_len}")
    if len(prompt) > args.tokens:
        ap.error(f"the prompt is {len(prompt)} tokens, more than --tokens {args.tokens}")
    tokens, K, V, Q = run(model, prompt, args.tokens)
    name = os.path.splitext(os.path.basename(args.model))[0]
    prompt_desc = f"prompt {args.prompt!r}" if args.prompt else "greedy from BOS"
    layers = [{"k": K[l][None], "v": V[l][None], "q": Q[l][None], "num_q_heads": model.n_heads}
              for l in range(model.n_layers)]
    kvq_dump.write_dump(args.out, layers, source=f"llama2.c:{name} ({prompt_desc}, {args.tokens} tokens)",
                        created_by="kvq data/capture_llama2c.py", rope="post",
                        seq_lens=[args.tokens], tokens=[tokens], dtype=args.dtype)
    print(f"wrote {args.out}: {model.n_layers} layers, T={args.tokens}, Hq={model.n_heads}, Hkv={model.n_kv_heads}, "
          f"D={model.head_dim}")
    print(f"text: {tok.decode(tokens)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
