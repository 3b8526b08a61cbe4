"""The two engines kvq eval runs a pair with, behind one interface:

    engine.reference(tokens) -> ref          the window's reference run (kept while its pairs run)
    engine.pair(ref, tokens, k, v) -> (windows.PositionMetrics, attention-level error dict)

CpuEngine wraps kvq_eval's runners (numpy: GGUF whole-sequence, llama2.c and Hugging Face token by
token, the oracle); GpuEngine runs gpu_engine.py over a gpu_models adapter. Both attributes
source, kv_heads, head_dim, context, cache_bits and tokenize() describe the model.
"""
import os

import numpy as np

import kvq
import sequence_eval
import windows as win


def attention_error(layers, k_name, v_name):
    """kvq sweep's attention-level error on the reference run's cache: every position's query over
    the float32 cache, original vs stored; rel-L2 over heads, mean over layers of the per-layer mean
    and max over layers of the per-layer max."""
    means, maxes = [], []
    for layer in layers:
        q, k, v = (layer[n].astype(np.float32) for n in ("q", "k", "v"))
        scale = layer["softmax_scale"]
        if "o_ref" not in layer:  # the same for every pair: computed once per layer
            layer["o_ref"] = kvq.attention(q, k, v, softmax_scale=scale)[0]
        o, _ = kvq.attention(q, sequence_eval.stored_whole(k, k_name), sequence_eval.stored_whole(v, v_name),
                             softmax_scale=scale)
        e = kvq.output_error(o, layer["o_ref"])
        means.append(e.rel_l2_mean)
        maxes.append(e.rel_l2_max)
    return {"out_rel_l2_mean": float(np.mean(means)), "out_rel_l2_max": float(np.max(maxes))}


class CpuEngine:
    """A kvq_eval runner (GgufRunner, Llama2cRunner, HfRunner): a pair costs runner.run."""
    name = "cpu"

    def __init__(self, runner):
        self.runner = runner
        for attr in ("source", "kv_heads", "head_dim", "context", "cache_bits"):
            setattr(self, attr, getattr(runner, attr))
        # the cache the reference run keeps: as computed, or the runtime's default (llama.cpp: f16)
        self.reference_storage = getattr(runner, "reference_storage", ("none", "none"))

    def tokenize(self, text):
        return self.runner.tokenize(text)

    def reference(self, tokens):
        logits, layers = self.runner.run(tokens, *self.reference_storage, record=True)
        return {"ref": win.Reference(logits, tokens), "layers": layers}

    def pair(self, ref, tokens, k_name, v_name):
        logits, _ = self.runner.run(tokens, k_name, v_name)
        self.last_logits = logits  # --attention kvq compares the kernel's run with it
        return win.position_metrics(ref["ref"], logits, tokens), attention_error(ref["layers"], k_name, v_name)


class GpuEngine:
    """gpu_engine.py over a gpu_models adapter (HfModel or GgufModel)."""
    name = "gpu"

    def __init__(self, model, source, kv_heads, head_dim, context, cache_bits, tokenizer):
        self.model, self.source, self.kv_heads, self.head_dim = model, source, kv_heads, head_dim
        self.context, self.cache_bits, self.tokenizer = context, cache_bits, tokenizer

    def tokenize(self, text):
        return self.tokenizer.encode(text)

    def reference(self, tokens):
        import gpu_engine
        return gpu_engine.run_reference(self.model, tokens)

    def pair(self, ref, tokens, k_name, v_name):
        import gpu_engine
        return gpu_engine.run_pair(self.model, ref, k_name, v_name)


def gpu_devices(count):
    import torch
    available = torch.cuda.device_count()
    if count > available:
        raise ValueError(f"--gpus {count}: this machine has {available} CUDA device(s)")
    return [torch.device("cuda", i) for i in range(count)]


def gguf_gpu_engine(model, rope_order, gpus, precision="float32"):
    """A Llama GGUF file on the GPU(s): its tensors (gguf_llama's float32) moved there once, in
    `precision` (float32, or float64 for comparisons free of float32's rounding noise)."""
    import gguf_llama
    import gpu_models
    import torch
    path = gguf_llama.find_model(model)
    m = gguf_llama.GgufLlama(path, rope_order=rope_order)
    dtype = {"float32": torch.float32, "float64": torch.float64}[precision]
    return GpuEngine(gpu_models.GgufModel(m, gpu_devices(gpus), dtype),
                     f"gguf:{os.path.splitext(os.path.basename(path))[0]}", m.n_kv_heads, m.head_dim, m.seq_len,
                     8 * dtype.itemsize, m.tokenizer)


def hf_gpu_engine(name, torch_dtype, gpus, text=None, seed=0, vocab=32000):
    """A Hugging Face model (a name or directory) or random:<config> (gpu_models.CONFIGS, random
    weights, a tokenizer trained on `text`) on the GPU(s)."""
    import torch
    import gpu_models
    dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[torch_dtype]
    devices = gpu_devices(gpus)
    if name.startswith("random:"):
        preset = name.split(":", 1)[1]
        if preset not in gpu_models.CONFIGS:
            raise ValueError(f"--model {name}: expected random:<{'|'.join(gpu_models.CONFIGS)}>")
        model = gpu_models.random_hf_model(preset, dtype or torch.bfloat16, seed, devices[0])
        tokenizer = gpu_models.TrainedTokenizer(text, vocab)
        source = f"random:{preset} (seed {seed}, {model.dtype})"
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype or "auto")
        model = model.to(devices[0]) if len(devices) == 1 else model
        hf_tokenizer = AutoTokenizer.from_pretrained(name)
        tokenizer = type("HfTokenizer", (), {"encode": lambda self, t: list(hf_tokenizer(t).input_ids)})()
        source = f"hf:{name} ({model.dtype})"
    if len(devices) > 1:
        gpu_models.place_layers(model, devices)
    c = model.config
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return GpuEngine(gpu_models.HfModel(model), source, kv_heads, head_dim, getattr(c, "max_position_embeddings", None),
                     torch.finfo(model.dtype).bits, tokenizer)
