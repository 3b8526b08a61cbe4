"""kvq eval's GPU engine: a pair costs one whole-sequence forward pass on the GPU, every position of a
layer at once, with the quantize-on-append rule of the CPU path (sequence_eval.py): query t reads
token j quantized once j < quantized_prefix[t], else as computed. The quantized values are kvq's GPU
quantize kernels' codes dequantized by the codec's own arithmetic (kvq.gpu.quantize / dequantize,
bit-exact with kvq.quantize); attention runs in float32 (TF32 off) in query blocks sized so that no
T x T score matrix is ever held; the next-token metrics are computed from logits in chunks of
positions. The model is a ModelAdapter (gpu_models.py: Hugging Face or GGUF):

    forward(tokens, attend) -> final hidden states [T, hidden]; attend(layer, q, k, v, scale) -> o
    logits(hidden[rows]) -> float32 [rows, vocab]
"""
import contextlib
import math

import numpy as np
import torch

import kvq
import kvq.gpu
import sequence_eval
import windows as win

FLOAT_STORAGES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SCORE_BYTES = 1 << 29  # a query block's float32 scores (and as much again for the probabilities)


@contextlib.contextmanager
def float32_arithmetic():
    """cuBLAS in float32 (no TF32 in the matrix products), whatever the caller set."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def hadamard_back(x, block=0):
    """kvq.hadamard_rotate_back along the last axis of x (float32), in blocks of `block` elements (0:
    the whole row): quant/hadamard.hpp's butterflies in float64, in its order, so the same bits as
    the CPU's."""
    D = x.shape[-1]
    block = block or D
    y = x.double()
    h = 1
    while h < block:  # strides below the block pair elements within a block only
        pairs = y.reshape(*y.shape[:-1], D // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).reshape(y.shape)
        h *= 2
    return (y * (1.0 / math.sqrt(block))).float()


def base_scheme(name):
    """The scheme a +w<W> storage quantizes its tokens with: the window only decides when."""
    return kvq.parse_scheme(name).without_window.name if "+w" in name else name


def quantized(x, name):
    """x [H, T, D] (a CUDA tensor; float64 is rounded to float32 first, as kvq.quantize does) through
    kvq.gpu.quantize: the Cache and the stored values (float32, the rotated basis for +had)."""
    cache = kvq.gpu.quantize((x.float() if x.dtype == torch.float64 else x)[None], name)
    return cache, kvq.gpu.dequantize(cache)[0]


def compute_dtype(x):
    """Attention's arithmetic for inputs of x's dtype: float32, or float64 for a float64 model."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def stored_values(x, name):
    """One layer's K or V x [H, T, D] as the storage holds it once quantized, in x's basis (+had
    rotated back), in compute_dtype(x): sequence_eval.stored_values on the GPU."""
    dtype = compute_dtype(x)
    if name == "none":
        return x.to(dtype)
    if name in FLOAT_STORAGES:
        return x.to(FLOAT_STORAGES[name]).to(dtype)
    scheme = kvq.parse_scheme(name)
    _, values = quantized(x, base_scheme(name))
    return (hadamard_back(values, scheme.rotation_block(values.shape[-1])) if scheme.hadamard else values).to(dtype)


class CacheView:
    """What attention reads of one layer's K or V: stored values where quantized, computed ones
    elsewhere (prefix[t]: how many of tokens 0..t query t reads quantized). whole: every query reads
    the cache as quantizing it whole leaves it (kvq sweep's view: a +w<W> window's last W tokens raw)."""

    def __init__(self, x, name, whole=False):
        T = x.shape[1]
        self.raw = x.to(compute_dtype(x))
        self.stored = self.raw if name == "none" else stored_values(x, name)
        if whole:  # groups.hpp's quantized_length: all T without a window
            windowed = name not in sequence_eval.STORAGES and kvq.parse_scheme(name).window is not None
            prefix = np.full(T, sequence_eval.quantized_prefix(name, T)[-1] if windowed else T)
        else:
            prefix = sequence_eval.quantized_prefix(name, T)
        self.mixed = bool(np.any(prefix < T if whole else prefix < np.arange(1, T + 1)))
        self.prefix_host = prefix
        self.prefix = torch.from_numpy(prefix).to(x.device)

    def band_start(self, start, stop):
        """The first key that queries start..stop-1 may read unquantized (prefix is non-decreasing)."""
        return min(int(self.prefix_host[start]), stop)


def query_block(Hq, T, itemsize=4):
    return max(1, min(T, SCORE_BYTES // (itemsize * Hq * T)))


def attend(q, k, v, scale):
    """Causal attention of q [Hq, T, D] (float32, or float64) over CacheViews k, v [Hkv, T, D] (GQA
    by head groups) in q's dtype, in query blocks; the computed values enter only in the band of keys
    a block's queries read unquantized (prefix[first row] .. last row). Returns [Hq, T, D]."""
    Hq, T, D = q.shape
    Hkv = k.raw.shape[0]
    qg = q.reshape(Hkv, Hq // Hkv, T, D)
    out = torch.empty_like(qg)
    block = query_block(Hq, T, q.element_size())
    for start in range(0, T, block):
        stop = min(T, start + block)
        qb = qg[:, :, start:stop]
        s = qb @ k.stored[:, None, :stop].transpose(-1, -2)  # [Hkv, g, rows, stop]
        if k.mixed:
            lo = k.band_start(start, stop)
            band = torch.arange(lo, stop, device=q.device)[None, :] < k.prefix[start:stop, None]
            raw = qb @ k.raw[:, None, lo:stop].transpose(-1, -2)
            s[..., lo:stop] = torch.where(band, s[..., lo:stop], raw)
        s *= scale
        rows = torch.arange(start, stop, device=q.device)[:, None]
        s[..., start:stop].masked_fill_(torch.arange(start, stop, device=q.device)[None, :] > rows, float("-inf"))
        p = torch.softmax(s, dim=-1)
        del s
        if v.mixed:
            lo = v.band_start(start, stop)
            band = torch.arange(lo, stop, device=q.device)[None, :] < v.prefix[start:stop, None]
            pb = p[..., lo:stop]
            o = torch.where(band, pb, 0) @ v.stored[:, None, lo:stop] + torch.where(band, 0, pb) @ v.raw[:, None, lo:stop]
            if lo:
                o += p[..., :lo] @ v.stored[:, None, :lo]
            out[:, :, start:stop] = o
        else:
            out[:, :, start:stop] = p @ v.stored[:, None, :stop]
    return out.reshape(Hq, T, D)


def attention_rel_l2(o, o_ref):
    """kvq.output_error's rel-L2 per query head (over all positions and D; float64 sums): [Hq]."""
    diff = (o.double() - o_ref.double()).square().sum(dim=(1, 2))
    ref = o_ref.double().square().sum(dim=(1, 2))
    return torch.where(ref > 0, (diff / ref.clamp_min(1e-300)).sqrt(), torch.nan)


class Recorded:
    """The reference run's q, k, v of every layer (the model's dtype, on the layer's device) and the
    reference attention outputs (float32, made by the first pair), for the attention-level error of
    each pair on the same cache: kvq sweep's view, every query over the whole quantized cache."""

    def __init__(self):
        self.layers = {}

    def add(self, layer, q, k, v, scale):
        self.layers[layer] = {"q": q, "k": k, "v": v, "scale": scale, "o_ref": None}

    def error(self, k_name, v_name):
        means, maxes = [], []
        for _, r in sorted(self.layers.items()):
            q = r["q"].to(compute_dtype(r["q"]))
            if r["o_ref"] is None:
                r["o_ref"] = attend(q, CacheView(r["k"], "none"), CacheView(r["v"], "none"), r["scale"])
            o = attend(q, CacheView(r["k"], k_name, whole=True), CacheView(r["v"], v_name, whole=True), r["scale"])
            e = attention_rel_l2(o, r["o_ref"])
            e = e[~torch.isnan(e)]
            means.append(float(e.mean()) if len(e) else 0.0)
            maxes.append(float(e.max()) if len(e) else 0.0)
        return {"out_rel_l2_mean": float(np.mean(means)), "out_rel_l2_max": float(np.max(maxes))}


class GpuReference:
    """One window's reference run: its final hidden states (logits are recomputed per chunk: the
    forward pass is the cost, a chunk's output projection is not), per-position log-probability
    statistics, and the recorded layers."""

    def __init__(self, model, tokens, record=True):
        self.tokens = tokens
        self.recorded = Recorded() if record else None
        self.hidden = model.forward(tokens, make_attend("none", "none", self.recorded))


def make_attend(k_name, v_name, recorded=None):
    def attend_stored(layer, q, k, v, scale):
        if recorded is not None:
            recorded.add(layer, q, k, v, scale)
        return attend(q.to(compute_dtype(q)), CacheView(k, k_name), CacheView(v, v_name), scale)
    return attend_stored


def log_softmax64(logits):
    return torch.log_softmax(logits.double(), dim=-1)


def position_metrics(model, ref, hidden, chunk_bytes=1 << 30):
    """windows.PositionMetrics of a pair's final hidden states against the window's reference, the
    logits of both made and compared a chunk of positions at a time (float64 log-softmax)."""
    tokens = torch.as_tensor(ref.tokens, device=hidden.device)
    T = len(ref.tokens)
    vocab = model.vocab_size
    rows = max(1, min(T, chunk_bytes // (8 * vocab * 3)))
    kl, agree, nll_ref, nll = [], [], [], []
    for start in range(0, T, rows):
        stop = min(T, start + rows)
        lp_ref = log_softmax64(model.logits(ref.hidden[start:stop]))
        lp = log_softmax64(model.logits(hidden[start:stop]).to(lp_ref.device))
        kl.append((lp_ref.exp() * (lp_ref - lp)).sum(dim=-1))
        agree.append(lp_ref.argmax(dim=-1) == lp.argmax(dim=-1))
        targets = tokens[start + 1:stop + 1].to(lp.device)
        n = len(targets)
        nll_ref.append(-lp_ref[torch.arange(n, device=lp.device), targets])
        nll.append(-lp[torch.arange(n, device=lp.device), targets])
    host = lambda parts: torch.cat(parts).cpu().numpy()  # noqa: E731
    return win.PositionMetrics(kl=host(kl), agree=host(agree), nll_ref=host(nll_ref), nll=host(nll))


def run_pair(model, ref, k_name, v_name):
    """One pair over one window: PositionMetrics against the reference and the attention-level error."""
    with torch.inference_mode(), float32_arithmetic():
        hidden = model.forward(ref.tokens, make_attend(k_name, v_name))
        metrics = position_metrics(model, ref, hidden)
        attn = ref.recorded.error(k_name, v_name) if ref.recorded is not None else {}
    return metrics, attn


def run_reference(model, tokens, record=True):
    with torch.inference_mode(), float32_arithmetic():
        return GpuReference(model, tokens, record)


def peak_memory_gib():
    """The peak allocated memory of every GPU since the run started (GiB), one entry per device."""
    return [torch.cuda.max_memory_allocated(d) / 2**30 for d in range(torch.cuda.device_count())]
