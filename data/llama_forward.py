"""A general numpy Llama forward pass: llama2.c's, with the model's RMSNorm epsilon, RoPE base
and RoPE pair order, grouped-query attention and a tied or separate output matrix.

A model is any object with capture_llama2c.Checkpoint's attributes (dim, hidden_dim, n_layers, n_heads,
n_kv_heads, head_dim, vocab_size, seq_len, emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final,
wcls; float32 or float64) and optionally:
  rope_theta  the RoPE base (default 10000, llama2.c's);
  norm_eps    RMSNorm's epsilon (default 1e-5);
  rope_order  "llamacpp": RoPE rotates adjacent pairs (x[2i], x[2i+1]) (the default: llama2.c's and
              llama.cpp's); "hf": it rotates (x[i], x[i + D/2]) (Hugging Face's rotate_half, vLLM).
Every pair i turns by pos * theta^(-2i/D) in both orders.

forward() runs one token (decode, through a KV cache); capture_llama2c runs llama2.c checkpoints
through it. forward_sequence() runs a whole sequence causally (prefill) with float32
matrix products, for speed.
"""
import numpy as np

DEFAULT_THETA, DEFAULT_EPS, DEFAULT_ORDER = 10000.0, 1e-5, "llamacpp"


def model_rope(m):
    """(theta, eps, order) of a model, with llama2.c's defaults for what it does not say."""
    order = getattr(m, "rope_order", DEFAULT_ORDER)
    if order not in ("hf", "llamacpp"):
        raise ValueError(f"rope_order {order!r}: expected 'hf' or 'llamacpp'")
    return float(getattr(m, "rope_theta", DEFAULT_THETA)), float(getattr(m, "norm_eps", DEFAULT_EPS)), order


def rmsnorm(x, w, eps=DEFAULT_EPS):
    """RMSNorm of a vector x (llama2.c's arithmetic)."""
    return x / np.sqrt(np.mean(x * x) + eps) * w


def rope_angles(pos, head_dim, theta=DEFAULT_THETA):
    """The angles pos * theta^(-2i/D) of pairs i < D/2 (float64; pos a scalar or an array)."""
    return np.multiply.outer(pos, theta ** (-2.0 * np.arange(head_dim // 2) / head_dim))


def rope(x, pos, head_dim, theta=DEFAULT_THETA, order=DEFAULT_ORDER):
    """Rotates every head of x [H * D] at position pos: adjacent pairs ("llamacpp", llama2.c's
    rope exactly) or half-split pairs ("hf")."""
    angle = rope_angles(pos, head_dim, theta)
    c, s = np.cos(angle), np.sin(angle)
    if x.dtype != c.dtype:
        c, s = c.astype(x.dtype), s.astype(x.dtype)
    if order == "llamacpp":
        pairs = x.reshape(-1, head_dim // 2, 2)
        out = np.empty_like(pairs)
        out[..., 0] = pairs[..., 0] * c - pairs[..., 1] * s
        out[..., 1] = pairs[..., 0] * s + pairs[..., 1] * c
        return out.reshape(x.shape)
    halves = x.reshape(-1, 2, head_dim // 2)
    out = np.empty_like(halves)
    out[:, 0] = halves[:, 0] * c - halves[:, 1] * s
    out[:, 1] = halves[:, 1] * c + halves[:, 0] * s
    return out.reshape(x.shape)


class KvCache:
    """Every layer's K and V [n_layers, Hkv, capacity, D] as the model computes them (float64 default)."""

    def __init__(self, model, capacity, dtype=np.float64):
        self.k = np.zeros((model.n_layers, model.n_kv_heads, capacity, model.head_dim), dtype=dtype)
        self.v = np.zeros_like(self.k)

    def append(self, layer, pos, k, v):
        """Stores position pos's k, v [Hkv, D]; returns the keys and values attention reads, [Hkv, pos + 1, D]."""
        self.k[layer, :, pos], self.v[layer, :, pos] = k, v
        return self.k[layer, :, :pos + 1], self.v[layer, :, :pos + 1]


def forward(m, token, pos, cache, queries=None):
    """Runs one token at position pos through every layer, reading and writing K/V through
    cache.append; records the post-RoPE queries into queries [n_layers, Hq, T, D] if given.
    Returns the next-token logits. Arithmetic in the weights' dtype (float64 for a llama2.c Checkpoint)."""
    theta, eps, order = model_rope(m)
    hd, group = m.head_dim, m.n_heads // m.n_kv_heads
    dt = np.result_type(m.wq.dtype, np.float32)
    x = np.array(m.emb[token], dtype=dt)
    for layer in range(m.n_layers):
        xb = rmsnorm(x, m.rms_att[layer], eps)
        q = rope(m.wq[layer] @ xb, pos, hd, theta, order).reshape(m.n_heads, hd)
        keys, values = cache.append(layer, pos, rope(m.wk[layer] @ xb, pos, hd, theta, order).reshape(m.n_kv_heads, hd),
                                    (m.wv[layer] @ xb).reshape(m.n_kv_heads, hd))
        if queries is not None:
            queries[layer, :, pos] = q
        out = np.empty((m.n_heads, hd), dtype=dt)
        for h in range(m.n_heads):
            s = keys[h // group] @ q[h] / np.sqrt(hd)
            p = np.exp(s - s.max())
            out[h] = (p / p.sum()) @ values[h // group]
        x = x + m.wo[layer] @ out.reshape(-1)
        xb = rmsnorm(x, m.rms_ffn[layer], eps)
        h1, h3 = m.w1[layer] @ xb, m.w3[layer] @ xb
        x = x + m.w2[layer] @ (h1 / (1.0 + np.exp(-h1)) * h3)
    return m.wcls @ rmsnorm(x, m.rms_final, eps)


def rmsnorm_rows(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_rows(x, c, s, order):
    """x [T, H, D] with c, s [T, D/2]: numpy arrays, or torch tensors (kvq eval's GPU engine)."""
    T, H, D = x.shape
    c, s = c[:, None, :], s[:, None, :]
    out = x.new_empty(x.shape) if hasattr(x, "new_empty") else np.empty_like(x)
    if order == "llamacpp":
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., :D // 2], x[..., D // 2:]
        out[..., :D // 2], out[..., D // 2:] = a * c - b * s, b * c + a * s
    return out


def causal_attention(q, k, v, scale, block=512):
    """Causal attention of q [Hq, T, D] over k, v [Hkv, T, D] (GQA by head groups), float32, in query
    blocks of `block` rows to bound its memory. Returns [Hq, T, D]."""
    Hq, T, hd = q.shape
    Hkv = k.shape[0]
    qg = q.reshape(Hkv, Hq // Hkv, T, hd)
    out = np.empty_like(qg)
    for start in range(0, T, block):
        stop = min(T, start + block)
        sc = qg[:, :, start:stop] @ k[:, None, :stop].transpose(0, 1, 3, 2) * scale  # [Hkv, g, b, stop]
        sc[..., np.triu(np.ones((stop - start, stop), bool), k=start + 1)] = -np.inf
        sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
        sc /= sc.sum(axis=-1, keepdims=True)
        out[:, :, start:stop] = sc @ v[:, None, :stop]
    return out.reshape(Hq, T, hd)


def forward_sequence(m, tokens, record=True, block=512, attend=None, dtype=np.float32, convert_input=None):
    """Runs tokens [T] causally through the model at positions 0..T-1 in one pass (matrix products
    in `dtype`: float32, or float64 where rounding noise must not matter). Returns (logits [T, vocab], Q, K, V): every layer's post-RoPE queries Q [L, Hq, T, D],
    keys K [L, Hkv, T, D] and values V [L, Hkv, T, D] (None each unless record). Attention runs in
    query blocks of `block` rows to bound its memory; attend(q, k, v, scale) -> [Hq, T, D] replaces it
    (kvq eval attends over a quantized cache that way). convert_input(x, attr, layer) -> x rounds a
    weight product's input as an engine does before multiplying by weight `attr` (m.wq, ..., m.wcls;
    layer None for wcls): kvq eval --runtime llama.cpp."""
    theta, eps, order = model_rope(m)
    dt = np.dtype(dtype).type
    tokens = np.asarray(tokens, dtype=np.int64)
    T, hd, Hq, Hkv = len(tokens), m.head_dim, m.n_heads, m.n_kv_heads
    f32 = lambda a: np.asarray(a, dtype=dt)  # noqa: E731

    def mm(x, attr, layer=None):  # x @ W.T, x first as the engine takes it
        w = getattr(m, attr) if layer is None else getattr(m, attr)[layer]
        return (x if convert_input is None else convert_input(x, attr, layer)) @ f32(w).T

    attend = attend or (lambda q, k, v, scale: causal_attention(q, k, v, scale, block))
    angle = rope_angles(np.arange(T), hd, theta)
    c, s = np.cos(angle).astype(dt), np.sin(angle).astype(dt)
    x = f32(np.asarray(m.emb)[tokens])
    Q = np.empty((m.n_layers, Hq, T, hd), dt) if record else None
    K = np.empty((m.n_layers, Hkv, T, hd), dt) if record else None
    V = np.empty((m.n_layers, Hkv, T, hd), dt) if record else None
    scale = dt(1.0 / np.sqrt(hd))
    for layer in range(m.n_layers):
        xb = rmsnorm_rows(x, f32(m.rms_att[layer]), eps)
        q = rope_rows(mm(xb, "wq", layer).reshape(T, Hq, hd), c, s, order).transpose(1, 0, 2)
        k = rope_rows(mm(xb, "wk", layer).reshape(T, Hkv, hd), c, s, order).transpose(1, 0, 2)
        v = mm(xb, "wv", layer).reshape(T, Hkv, hd).transpose(1, 0, 2)
        if record:
            Q[layer], K[layer], V[layer] = q, k, v
        out = attend(q, k, v, scale)
        x = x + mm(out.transpose(1, 0, 2).reshape(T, Hq * hd), "wo", layer)
        xb = rmsnorm_rows(x, f32(m.rms_ffn[layer]), eps)
        h1, h3 = mm(xb, "w1", layer), mm(xb, "w3", layer)
        x = x + mm(h1 / (1.0 + np.exp(-h1)) * h3, "w2", layer)
    logits = mm(rmsnorm_rows(x, f32(m.rms_final), eps), "wcls")
    return logits, Q, K, V


def generate(m, tokens, n, stop=None, dtype=None):
    """Feeds tokens through forward(), then appends n greedy (argmax) tokens, ending early after stop."""
    tokens = list(tokens)
    cache = KvCache(m, len(tokens) + n, dtype or np.result_type(m.wq.dtype, np.float32))
    for pos in range(len(tokens) + n - 1):
        logits = forward(m, tokens[pos], pos, cache)
        if pos + 1 >= len(tokens):
            tokens.append(int(np.argmax(logits)))
            if stop is not None and tokens[-1] == stop:
                break
    return tokens
