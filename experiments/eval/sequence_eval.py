"""kvq eval's whole-sequence path: a model run over a text with every layer's K/V cache in a storage,
all positions of a layer at once (float32 matrix products) instead of token by token.

It gives what quantize-on-append (kvq.AppendQuantizer) gives, because a token's stored value does
not depend on when it is read, only whether it is quantized yet: per-token, per-head and per-group
codes are those of quantizing the whole cache; a chan-t<N> group is quantized once its N-th token
arrives; a +w<W> window keeps a token as computed until W newer ones follow it. So for query t,
token j reads the whole-cache quantized value when j < quantized_prefix[t], else the value the
model computed. tests/python/test_eval.py checks this path against the token-by-token one. (nvfp4's
per-tensor scale is the one exception: here it comes from the layer's whole K or V, as a scale
calibrated on the same text would; appending needs it given.)
"""
import numpy as np

import kvq
import llama_forward as lf

STORAGES = ("none", "fp32", "fp16", "bf16")  # cache storages besides kvq schemes ('none': as computed)


def quantized_prefix(name, T):
    """[T]: how many of the tokens 0..t a storage holds quantized when the query at position t reads
    the cache (the others are read as computed)."""
    total = np.arange(1, T + 1)
    if name in STORAGES:
        return total
    s = kvq.parse_scheme(name)
    quantized = total if s.window is None else np.maximum(0, total - s.window)
    if s.granularity == "channel":
        quantized = quantized // s.group * s.group
    return quantized


def stored_whole(x, name):
    """The whole cache x [B, H, T, D] (float32) as a storage holds it, quantized in one call (as kvq sweep does),
    in x's basis (+had: rotated back)."""
    if name == "none":
        return x
    if name in STORAGES:
        return kvq.round_to_format(x, name)
    r = kvq.quantize(x, name)
    return (kvq.hadamard_rotate_back(r.dequantized, r.scheme.rotation_block(x.shape[-1])) if r.scheme.hadamard
            else r.dequantized)


def stored_values(x, name):
    """x [H, T, D] as the storage holds it once quantized (float32; "none": x itself), in x's basis
    (+had rotated back)."""
    if name not in STORAGES and "+w" in name:  # the window only decides when a token is quantized
        name = kvq.parse_scheme(name).without_window.name
    stored = stored_whole(x[None], name)[0]
    return stored if name == "none" else stored.astype(np.float32, copy=False)


class CacheView:
    """What attention reads of one layer's K or V in a storage: stored values where quantized, the
    computed ones elsewhere."""

    def __init__(self, x, name):
        x = np.ascontiguousarray(x)
        T = x.shape[1]
        self.raw, self.stored = x, stored_values(x, name)
        prefix = quantized_prefix(name, T)
        self.mixed = bool(np.any(prefix < np.arange(1, T + 1)))
        # mask[t, j]: query t reads token j quantized
        self.mask = np.arange(T)[None, :] < prefix[:, None] if self.mixed else None


def attend(q, k, v, scale, block=512):
    """Causal attention of q [Hq, T, D] over CacheViews k, v [Hkv, T, D] (GQA by head groups)."""
    if not k.mixed and not v.mixed:
        return lf.causal_attention(q, k.stored, v.stored, scale, block)
    Hq, T, D = q.shape
    Hkv = k.raw.shape[0]
    qg = q.reshape(Hkv, Hq // Hkv, T, D)
    out = np.empty_like(qg)
    for start in range(0, T, block):  # llama_forward.causal_attention's blocks, two key sets masked in
        stop = min(T, start + block)
        rows = slice(start, stop)
        s = qg[:, :, rows] @ k.stored[:, None, :stop].transpose(0, 1, 3, 2)
        if k.mixed:
            s = np.where(k.mask[rows, :stop], s, qg[:, :, rows] @ k.raw[:, None, :stop].transpose(0, 1, 3, 2))
        s *= scale
        s[..., np.triu(np.ones((stop - start, stop), bool), k=start + 1)] = -np.inf
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        if v.mixed:
            m = v.mask[rows, :stop]
            out[:, :, rows] = np.where(m, p, 0) @ v.stored[:, None, :stop] + np.where(m, 0, p) @ v.raw[:, None, :stop]
        else:
            out[:, :, rows] = p @ v.stored[:, None, :stop]
    return out.reshape(Hq, T, D)


def run_sequence(m, tokens, k_name, v_name, record=False, kernel=None, dtype=np.float32, convert_input=None):
    """Logits [T, vocab] of the model over tokens with every layer's K in storage k_name and V in
    v_name (llama_forward.forward_sequence in `dtype`, attending through CacheViews, or through
    `kernel`, a kernel_attention.KernelAttention; convert_input: llamacpp_runtime.MatmulInputs or
    None); with record, every layer's {"q", "k", "v"} [1, H, T, D] as computed."""
    def attend_stored(q, k, v, scale):
        return attend(q, CacheView(k, k_name), CacheView(v, v_name), scale)

    logits, Q, K, V = lf.forward_sequence(m, tokens, record=record, attend=kernel or attend_stored, dtype=dtype,
                                          convert_input=convert_input)
    layers = None
    if record:
        layers = [{"q": Q[i][None], "k": K[i][None], "v": V[i][None], "softmax_scale": 0.0} for i in range(m.n_layers)]
    return logits, layers
