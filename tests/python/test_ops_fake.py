"""kvq.ops without a GPU: the custom ops' registration (schemas, what each mutates) and their fake
(meta) implementations, which torch.compile and CUDA-graph tracing run instead of the kernels. The
fake shapes are checked against the CPU codec's output for each storage, and a serving step (append
then decode, contiguous and paged, windows and chan-t<N>) traces with torch.compile(fullgraph=True)
on meta tensors: no graph breaks, every op in the graph. test_ops.py checks the same ops against
the kernels on a device (torch.library.opcheck). Also what kvq._gpu answers without a device: which
storages a decode variant reads (decode_support, as kvq.gate_kvq asks it)."""
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kvq  # noqa: E402

# The fake implementations take their shapes from kvq._gpu (no device needed). Skip only where that
# module was never built (KVQ_CUDA=OFF); a built one that fails to load is an error, not a skip.
try:
    import kvq._gpu  # noqa: E402,F401
except ModuleNotFoundError as e:
    if e.name != "kvq._gpu":
        raise
    pytest.skip("kvq was built without its CUDA kernels (KVQ_CUDA=OFF): no kvq._gpu, whose shapes the fake ops use",
                allow_module_level=True)

import kvq.ops  # noqa: E402

META = "meta"
SCHEMES = ["int8-head", "int8-head-asym", "int4-g32-asym", "int8-token", "int4-token-asym", "int8-tensor",
           "int4-tensor-asym", "fp8-e4m3", "fp8-e5m2-head", "fp8-e4m3-tensor", "q4_0", "q5_1", "q8_0", "iq4_nl",
           "mxfp4", "nvfp4", "int8-chan-t32-asym", "q8_0+had", "int8-head+w16"]


def test_ops_are_registered_with_what_they_mutate():
    mutated = {"quantize": {"status"}, "decode": set(), "append_rows": {"dst_codes", "dst_scales", "dst_zeros", "status"},
               "flush_channel_groups": {"codes", "scales", "zeros", "status"}}
    for name, want in mutated.items():
        schema = getattr(torch.ops.kvq, name).default._schema
        got = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert got == want, (name, got)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("shape", [(2, 3, 64, 128), (1, 1, 33, 64), (3, 2, 96, 256)])
def test_fake_quantize_gives_the_codecs_shapes(scheme, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    ref = kvq.quantize(x, scheme)
    nvfp4 = kvq.parse_scheme(scheme).format == "nvfp4"
    codes, scales, zeros, tensor_scale = torch.ops.kvq.quantize(torch.empty(shape, dtype=torch.bfloat16, device=META),
                                                                scheme, "planar", "", 1.0 if nvfp4 else None, None)
    assert tuple(codes.shape) == ref.codes.shape and codes.dtype == torch.uint8
    for fake, real in ((scales, ref.scales), (zeros, ref.zero_points)):
        assert fake.dim() == 1 and fake.numel() == (0 if real is None else real.size)
        if real is not None:
            assert fake.dtype == {np.dtype("float16"): torch.float16, np.dtype("float32"): torch.float32,
                                  np.dtype("uint8"): torch.uint8}[real.dtype]
    if nvfp4:  # s_t, a 0-dim float32 tensor
        assert tensor_scale.dim() == 0 and tensor_scale.dtype == torch.float32
    else:
        assert tensor_scale.numel() == 0


@pytest.mark.parametrize("scheme", ["int4-head-asym", "int4-g32-asym", "int4-g64-asym"])
def test_fake_quantize_gives_fbgemm_rows_shape(scheme):
    shape = (2, 4, 48, 128)
    ref = kvq.fbgemm_rows(kvq.quantize(np.ones(shape, np.float32), scheme))
    codes = torch.ops.kvq.quantize(torch.empty(shape, dtype=torch.bfloat16, device=META), scheme, "fbgemm", "", None,
                                   None)[0]
    assert tuple(codes.shape) == np.asarray(ref).shape


def test_fake_decode_gives_output_and_lse_shapes():
    q = torch.empty(3, 8, 128, dtype=torch.bfloat16, device=META)
    k = kvq.ops.quantize(torch.empty(3, 2, 70, 128, dtype=torch.bfloat16, device=META), "int8-head")
    v = kvq.ops.quantize(torch.empty(3, 2, 70, 128, dtype=torch.bfloat16, device=META), "q4_0")
    o, lse = kvq.ops.decode(q, k, v, seq_lens=torch.empty(3, dtype=torch.int32, device=META))
    assert (tuple(o.shape), o.dtype, tuple(lse.shape), lse.dtype) == ((3, 8, 128), torch.bfloat16, (3, 8), torch.float32)


def serving_step(paged, k_scheme, v_scheme, B=2, H=2, Hq=4, D=64, P=32, pages=8, layout="nhd"):
    """One decode step as a serving loop writes it: append a token per sequence, then decode."""
    if paged:
        k = kvq.ops.empty_paged_cache(k_scheme, pages, P, H, D, device=META, layout=layout)
        v = kvq.ops.empty_paged_cache(v_scheme, pages, P, H, D, device=META, layout=layout)
    else:
        k = kvq.ops.empty_cache(k_scheme, B, H, pages * P // B, D, device=META)
        v = kvq.ops.empty_cache(v_scheme, B, H, pages * P // B, D, device=META)
    windows = k.window is not None or v.window is not None
    table = torch.empty(B, pages // B, dtype=torch.int32, device=META) if paged else None
    wtable = table if paged and windows else None
    status = torch.full((3,), -1, dtype=torch.int64, device=META)  # kvq.gpu.new_status on the meta device

    def step(q, k_new, v_new, positions):
        for cache, new in ((k, k_new), (v, v_new)):  # a window table for a cache with a window
            kvq.ops.append(cache, new, positions, block_table=table, window_table=wtable if cache.window is not None else None,
                           status=status)
        return kvq.ops.decode(q, k, v, seq_lens=positions + 1, block_table=table, window_table=wtable)

    args = (torch.empty(B, Hq, D, dtype=torch.bfloat16, device=META),
            torch.empty(B, H, 1, D, dtype=torch.bfloat16, device=META),
            torch.empty(B, H, 1, D, dtype=torch.bfloat16, device=META), torch.empty(B, dtype=torch.int32, device=META))
    return step, args


class GraphRecorder:
    """A torch.compile backend that keeps the graphs dynamo hands it and runs them as they are."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


@pytest.mark.parametrize("paged,layout", [(False, "nhd"), (True, "nhd"), (True, "hnd")],
                         ids=["contiguous", "paged", "paged-hnd"])
@pytest.mark.parametrize("k_scheme,v_scheme,ops", [
    ("int8-head", "int4-g32-asym", {"quantize": 2, "append_rows": 2, "decode": 1}),
    ("bf16", "q4_0", {"quantize": 1, "append_rows": 2, "decode": 1}),
    ("int8-head+w16", "int4-head-asym+w16", {"quantize": 2, "append_rows": 4, "decode": 1}),
    ("int4-chan-t32-asym", "int8-head", {"quantize": 1, "append_rows": 2, "flush_channel_groups": 1, "decode": 1})])
def test_serving_step_compiles_to_one_graph_of_kvq_ops(paged, layout, k_scheme, v_scheme, ops):
    torch._dynamo.reset()
    step, args = serving_step(paged, k_scheme, v_scheme, layout=layout)
    backend = GraphRecorder()
    o, lse = torch.compile(step, backend=backend, fullgraph=True)(*args)  # fullgraph: a break raises
    assert (tuple(o.shape), tuple(lse.shape)) == ((2, 4, 64), (2, 4))
    assert len(backend.graphs) == 1
    called = {}
    for node in backend.graphs[0].graph.nodes:
        target = str(node.target)
        if node.op == "call_function" and target.startswith("kvq."):
            name = target.split(".")[1]
            called[name] = called.get(name, 0) + 1
    assert called == ops


def test_append_checks_its_shapes_under_tracing():
    # append's checks are plain Python over shapes, so they raise under tracing as they do eagerly
    step, args = serving_step(True, "int8-head", "int8-head")
    q, k_new, v_new, positions = args
    bad = torch.empty(2, 3, 1, 64, dtype=torch.bfloat16, device=META)  # 3 heads, the cache has 2
    with pytest.raises(kvq.InputError, match=r"new tokens have shape \[2, 3, 1, 64\], expected \[2, 2, t, D\]"):
        step(q, bad, v_new, positions)
    with pytest.raises(Exception, match="new tokens have shape"):  # dynamo wraps the error it traced
        torch.compile(step, backend="eager", fullgraph=True)(q, bad, v_new, positions)


def test_decode_support_judges_the_page_size_it_is_asked_about():
    from kvq._gpu import decode_support
    # chan-t32 K needs pages that hold whole token groups: refused in pages of 16, read in pages of 64
    why16 = decode_support("decode-tc", "int4-chan-t32-asym", "int8-head", "paged", 128, 16)["reason"]
    assert "N dividing P" in why16, why16
    assert decode_support("decode-tc", "int4-chan-t32-asym", "int8-head", "paged", 128, 64)["reason"] == ""
    assert "power of two" in decode_support("decode-tc", "int8-head", "int8-head", "paged", 128, 24)["reason"]
    assert decode_support("decode-tc", "int8-head", "int8-head", "bnsh", 128)["reason"] == ""


def test_one_pool_keeps_each_pages_parts_together_at_aligned_offsets():
    g = torch.Generator().manual_seed(7)
    codes = torch.randint(0, 256, (5, 16, 2, 72), dtype=torch.uint8, generator=g)  # [pages, P, H, row]
    scales = torch.randn(5, 2, 16, 3, generator=g).half()
    zeros = torch.randn(5, 2, 16, 3, generator=g).half()
    c, s, z = kvq.gpu.one_pool(codes, scales, zeros)
    for view, want in ((c, codes), (s, scales), (z, zeros)):
        assert view.shape == want.shape and view.dtype == want.dtype and torch.equal(view, want)
    page = c.untyped_storage().nbytes() // 5
    assert c.stride(0) == page and s.stride(0) * 2 == page and z.stride(0) * 2 == page
    offsets = [t.data_ptr() - c.data_ptr() for t in (c, s, z)]
    assert offsets == [0, 2304, 2560]  # 2304 bytes of codes, 192 of scales, then of zero points: each at a line
    assert page == 2816
    assert kvq.gpu.one_pool(codes, None, scales)[1] is None
    with pytest.raises(kvq.InputError, match="one page count"):
        kvq.gpu.one_pool(codes, scales[:4])
    with pytest.raises(kvq.InputError, match="multiple of 16"):
        kvq.gpu.one_pool(codes, scales, align=8)


@pytest.mark.parametrize("scheme,params_in_page", [("int8-head", False), ("int4-g32-asym", True), ("bf16", False),
                                                   ("int8-token", False), ("int8-head+w16", False)])
def test_hnd_pages_are_head_major_under_the_nhd_view(scheme, params_in_page):
    """layout="hnd" stores each page [H, P, row] and hands append / decode the [pages, P, H, row] view
    that layout="nhd" stores as it is: the same shapes, the parameters alike, only the codes' strides differ."""
    pages, P, H, D = 6, 32, 3, 64
    nhd, hnd = (kvq.ops.empty_paged_cache(scheme, pages, P, H, D, device=META, params_in_page=params_in_page, layout=lay)
                for lay in ("nhd", "hnd"))
    for a, b in ((nhd.data, hnd.data), (nhd.window, hnd.window)):
        if a is None:
            assert b is None
            continue
        assert a.shape == b.shape and a.dtype == b.dtype
        row = a.shape[3]
        assert a.stride()[1:] == (H * row, row, 1)  # NHD: a token's heads together
        assert b.stride()[1:] == (row, P * row, 1)  # HND: a head's tokens together
        assert a.stride(0) == b.stride(0)
    for a, b in ((nhd.scales, hnd.scales), (nhd.zero_points, hnd.zero_points)):
        assert (a is None and b is None) or (a.shape == b.shape and a.stride() == b.stride())


def test_paged_cache_refuses_an_unknown_layout():
    with pytest.raises(kvq.InputError, match="layout 'bshd', expected 'nhd' or 'hnd'"):
        kvq.ops.empty_paged_cache("int8-head", 4, 16, 2, 64, device=META, layout="bshd")


@pytest.mark.parametrize("args,kwargs,message", [
    ((4, 24, 2, 64), {}, "pages of 24 tokens: kvq's paged decode reads pages of a power of two >= 16 tokens"),
    ((4, 8, 2, 64), {}, "pages of 8 tokens"),
    ((0, 16, 2, 64), {}, "pages = 0, expected >= 1"),
    ((4, 16, 0, 64), {}, "heads = 0, expected >= 1"),
    ((4, 16, 2, -64), {}, "head_dim = -64, expected >= 1"),
    ((4, 16, 2, 64), {"window_pages": 0}, "window_pages = 0, expected >= 1"),
])
def test_paged_cache_refuses_sizes_its_decode_cannot_read(args, kwargs, message):
    scheme = "int8-head+w32" if "window_pages" in kwargs else "int8-head"
    with pytest.raises(kvq.InputError, match=re.escape("kvq.ops.empty_paged_cache: " + message)):
        kvq.ops.empty_paged_cache(scheme, *args, device=META, **kwargs)


@pytest.mark.parametrize("args,message", [((-1, 2, 16, 64), "batch = -1, expected >= 0"),
                                          ((2, 0, 16, 64), "heads = 0, expected >= 1"),
                                          ((2, 2, 0, 64), "capacity = 0, expected >= 1")])
def test_cache_refuses_sizes_below_one(args, message):
    with pytest.raises(kvq.InputError, match=re.escape("kvq.ops.empty_cache: " + message)):
        kvq.ops.empty_cache("int8-head", *args, device=META)
    assert kvq.ops.empty_cache("int8-head", 0, 2, 16, 64, device=META).data.shape == (0, 2, 16, 64)  # an empty batch
