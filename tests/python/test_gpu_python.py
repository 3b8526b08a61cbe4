"""kvq.gpu on torch CUDA tensors: the quantize variants bit-exact with the CPU codec, decode through
kvq.gate_kvq passing the gate, errors named like the CLI's, the current stream honoured, and the
in-model kernel path (experiments/eval/kernel_attention.py) against float32 attention. Skipped where
kvq was built without its kernels or there is no CUDA device (CI); scripts/device_run.sh runs it."""
import os
import sys

import numpy as np
import pytest

import kvq
import kvq.gpu

if not kvq.gpu.available():
    pytest.skip(kvq.gpu.why_unavailable(), allow_module_level=True)

import torch  # noqa: E402

import kvq.gate as gate  # noqa: E402
import kvq.gate_kvq as gate_kvq  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "experiments", "eval"))
sys.path.insert(0, os.path.join(ROOT, "data"))


def random_kv(shape, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * (1 + 6 * (torch.rand(shape[-1], generator=g) > 0.9))  # outlier channels
    return x.to(dtype).cuda()


@pytest.mark.parametrize("scheme", ["int8-head", "int4-g32-asym", "int8-token-asym", "int4-tensor", "fp8-e4m3-head",
                                    "int8-g64-asym-fp32", "int4-g32-asym+had", "int4-chan-t32-asym"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_is_bit_exact_with_the_cpu_codec(scheme, dtype):
    x = random_kv((2, 3, 70, 64), 1, dtype)
    c = kvq.gpu.quantize(x, scheme)
    r = kvq.quantize(x.float().cpu().numpy(), scheme)
    assert np.array_equal(c.data.cpu().numpy().reshape(-1).view(np.uint8), np.asarray(r.codes).reshape(-1).view(np.uint8))
    if r.scales is not None:
        assert np.array_equal(c.scales.cpu().numpy().reshape(-1).view(np.uint8),
                              np.asarray(r.scales).reshape(-1).view(np.uint8))
    if r.zero_points is not None:
        assert np.array_equal(c.zero_points.cpu().numpy().reshape(-1).view(np.uint8),
                              np.asarray(r.zero_points).reshape(-1).view(np.uint8))


@pytest.mark.parametrize("scheme", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4", "nvfp4", "nvfp4+had"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_block_formats_are_bit_exact_with_the_cpu_codec(scheme, dtype):
    x = random_kv((3, 5, 37, 96 if "had" not in scheme else 128), 8, dtype).transpose(1, 2).contiguous().transpose(1, 2)
    c = kvq.gpu.quantize(x, scheme)  # BSNH strides
    r = kvq.quantize(x.float().contiguous().cpu().numpy(), scheme)
    assert np.array_equal(c.data.cpu().numpy(), np.asarray(r.codes).view(np.uint8))
    assert c.scales.dtype == {"float16": torch.float16}.get(str(np.asarray(r.scales).dtype), torch.uint8)
    assert np.array_equal(c.scales.cpu().numpy().reshape(-1).view(np.uint8), np.asarray(r.scales).reshape(-1).view(np.uint8))
    assert (c.zero_points is None) == (r.zero_points is None)
    if r.zero_points is not None:
        assert c.zero_points.dtype == torch.float16
        assert np.array_equal(c.zero_points.cpu().numpy().reshape(-1).view(np.uint16),
                              np.asarray(r.zero_points).reshape(-1).view(np.uint16))
    if r.tensor_scale is None:
        assert c.tensor_scale is None
    else:
        assert c.tensor_scale.dtype == torch.float32 and c.tensor_scale.is_cuda
        assert np.float32(c.tensor_scale.item()).tobytes() == np.float32(r.tensor_scale).tobytes()


def test_nvfp4_takes_a_given_tensor_scale_as_kvq_quantize_does():
    x = random_kv((2, 3, 40, 64), 9)
    for ts in (0.01, 0.0):
        c = kvq.gpu.quantize(x, "nvfp4", tensor_scale=ts)
        r = kvq.quantize(x.float().cpu().numpy(), "nvfp4", tensor_scale=ts)
        assert c.tensor_scale.item() == np.float32(ts)
        assert np.array_equal(c.data.cpu().numpy(), np.asarray(r.codes))
        assert np.array_equal(c.scales.cpu().numpy().reshape(-1), np.asarray(r.scales).reshape(-1))
    with pytest.raises(kvq.InputError, match="x: nvfp4 tensor scale -1 must be finite and >= 0"):
        kvq.gpu.quantize(x, "nvfp4", tensor_scale=-1.0)
    with pytest.raises(kvq.InputError, match="q4_0: a tensor scale is given, but only nvfp4 and the symmetric per-tensor"):
        kvq.gpu.quantize(x, "q4_0", tensor_scale=1.0)
    with pytest.raises(kvq.SchemeError, match="planar layout"):
        kvq.gpu.quantize(x, "q4_1", layout="fbgemm")
    with pytest.raises(kvq.SchemeError, match="block size 32 does not divide head_dim 48"):
        kvq.gpu.quantize(random_kv((1, 1, 4, 48), 1), "q4_0")
    big = x.clone()
    big[1, 2, 3, 40] = 3e38
    with pytest.raises(kvq.InputError, match=r"x: q8_0 group 407 starting at \[1, 2, 3, 32\]"):
        kvq.gpu.quantize(big.float(), "q8_0")


@pytest.mark.parametrize("scheme", ["int4-head-asym", "int4-g32-asym"])
def test_fbgemm_rows_are_the_cpu_rows(scheme):
    x = random_kv((2, 2, 33, 128), 2)
    c = kvq.gpu.quantize(x, scheme, layout="fbgemm")
    assert c.layout == "fbgemm" and tuple(c.data.shape[:3]) == (2, 33, 2)
    assert np.array_equal(c.data.cpu().numpy(), np.asarray(kvq.fbgemm_rows(kvq.quantize(x.float().cpu().numpy(), scheme))))


def test_every_quantize_variant_that_takes_a_scheme_agrees():
    x = random_kv((1, 8, 64, 128), 3)
    ref = kvq.gpu.quantize(x, "int8-head", variant="quantize-generic")
    for v in kvq.gpu.variants("quantize"):
        try:
            c = kvq.gpu.quantize(x, "int8-head", variant=v["name"])
        except kvq.InputError as e:
            assert "does not take int8-head" in str(e)
            continue
        assert torch.equal(c.data, ref.data) and torch.equal(c.scales, ref.scales), v["name"]


@pytest.mark.parametrize("k,v,layout", [("bf16", "bf16", "bnsh"), ("int8-head", "int4-g32-asym", "bnsh"),
                                        ("fp8-e4m3", "fp8-e5m2", "bnsh"), ("int4-head-asym", "int4-head-asym", "fbgemm"),
                                        ("q4_0", "q5_1", "bnsh"), ("nvfp4", "iq4_nl", "bnsh"), ("q8_0", "mxfp4", "bnsh"),
                                        ("q8_0", "nvfp4", "bnsh"),
                                        ("int4-g32-asym+w40", "int8-head+w24", "bnsh"),
                                        ("int4-chan-t32-asym+w20", "q4_0", "bnsh")])
def test_decode_tc_from_python_passes_the_gate(k, v, layout):
    r = gate.check(gate_kvq.kernel("decode-tc", layout), k, v, cases="quick", device="cuda", log=None)
    assert r.ok, "\n".join(c.line("decode-tc") for c in r.cases if not c.ok)
    # skipped only where no such cache reaches decode-tc: head_dim 96, Inf / NaN in a quantized
    # storage, and the paged layouts' family in a contiguous layout (test_paged_decode_tc_... below)
    allowed = ("head_dim 96", "a quantized storage's codes cannot hold them", "the family gates paged layouts")
    skipped = [c for c in r.with_status("SKIP") if not any(a in c.detail for a in allowed)]
    assert not skipped, [c.detail for c in skipped]
    assert r.with_status("OK")


@pytest.mark.parametrize("k,v,page_size", [("bf16", "bf16", 16), ("int8-head", "int4-g32-asym", 16),
                                           ("int8-token", "int4-head-asym", 32), ("fp8-e4m3", "fp8-e5m2-head", 64),
                                           ("q4_0", "q5_1", 128), ("nvfp4", "iq4_nl", 16), ("q8_0", "nvfp4", 32),
                                           ("int4-g32-asym", "int8-head-asym", 16),
                                           # +w<W> windows and chan-t<N> K in pages (N dividing P)
                                           ("q8_0+w17", "int4-head-asym+w33", 32), ("int4-chan-t32-asym", "int8-head", 64),
                                           ("int8-chan-t32-asym+w20", "int4-g32-asym", 32)])
def test_paged_decode_tc_from_python_passes_the_gate(k, v, page_size):
    # kvq.gate's paged cache as it lays it out (pages shuffled through a pool with poisoned spare
    # ones, shared prefix pages, ids past int16) read by decode-tc through the block table
    r = gate.check(gate_kvq.kernel("decode-tc", "paged", page_size=page_size), k, v, cases="quick", device="cuda", log=None)
    assert r.ok, "\n".join(c.line("decode-tc") for c in r.cases if not c.ok)
    allowed = ("head_dim 96", "a quantized storage's codes cannot hold them")
    skipped = [c for c in r.with_status("SKIP") if not any(a in c.detail for a in allowed)]
    assert not skipped, [c.detail for c in skipped]
    assert r.with_status("OK")


def test_a_wrong_kernel_on_the_gpu_fails():
    def off_by_one(case):  # reads one key fewer than seq_len
        lens = (case.seq_lens - 1).clamp(min=0)
        return kvq.gpu.decode(case.q, case.k.values, case.v.values, seq_lens=lens.to(torch.int32),
                              softmax_scale=case.softmax_scale)
    r = gate.check(gate.Kernel(off_by_one, name="off-by-one", profile="fp32-pbf16-obf16"), cases=["varlen", "mha"],
                   device="cuda", log=None)
    assert not r.ok and {c.status for c in r.cases} == {"FAIL"}


def test_errors_say_what_is_wrong():
    q = torch.zeros(2, 4, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.zeros(2, 2, 16, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(kvq.InputError, match="q: expected a CUDA tensor"):
        kvq.gpu.decode(q.cpu(), k, k)
    with pytest.raises(kvq.InputError, match="q: dtype float32, expected bfloat16"):
        kvq.gpu.decode(q.float(), k, k)
    with pytest.raises(kvq.InputError, match="k: batch 1, but q has B = 2"):
        kvq.gpu.decode(q, k[:1], k[:1])
    with pytest.raises(kvq.InputError, match="no decode variant named 'decode-nope'"):
        kvq.gpu.decode(q, k, k, variant="decode-nope")
    with pytest.raises(kvq.InputError, match="CUDA-core kernels read K and V in one format"):
        kvq.gpu.decode(q, kvq.gpu.quantize(k, "int8-head"), k, variant="decode-splitk")
    with pytest.raises(kvq.SchemeError):
        kvq.gpu.quantize(k, "int4-g3x")
    bad = k.clone()
    bad[1, 0, 5, 7] = float("nan")
    with pytest.raises(kvq.InputError, match="x: non-finite value nan"):
        kvq.gpu.quantize(bad, "int8-head")
    codes = kvq.gpu.quantize(k, "int8-head")
    with pytest.raises(kvq.InputError, match="k scales: 4 bytes"):
        kvq.gpu.decode(q, kvq.gpu.Cache("int8-head", codes.data, codes.scales[:2]), k)


def test_the_current_stream_is_used():
    q = random_kv((4, 8, 128), 5)
    k, v = random_kv((4, 2, 500, 128), 6), random_kv((4, 2, 500, 128), 7)
    o, lse = kvq.gpu.decode(q, k, v)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        o2, lse2 = kvq.gpu.decode(q, k, v)
    s.synchronize()
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_kernel_attention_inside_a_model_matches_float32_attention():
    import kernel_attention
    import sequence_eval
    rng = np.random.default_rng(0)
    q = rng.standard_normal((6, 40, 64), dtype=np.float32)
    k = rng.standard_normal((2, 40, 64), dtype=np.float32)
    v = rng.standard_normal((2, 40, 64), dtype=np.float32)
    for name in ("bf16", "int8-head", "int4-g32-asym"):
        assert kernel_attention.unsupported_reason(name, name, 64) == ""
        ref = sequence_eval.attend(q, sequence_eval.CacheView(k, name), sequence_eval.CacheView(v, name), 0.125)
        got = kernel_attention.KernelAttention(name, name, budget_bytes=1 << 16)(q, k, v, 0.125)  # several chunks
        assert np.abs(got - ref).max() < 0.02 * np.abs(ref).max(), name
    assert "keeps recent tokens" in kernel_attention.unsupported_reason("int4-g32-asym+w16", "bf16", 64)
    assert "fp32" in kernel_attention.unsupported_reason("fp32", "bf16", 64)
