"""The models kvq eval's GPU engine runs (gpu_engine.py), each a ModelAdapter: forward(tokens,
attend) -> final hidden states [T, hidden] with every layer's attention through attend(layer, q, k,
v, scale) (q [Hq, T, D], k / v [Hkv, T, D], post-RoPE, as the model caches them), and logits(hidden)
-> float32 [rows, vocab].

- HfModel: a Hugging Face Llama-family causal LM; kvq's attention goes in through transformers'
  AttentionInterface, so the model's own projections, RoPE and MLP run as the model defines them.
- GgufModel: a Llama GGUF file (data/gguf_llama.py's tensors, put on the GPU once), the numpy
  whole-sequence forward pass (llama_forward.forward_sequence) in torch, in either channel order.
- random_hf_model: a model of a published config with random weights (timing models no one can
  download here), and train_tokenizer: a BPE tokenizer trained on the text itself.

place_layers spreads a model's layers over the GPUs of one host (a model larger than one GPU).
"""
import math

import numpy as np
import torch

import llama_forward as lf

# Published configs (config.json of meta-llama/Meta-Llama-3-8B, Llama-3.2-1B, Meta-Llama-3-70B).
_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
CONFIGS = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
                      max_position_embeddings=8192, tie_word_embeddings=False),
    "llama3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, head_dim=64, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
                        max_position_embeddings=131072, tie_word_embeddings=True, rope_scaling=_LLAMA3_ROPE),
    "llama3-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
                       max_position_embeddings=8192, tie_word_embeddings=False),
}

_ATTENTION_NAME = "kvq_gpu_engine"
_attend = None  # the attend function of the forward pass that is running


def _engine_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    if kwargs.get("sliding_window"):
        raise RuntimeError(f"layer {module.layer_idx}: sliding-window attention; kvq eval's GPU engine runs full "
                           "causal attention only")
    if query.shape[0] != 1:
        raise RuntimeError(f"layer {module.layer_idx}: batch {query.shape[0]}; the engine runs one sequence")
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    out = _attend(module.layer_idx, query[0], key[0], value[0], scale)
    return out.to(query.dtype).transpose(0, 1)[None], None  # [1, T, Hq, D]


def _register():
    from transformers import AttentionInterface
    AttentionInterface.register(_ATTENTION_NAME, _engine_attention)


def _to_device(obj, device):
    if torch.is_tensor(obj):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def layer_devices(n_layers, devices):
    """Layer i's device: consecutive runs of layers, as even as the count allows."""
    return [devices[i * len(devices) // n_layers] for i in range(n_layers)]


def place_layers(model, devices):
    """A Hugging Face Llama-family model over `devices` (torch devices of one host): embeddings and
    the first layers on the first, the final norm and output projection with the last; each layer
    moves its inputs to its device (a forward pre-hook), so the forward pass is unchanged."""
    decoder = model.get_decoder()
    layers = decoder.layers
    placement = layer_devices(len(layers), devices)
    decoder.embed_tokens.to(devices[0])
    if getattr(decoder, "rotary_emb", None) is not None:
        decoder.rotary_emb.to(devices[0])
    for layer, device in zip(layers, placement):
        layer.to(device)
        layer.register_forward_pre_hook(lambda m, args, kwargs, d=device: (_to_device(args, d), _to_device(kwargs, d)),
                                        with_kwargs=True)
    decoder.norm.to(devices[-1])
    decoder.norm.register_forward_pre_hook(lambda m, args, d=devices[-1]: _to_device(args, d))
    model.get_output_embeddings().to(devices[-1])
    return placement


class HfModel:
    """A Hugging Face causal LM (Llama family: a decoder with embed_tokens, layers and norm, and an
    output projection) run whole-sequence with kvq's attention."""

    def __init__(self, model):
        _register()
        self.model = model.eval()
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()
        self.vocab_size = int(self.head.weight.shape[0])
        self.n_layers = model.config.num_hidden_layers

    def forward(self, tokens, attend):
        global _attend
        self.model.set_attn_implementation(_ATTENTION_NAME)
        device = self.decoder.embed_tokens.weight.device
        _attend = attend
        try:
            out = self.decoder(input_ids=torch.tensor([list(tokens)], device=device), use_cache=False)
        finally:
            _attend = None
        return out.last_hidden_state[0]

    def logits(self, hidden):
        return self.head(hidden.to(self.head.weight.device)).float()


class GgufModel:
    """A GgufLlama (data/gguf_llama.py) on the GPU: llama_forward.forward_sequence's arithmetic in
    torch, in `dtype` (float32; float64 for comparisons free of float32's rounding noise), each
    layer's tensors on its device (layer_devices over `devices`)."""

    def __init__(self, m, devices, dtype=torch.float32):
        self.dtype = dtype
        self.theta, self.eps, self.order = lf.model_rope(m)
        self.n_layers, self.head_dim, self.n_heads, self.n_kv_heads = m.n_layers, m.head_dim, m.n_heads, m.n_kv_heads
        self.devices = layer_devices(m.n_layers, devices)
        host = np.float64 if dtype == torch.float64 else np.float32
        put = lambda a, d: torch.from_numpy(np.array(a, dtype=host)).to(d)  # noqa: E731 (a copy: a memory-mapped file is read-only)
        self.emb = put(m.emb, devices[0])
        self.layers = [{name: put(getattr(m, name)[i], d) for name in ("rms_att", "wq", "wk", "wv", "wo", "rms_ffn",
                                                                      "w1", "w2", "w3")}
                       for i, d in enumerate(self.devices)]
        self.rms_final, self.wcls = put(m.rms_final, devices[-1]), put(m.wcls, devices[-1])
        self.vocab_size = int(self.wcls.shape[0])

    def _rmsnorm(self, x, w):
        return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + self.eps) * w

    def forward(self, tokens, attend):
        T, hd = len(tokens), self.head_dim
        angle = lf.rope_angles(np.arange(T), hd, self.theta)
        host = np.float64 if self.dtype == torch.float64 else np.float32
        cos, sin = np.cos(angle).astype(host), np.sin(angle).astype(host)
        scale = float(host(1.0 / np.sqrt(hd)))
        x = self.emb[torch.as_tensor(np.asarray(tokens, dtype=np.int64), device=self.emb.device)]
        tables = {d: (torch.from_numpy(cos).to(d), torch.from_numpy(sin).to(d)) for d in set(self.devices)}
        for i, (w, device) in enumerate(zip(self.layers, self.devices)):
            x = x.to(device)
            c, s = tables[device]
            xb = self._rmsnorm(x, w["rms_att"])
            q = lf.rope_rows((xb @ w["wq"].T).reshape(T, self.n_heads, hd), c, s, self.order).transpose(0, 1)
            k = lf.rope_rows((xb @ w["wk"].T).reshape(T, self.n_kv_heads, hd), c, s, self.order).transpose(0, 1)
            k = k.contiguous()
            v = (xb @ w["wv"].T).reshape(T, self.n_kv_heads, hd).transpose(0, 1).contiguous()
            out = attend(i, q.contiguous(), k, v, scale)
            x = x + out.transpose(0, 1).reshape(T, self.n_heads * hd) @ w["wo"].T
            xb = self._rmsnorm(x, w["rms_ffn"])
            h1, h3 = xb @ w["w1"].T, xb @ w["w3"].T
            x = x + (h1 / (1.0 + torch.exp(-h1)) * h3) @ w["w2"].T
        return self._rmsnorm(x.to(self.rms_final.device), self.rms_final)

    def logits(self, hidden):
        return hidden.to(self.wcls.device) @ self.wcls.T


def random_hf_model(config, dtype=torch.bfloat16, seed=0, device="cuda:0"):
    """A LlamaForCausalLM of `config` (a CONFIGS name or a dict of LlamaConfig fields) with random
    weights (the model's own initialisation, seeded), made on `device` in `dtype`."""
    from transformers import LlamaConfig, LlamaForCausalLM
    fields = CONFIGS[config] if isinstance(config, str) else config
    cfg = LlamaConfig(**fields)
    torch.manual_seed(seed)
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(saved)
    return model.to(dtype).eval()


class TrainedTokenizer:
    """A byte-level BPE tokenizer trained on a text (tokenizers), for models with random weights."""

    def __init__(self, text, vocab_size):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        self.tokenizer = Tokenizer(models.BPE())
        self.tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self.tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        self.tokenizer.train_from_iterator(text.splitlines(), trainer)

    def encode(self, text):
        return self.tokenizer.encode(text).ids
