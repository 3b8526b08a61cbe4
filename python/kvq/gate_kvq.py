"""kvq's own decode kernels as kvq.gate kernels: the same variants `kvq validate` gates in C++, called
through kvq.gpu on the torch CUDA tensors kvq.gate hands them, so both paths can be compared.

    import kvq.gate, kvq.gate_kvq
    kvq.gate.check(kvq.gate_kvq.kernel("decode-tc"), k="int8-head", v="int4-g32-asym", device="cuda")
    # or: python -m kvq.gate kvq.gate_kvq:decode_tc --k int8-head --v int8-head --device cuda

Each kernel declares what its variant declares in C++ (gpu/registry.hpp): the storages and head
dims it reads (DecodeVariant::unsupported_reason) and the precision profile of its arithmetic for the
storage pair (decode_precision_profile). The cache is read through its strides (the strided family);
Q, scales and zero points are made contiguous first, as kvq.gpu takes them. Layouts: "bnsh" (planar
codes, raw values BNSH), "fbgemm" (int4 inline rows) or "paged" (decode-tc: kvq.gate's pages of codes
or values read in place through the block table; each page's parameters made head-major, the layout
kvq.gpu reads: [pages, P, Hkv, ...] -> [pages, Hkv, P, ...], page ids unchanged).
"""
from . import gpu
from .gate import Kernel

__all__ = ["kernel"]


def _support(variant, k, v, layout, head_dim, page_size=16):
    if not gpu.available():
        raise RuntimeError(f"kvq.gate_kvq: {gpu.why_unavailable()}")
    return gpu._gpu.decode_support(variant, k, v, layout, head_dim, page_size)


def _cache(op, layout):
    if layout == "paged":  # a +w<W> window's raw tokens in pages of their own, the codes' pages here
        if op.scheme is None:
            return gpu.Cache(op.storage, op.values, layout="paged")
        return gpu.Cache(op.storage, op.codes, _head_major(op.scales), _head_major(op.zero_points), layout="paged",
                         tensor_scale=op.tensor_scale, window=_packed(op.window))
    if op.scheme is None:  # raw values: BNSH, or BSNH beside FBGEMM rows (kvq.gate's layouts)
        return gpu.Cache(op.storage, op.values, layout="bnsh" if layout == "bnsh" else "bsnh")
    if layout == "fbgemm":
        return gpu.Cache(op.storage, op.rows, layout="fbgemm")
    # kvq.gpu reads the codes through their strides; scales and zero points it takes contiguous
    return gpu.Cache(op.storage, op.codes, _packed(op.scales), _packed(op.zero_points), layout="bnsh",
                     tensor_scale=op.tensor_scale, window=_packed(op.window))


def _packed(x):
    return None if x is None else x.contiguous()


def _head_major(x):
    """Paged per-row parameters [pages, P, Hkv(, groups)] -> [pages, Hkv, P(, groups)]; per-token ones
    ([pages, P]) and per-tensor ones as they are."""
    if x is None:
        return None
    return x.transpose(1, 2).contiguous() if x.dim() >= 3 else x.contiguous()


def kernel(variant="decode-tc", layout="bnsh", splits=0, page_size=16):
    """The registered decode variant `variant` as a kvq.gate.Kernel (layout "bnsh", "fbgemm" or "paged",
    in pages of `page_size` tokens); splits > 0 forces that many key splits (split-K variants)."""
    if layout not in ("bnsh", "fbgemm", "paged"):
        raise ValueError(f"kvq.gate_kvq: layout '{layout}': kvq's decode kernels read bnsh, fbgemm or paged caches")

    def run(case):
        paged = case.layout == "paged"
        table = case.block_table.contiguous() if paged else None
        windows = case.k.window is not None or case.v.window is not None
        o, lse = gpu.decode(case.q.contiguous(), _cache(case.k, case.layout), _cache(case.v, case.layout), seq_lens=case.seq_lens,
                            alibi_slopes=case.alibi_slopes, softmax_scale=case.softmax_scale, variant=variant,
                            splits=splits, block_table=table, window_table=table if windows else None)
        return o, lse

    def why_not(spec, k, v):
        why = _support(variant, k, v, layout, spec.head_dim, page_size)["reason"]
        return f"{variant}: {why}" if why else ""

    def profile(k, v):  # the profile does not depend on D where the variant runs at all
        for d in (128, 64, 256, 8):
            s = _support(variant, k, v, layout, d, page_size)
            if not s["reason"]:
                return s["profile"]
        return s["profile"] or "fp32-obf16"

    name = variant + {"fbgemm": ":fbgemm", "paged": f":paged{page_size}"}.get(layout, "") + (f" splits={splits}" if splits else "")
    return Kernel(run, name=name, layout=layout, profile=profile, why_not=why_not, strides=True, page_size=page_size)


def __getattr__(name):
    """Module attributes for the command line: decode_tc, decode_splitk, decode_tc_fbgemm, decode_tc_paged,
    ... (a variant name with '_' for '-', '_fbgemm' for the FBGEMM-row layout, '_paged' for pages of 16)."""
    layout = "bnsh"
    for suffix in ("_fbgemm", "_paged"):
        if name.endswith(suffix):
            name, layout = name[:-len(suffix)], suffix[1:]
    variant = name.replace("_", "-")
    if name.startswith("decode_") and gpu.available() and any(v["name"] == variant for v in gpu.variants("decode")):
        return kernel(variant, layout)
    raise AttributeError(f"module 'kvq.gate_kvq' has no attribute '{name}' (kernel(variant) takes any of "
                         "kvq.gpu.variants('decode'))")
