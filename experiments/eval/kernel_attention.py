"""kvq eval --attention kvq: a layer's attention through kvq's GPU decode kernel (kvq.gpu.decode) over
the cache stored by kvq's GPU quantizer, instead of float32 numpy over the dequantized cache.

Every position t of the sequence is one decode query (bf16, as an engine holds it) with seq_len t + 1
over the layer's whole stored cache: the same values sequence_eval's reference path reads when the
storage is not mixed (no +w<W> window, no chan-t<N>: those keep recent tokens raw, which one cache
per layer cannot show). Queries go in chunks of positions, each chunk with its own copy of the cache
(the kernels index scales per sequence), sized to stay under a memory budget.
"""
import numpy as np

import kvq

RAW = {"bf16", "fp16"}  # raw storages the kernels read; fp32 / none caches are not a decode storage


def unsupported_reason(k_name, v_name, head_dim, variant=None):
    """Why the kernel path cannot run this pair ("" when it can)."""
    import kvq.gpu
    why = kvq.gpu.why_unavailable()
    if why:
        return why
    for which, name in (("K", k_name), ("V", v_name)):
        if name in ("none", "fp32"):
            return f"{which} {name}: kvq's decode kernels read bf16 / fp16 or quantized caches"
        if name not in RAW:
            s = kvq.parse_scheme(name)
            if s.window is not None or s.granularity == "channel":
                return (f"{which} {name}: keeps recent tokens unquantized while the sequence grows; the kernel "
                        "path reads one stored cache per layer")
    tried = [variant] if variant else ["decode-tc", "decode-splitk"]
    reasons = []
    for v in tried:
        r = kvq.gpu._gpu.decode_support(v, k_name, v_name, "bnsh", head_dim)["reason"]
        if not r:
            return ""
        reasons.append(f"{v}: {r}")
    return "; ".join(reasons)


class KernelAttention:
    """attend(q, k, v, scale) for llama_forward.forward_sequence: q [Hq, T, D], k / v [Hkv, T, D] float32
    as the model computed them; returns [Hq, T, D] float32 (the kernel's bf16 O)."""

    def __init__(self, k_name, v_name, variant=None, budget_bytes=1 << 30):
        import torch
        import kvq.gpu
        self.torch, self.gpu = torch, kvq.gpu
        self.k_name, self.v_name, self.variant, self.budget = k_name, v_name, variant, budget_bytes
        self.launch = None  # the last launch: variant, splits, profile

    def _store(self, x, name):
        """x [1, H, T, D] fp32 CUDA -> (Cache of one sequence, bytes of it)."""
        torch = self.torch
        if name in RAW:
            t = x.to(torch.bfloat16 if name == "bf16" else torch.float16)
            return self.gpu.Cache(name, t), t.numel() * 2
        c = self.gpu.quantize(x, name)
        size = sum(a.numel() * a.element_size() for a in (c.data, c.scales, c.zero_points) if a is not None)
        return c, size

    def _repeat(self, cache, n, D):
        """The cache of one sequence (head_dim D) as a batch of n identical ones (raw values: a stride-0 view)."""
        if cache.scales is None and cache.storage in RAW:
            return self.gpu.Cache(cache.storage, cache.data.expand(n, -1, -1, -1))
        B, H, T, _ = cache.data.shape
        one = kvq.gpu._gpu.quantized_sizes(cache.storage, 1, H, T, D, "planar")
        many = kvq.gpu._gpu.quantized_sizes(cache.storage, n, H, T, D, "planar")

        def params(a, key):  # per-sequence params repeat; per-tensor ones stay one
            if a is None:
                return None
            return a.repeat(n) if many[key] == n * one[key] else a
        return self.gpu.Cache(cache.storage, cache.data.expand(n, -1, -1, -1).contiguous(),
                              params(cache.scales, "scales"), params(cache.zero_points, "zeros"))

    def __call__(self, q, k, v, scale):
        torch = self.torch
        Hq, T, D = q.shape
        dev = torch.device("cuda")
        kc, kbytes = self._store(torch.from_numpy(np.ascontiguousarray(k[None])).to(dev), self.k_name)
        vc, vbytes = self._store(torch.from_numpy(np.ascontiguousarray(v[None])).to(dev), self.v_name)
        chunk = int(max(1, min(T, self.budget // max(kbytes + vbytes, 1))))
        qd = torch.from_numpy(np.ascontiguousarray(q.transpose(1, 0, 2))).to(dev).to(torch.bfloat16)  # [T, Hq, D]
        out = torch.empty(T, Hq, D, dtype=torch.float32, device=dev)
        for start in range(0, T, chunk):
            stop = min(T, start + chunk)
            n = stop - start
            lens = torch.arange(start + 1, stop + 1, dtype=torch.int32, device=dev)
            o, _, self.launch = self.gpu.decode(qd[start:stop].contiguous(), self._repeat(kc, n, D), self._repeat(vc, n, D),
                                                seq_lens=lens, softmax_scale=float(scale), variant=self.variant,
                                                info=True)
            out[start:stop] = o.float()
        return out.cpu().numpy().transpose(1, 0, 2).copy()
