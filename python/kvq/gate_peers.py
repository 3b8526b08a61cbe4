"""The decode kernels teams adopt instead of kvq's, as kvq.gate kernels (device "cuda"), each with its
own declarations and the arithmetic it is documented to do:

- sdpa_cudnn, sdpa_flash, sdpa_efficient, sdpa_math: torch.nn.functional.scaled_dot_product_attention
  under one backend each, bf16 / fp16 K and V in BNSH, GQA native (enable_gqa). SDPA has no sequence
  lengths: a batch of equal lengths is one call, otherwise each sequence is its own call over its
  keys (how a user decodes ragged batches with it; an empty one is O = 0 without a call). No LSE, no
  ALiBi (a bias tensor is another kernel).
- fbgemm_int4: FBGEMM's torch.ops.fbgemm.gqa_attn_splitk over its INT4 inline rows (int4-head-asym:
  1 group, int4-g32-asym: 4 groups at D = 128); one KV head, D = 128, T <= 16384; the position of
  each query is seq_len - 1. Needs the fbgemm-gpu-genai wheel.
- flashinfer_paged: FlashInfer's BatchDecodeWithPagedKVCacheWrapper over a paged NHD cache (pages of 16
  tokens, shuffled), bf16 or FP8 e4m3 (scale-free) K/V, bf16 Q and O, the tensor-core kernel where
  query heads share a KV head; its LSE (base 2) is returned in natural log. Needs flashinfer-python.
- flashinfer_nhd, flashinfer_hnd: the same kernel in FlashInfer's own layouts (kvq.gate's flashinfer_nhd /
  flashinfer_hnd: one [pages, 2, ...] cache, kv_indptr / kv_indices / kv_last_page_len as handed, FP8 e4m3
  with its per-tensor k_scale / v_scale).

    python -m kvq.gate kvq.gate_peers:sdpa_flash --device cuda --cases full
    python -m kvq.gate kvq.gate_peers:fbgemm_int4 --k int4-head-asym --v int4-head-asym --device cuda

PEERS names them all; experiments/gate/gate_peers_table.py runs each over its storages and writes the
table. A peer whose library is missing raises ImportError when its attribute is read.
"""
import math
import warnings

from .gate import Kernel
from .gate_cases import flashinfer_indices

__all__ = ["PEERS", "make_sdpa", "make_fbgemm_int4", "make_flashinfer_paged", "make_flashinfer_native"]

# peer -> the K/V storage pairs it is gated on (one gate run each)
PEERS = {
    "sdpa_cudnn": [("bf16", "bf16")],
    "sdpa_flash": [("bf16", "bf16")],
    "sdpa_efficient": [("bf16", "bf16")],
    "sdpa_math": [("bf16", "bf16")],
    "fbgemm_int4": [("int4-head-asym", "int4-head-asym"), ("int4-g32-asym", "int4-g32-asym")],
    "flashinfer_paged": [("bf16", "bf16"), ("fp8-e4m3", "fp8-e4m3")],
    "flashinfer_nhd": [("bf16", "bf16"), ("fp8-e4m3", "fp8-e4m3"), ("fp8-e4m3-tensor", "fp8-e4m3-tensor")],
    "flashinfer_hnd": [("bf16", "bf16"), ("fp8-e4m3-tensor", "fp8-e4m3-tensor")],
}


def make_sdpa(backend):
    """SDPA under `backend` ("cudnn", "flash", "efficient", "math") as a gate Kernel."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]

    def attend(q, k, v, scale):  # q [b, Hq, D], k / v [b, Hkv, t, D] -> [b, Hq, D]
        if backend == "efficient" and q.shape[1] != k.shape[1]:  # its fused kernel takes no GQA: heads expanded
            k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
        with warnings.catch_warnings(record=True) as caught, sdpa_kernel(chosen):
            warnings.simplefilter("always")
            try:
                return F.scaled_dot_product_attention(q[:, :, None, :], k, v, scale=scale,
                                                      enable_gqa=q.shape[1] != k.shape[1])[:, :, 0, :]
            except RuntimeError as e:  # "no available kernel": torch's reasons came as warnings
                why = "; ".join(str(w.message).split(" (Triggered")[0] for w in caught)
                raise RuntimeError(f"{str(e).splitlines()[0]} ({why})") from None

    def run(case):
        k, v = case.k.values, case.v.values
        lens = case.seq_lens.tolist()
        if all(n == case.tokens for n in lens):
            return attend(case.q, k, v, case.softmax_scale)
        # a sequence without keys is O = 0 by definition: not a call (SDPA takes no empty key set)
        return torch.cat([attend(case.q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], case.softmax_scale) if n
                          else torch.zeros_like(case.q[b:b + 1]) for b, n in enumerate(lens)]
                         or [case.q[:0]])

    # flash and cuDNN round P to bf16 for P.V on the tensor cores; efficient and math are described alike
    # (math rounds the logits to bf16 too, which no profile describes: it may fail by that much)
    return Kernel(run, name=f"sdpa-{backend}", layout="bnsh", profile="fp32-pbf16-obf16", alibi=False,
                  returns_lse=False, storages=("bf16", "fp16"), strides=True)  # torch ops take any strides


def _fbgemm_op():
    import torch
    import fbgemm_gpu.experimental.gen_ai  # noqa: F401  registers torch.ops.fbgemm.gqa_attn_splitk
    return torch.ops.fbgemm.gqa_attn_splitk


def make_fbgemm_int4(splits=4):
    """FBGEMM's INT4 GQA decode kernel on kvq's FBGEMM rows (the same bytes) as a gate Kernel."""
    import torch
    op = _fbgemm_op()

    def run(case):
        groups = (case.k.rows.shape[-1] - case.head_dim // 2) // 4
        pos = (case.seq_lens - 1).to(torch.int32)
        o = op(case.q[:, None], case.k.rows, case.v.rows, pos, case.softmax_scale, splits,
               kv_cache_quant_num_groups=groups, use_tensor_cores=True,
               cache_logical_dtype_int=2)[0]  # CacheLogicalDtype::INT4
        return o[:, 0]

    def why_not(spec, k, v):
        if spec.kv_heads != 1:
            return f"Hkv = {spec.kv_heads} (gqa_attn_splitk takes one KV head)"
        return ""

    # K and V dequantized to bf16 on the way to the tensor cores, P rounded to bf16, O written in bf16
    return Kernel(run, name="fbgemm-gqa_attn_splitk", layout="fbgemm", profile="fp32-kbf16-pbf16-obf16",
                  head_dims=(128,), max_tokens=16384, alibi=False, returns_lse=False,
                  storages=("int4-head-asym", "int4-g32-asym"), why_not=why_not)


def _flashinfer_decode(kv_layout):
    """decode(case, cache, indptr, indices, last, **scales) -> (O, LSE): FlashInfer's paged batch decode
    planned and run on one case ("NHD" / "HND" pages; the tensor-core kernel where query heads share a
    KV head); its LSE (log2-sum-exp2) returned in natural log."""
    import torch
    from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")

    def decode(case, cache, indptr, indices, last, **scales):
        dtype = cache[0].dtype if isinstance(cache, tuple) else cache.dtype
        decoder = BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout, use_tensor_cores=case.group > 1)
        decoder.plan(indptr, indices, last, case.num_q_heads, case.num_kv_heads, case.head_dim, case.page_size,
                     q_data_type=torch.bfloat16, kv_data_type=dtype, sm_scale=case.softmax_scale)
        o, lse = decoder.run(case.q, cache, return_lse=True, **scales)
        return o, lse * math.log(2.0)
    return decode


def make_flashinfer_paged(page_size=16):
    """FlashInfer's paged batch decode as a gate Kernel (layout "paged"): kvq.gate's page table turned
    into FlashInfer's page lists."""
    import torch
    decode = _flashinfer_decode("NHD")

    def cache(op):
        if op.scheme is None:
            return op.values
        return op.codes.view(torch.float8_e4m3fn)  # scale-free e4m3: the codes are the values

    def run(case):
        lists = flashinfer_indices(case.block_table.cpu().numpy(), case.seq_lens.cpu().numpy(), case.page_size)
        indptr, indices, last = (torch.as_tensor(x, device=case.q.device) for x in lists)
        return decode(case, (cache(case.k), cache(case.v)), indptr, indices, last)

    return Kernel(run, name="flashinfer-paged-decode", layout="paged", profile="fp32-pbf16-obf16",
                  head_dims=(64, 128, 256), alibi=False, page_size=page_size, storages=("bf16", "fp8-e4m3"))


def make_flashinfer_native(kv_layout="NHD", page_size=16):
    """FlashInfer's paged batch decode in its own layout (kvq.gate's "flashinfer_nhd" / "flashinfer_hnd"):
    the one [pages, 2, ...] cache as handed, kv_indptr / kv_indices / kv_last_page_len planned as they come,
    FP8 e4m3 with its per-tensor k_scale / v_scale passed to run()."""
    import torch
    decode = _flashinfer_decode(kv_layout)
    layout = "flashinfer_" + kv_layout.lower()

    def run(case):
        cache = case.kv_cache if case.k.scheme is None else case.kv_cache.view(torch.float8_e4m3fn)
        scales = {}
        if case.k_scale not in (None, 1.0) or case.v_scale not in (None, 1.0):
            scales = {"k_scale": case.k_scale, "v_scale": case.v_scale}
        return decode(case, cache, case.kv_indptr, case.kv_indices, case.kv_last_page_len, **scales)

    return Kernel(run, name=f"flashinfer-decode-{kv_layout.lower()}", layout=layout, profile="fp32-pbf16-obf16",
                  head_dims=(64, 128, 256), alibi=False, page_size=page_size,
                  storages=("bf16", "fp8-e4m3", "fp8-e4m3-tensor"))


def __getattr__(name):
    """The peers of PEERS as module attributes, for the command line (built on first use)."""
    if name.startswith("sdpa_") and name[5:] in ("cudnn", "flash", "efficient", "math"):
        return make_sdpa(name[5:])
    if name == "fbgemm_int4":
        return make_fbgemm_int4()
    if name == "flashinfer_paged":
        return make_flashinfer_paged()
    if name in ("flashinfer_nhd", "flashinfer_hnd"):
        return make_flashinfer_native(name[-3:].upper())
    raise AttributeError(f"module 'kvq.gate_peers' has no attribute '{name}'")
