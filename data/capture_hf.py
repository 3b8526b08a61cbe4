#!/usr/bin/env python3
"""Captures K, V and Q from a Hugging Face causal LM into a kvq dump (schema v1).

Any model whose attention goes through transformers' AttentionInterface (Llama, Mistral, Qwen,
Gemma, Phi-3, ... with grouped-query attention too) works: kvq registers its own attention function,
records the query, key and value each layer hands to it (K/V exactly as the model caches them,
post-RoPE for rotary models) and then runs PyTorch SDPA as usual.

    python data/capture_hf.py --model meta-llama/Llama-3.2-1B --text story.txt --max-tokens 2048 \\
        --out llama32.h5

Needs torch and transformers (not installed by kvq's set-up: pip install torch transformers).
Without them the module still imports, so that main() can check its arguments and the model name
and say what is missing in one line (capture.py and kvq_eval.py route here).
"""
import argparse
import difflib
import os
import sys

import numpy as np

try:
    import torch
    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
except ImportError as e:
    MISSING = str(e)  # e.g. "No module named 'transformers'"; main() reports it after the argument checks
else:
    MISSING = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvq_dump  # noqa: E402

_CAPTURE_NAME = "kvq_capture"
_records = None  # layer index -> dict, filled while a capture runs


def _capturing_attention(module, query, key, value, attention_mask, **kwargs):
    out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if _records is not None:
        _records[module.layer_idx] = {"q": query.detach(), "k": key.detach(), "v": value.detach(),
                                      "scaling": kwargs.get("scaling"), "out": out.detach()}
    return out, weights


if MISSING is None:
    AttentionInterface.register(_CAPTURE_NAME, _capturing_attention)

# ---- quantize-on-append (experiments/eval/kvq_eval.py) --------------------------------------------
# A second attention function keeps each layer's K and V in a kvq cache storage (kvq.cache_storage:
# quantized as tokens are appended) and attends over what that storage holds. The model's own
# cache still grows as usual; only the new tokens' K/V are taken from it. Attention runs in fp32
# (dequantized values are exact in fp32, not in bf16) for the reference run and the quantized
# runs alike, so the difference between them is the cache's alone.
_EVAL_NAME = "kvq_quantized_cache"
_eval_state = None  # a StoredKvState while kvq eval runs the model


class _StoredTensor:
    """One layer's K or V as its storage holds it: fp32 [B, H, T, D] on the model's device."""

    def __init__(self, storage):
        self.storage, self.tokens, self.values = storage, 0, None

    def append(self, x):
        start, stored = self.storage.append(x.float().cpu().numpy())
        stored = torch.from_numpy(np.ascontiguousarray(stored, dtype=np.float32)).to(x.device)
        end = start + stored.shape[2]
        if self.values is None or end > self.values.shape[2]:  # grow by doubling: appends stay O(1) amortized
            grown = torch.empty((*x.shape[:2], max(2 * end, 16), x.shape[3]), dtype=torch.float32, device=x.device)
            if self.values is not None:
                grown[:, :, :self.tokens] = self.values[:, :, :self.tokens]
            self.values = grown
        self.values[:, :, start:end] = stored
        self.tokens = end
        return self.values[:, :, :end]


class StoredKvState:
    """Every layer's K and V storage for one run; `storages(layer)` makes a layer's (K, V) pair.
    With record=True it also keeps every layer's queries and softmax scale (for kvq's attention-level
    error on the same cache)."""

    def __init__(self, storages, record=False):
        self.make, self.layers, self.record = storages, {}, record
        self.queries, self.scaling = {}, {}

    def update(self, layer, query, key, value):
        if layer not in self.layers:
            k_store, v_store = self.make(layer)
            self.layers[layer] = (_StoredTensor(k_store), _StoredTensor(v_store))
        k, v = self.layers[layer]
        new = query.shape[2]
        if key.shape[2] != k.tokens + new:
            raise RuntimeError(f"layer {layer}: attention got {key.shape[2]} keys, kvq's cache expected {k.tokens + new} "
                               "(kvq eval needs a cache that grows by the new tokens: no sliding window or cache reuse)")
        if self.record:
            self.queries.setdefault(layer, []).append(query.float().cpu())
        return k.append(key[:, :, -new:]), v.append(value[:, :, -new:])


def _stored_kv_attention(module, query, key, value, attention_mask, **kwargs):
    key, value = _eval_state.update(module.layer_idx, query, key, value)
    if _eval_state.record:
        _eval_state.scaling[module.layer_idx] = kwargs.get("scaling")
    if attention_mask is not None and attention_mask.dtype.is_floating_point:
        attention_mask = attention_mask.float()
    out, weights = sdpa_attention_forward(module, query.float(), key, value, attention_mask, **kwargs)
    return out.to(query.dtype), weights


if MISSING is None:
    AttentionInterface.register(_EVAL_NAME, _stored_kv_attention)


def run_stored(model, tokens, storages, record=False):
    """Feeds tokens one at a time (a decode step per token, the model's own cache growing) with
    every layer's K/V kept by storages(layer) -> (K storage, V storage). Returns the next-token
    logits [T, vocab] (float64) and the StoredKvState."""
    global _eval_state
    model.set_attn_implementation(_EVAL_NAME)
    state = _eval_state = StoredKvState(storages, record)
    device = next(model.parameters()).device
    ids = torch.tensor([tokens], dtype=torch.long, device=device)
    logits, past = [], None
    try:
        with torch.inference_mode():
            for pos in range(ids.shape[1]):
                out = model(input_ids=ids[:, pos:pos + 1], past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits.append(out.logits[0, -1].double().cpu().numpy())
    finally:
        _eval_state = None
    n_layers = model.config.num_hidden_layers
    if sorted(state.layers) != list(range(n_layers)):
        raise RuntimeError(f"{type(model).__name__}: kvq's attention saw layers {sorted(state.layers)} of {n_layers}: "
                           "this model does not route attention through transformers' AttentionInterface")
    return np.stack(logits), state


def rope_of(model):
    """post: the model applies rotary embeddings before caching K; none: it has no rotary embedding."""
    for module in model.modules():
        if hasattr(sys.modules.get(type(module).__module__), "apply_rotary_pos_emb") and hasattr(module, "layer_idx"):
            return "post"
    return "none"


def capture(model, input_ids):
    """Runs one forward pass over input_ids [1, T]; returns per-layer records (q, k, v as
    [1, H, T, D] tensors, the softmax scaling, the attention output) and the model's own cache."""
    global _records
    model.set_attn_implementation(_CAPTURE_NAME)
    _records = {}
    try:
        with torch.inference_mode():
            outputs = model(input_ids=input_ids, use_cache=True)
        records = _records
    finally:
        _records = None
    n_layers = model.config.num_hidden_layers
    if sorted(records) != list(range(n_layers)):
        raise RuntimeError(f"{type(model).__name__}: captured layers {sorted(records)} of {n_layers}: this model does "
                           "not route attention through transformers' AttentionInterface, so kvq cannot capture it")
    return [records[i] for i in range(n_layers)], outputs.past_key_values


def why_not_loadable(model, bundled=()):
    """'' when transformers may load `model` here, else one line saying why not: a name that reached
    the Hugging Face path by a typo (of a bundled name, or of a file's extension) should not end in
    'No module named transformers'. bundled: the model names the calling tool knows."""
    if os.path.isfile(model):  # from_pretrained takes an id or a folder, never a file
        return (f"--model {model}: a file, but not a GGUF (.gguf) or llama2.c (.bin) one (a Hugging Face model is "
                "an id or a folder)")
    if MISSING is None:
        return ""
    need = f"needs torch and transformers, not installed here ({MISSING}): pip install torch transformers"
    if os.path.isdir(model):
        return f"--model {model}: a Hugging Face model folder {need}"
    close = difflib.get_close_matches(model.lower(), bundled, n=1)
    return (f"--model {model}: neither a file nor a bundled model ({', '.join(bundled)})"
            + (f" (did you mean {close[0]}?)" if close else "") + f"; as a Hugging Face model id it {need}")


def to_numpy(t):
    return t.to(torch.float32).cpu().numpy()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face model name or local directory")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="UTF-8 text file to run the model on")
    src.add_argument("--prompt", help="text given on the command line")
    ap.add_argument("--max-tokens", type=int, default=2048, help="truncate the tokenized text to this many tokens "
                                                                 "(default: %(default)s)")
    ap.add_argument("--dtype", choices=("model",) + kvq_dump.DTYPES, default="model",
                    help="stored dtype; 'model' keeps the model's own (exact)")
    ap.add_argument("--torch-dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    ap.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    ap.add_argument("--out", required=True, help="output dump (.h5)")
    args = ap.parse_args(argv)

    # checked before the model loads (and where torch or transformers is missing too)
    if args.max_tokens < 1:  # a negative slice bound would drop tokens from the end
        ap.error(f"--max-tokens {args.max_tokens}: expected at least 1")
    text = kvq_dump.read_text_option(ap, args.text) if args.text is not None else args.prompt
    import gguf_llama  # the names capture.py routes to a GGUF file: a typo of one ends here
    why = why_not_loadable(args.model, gguf_llama.DEFAULT_NAMES)
    if why:
        print(f"kvq capture: error: {why}", file=sys.stderr)
        return 2
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :args.max_tokens]
    if ids.shape[1] == 0:
        ap.error("the text gives no tokens")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=args.torch_dtype).to(args.device).eval()
    records, _ = capture(model, ids.to(args.device))

    model_dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(model.dtype)
    dtype = model_dtype if args.dtype == "model" else args.dtype
    if dtype is None:
        ap.error(f"the model's dtype {model.dtype} has no kvq storage type: pass --dtype")
    layers = [{"k": to_numpy(r["k"]), "v": to_numpy(r["v"]), "q": to_numpy(r["q"]), "num_q_heads": r["q"].shape[1],
               "softmax_scale": r["scaling"]} for r in records]
    rope = rope_of(model)
    kvq_dump.write_dump(args.out, layers, source=f"hf:{args.model} ({kvq_dump.text_source(args.prompt, args.text)}, "
                                                  f"{ids.shape[1]} tokens, {model.dtype})",
                        created_by="kvq data/capture_hf.py", rope=rope, seq_lens=[ids.shape[1]],
                        tokens=ids.numpy().astype(np.int32), dtype=dtype)
    k = layers[0]["k"]
    print(f"wrote {args.out}: {len(layers)} layers, T={k.shape[2]}, Hq={layers[0]['num_q_heads']}, Hkv={k.shape[1]}, "
          f"D={k.shape[3]}, K {rope}-RoPE, stored as {dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
