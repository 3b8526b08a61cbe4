"""kvq.ops: kvq's GPU kernels as torch custom ops. torch.library.opcheck on each (schema, fake
implementation against the real one, torch.compile with static and dynamic shapes), the same bits as
kvq.gpu's calls, a decode step captured in a CUDA graph and replayed with new inputs, and quantize +
decode compiled with fullgraph=True (no graph breaks). Skipped where kvq was built without its kernels
or there is no CUDA device (CI); scripts/device_run.sh runs it."""
import pytest

import kvq
import kvq.gpu

if not kvq.gpu.available():
    pytest.skip(kvq.gpu.why_unavailable(), allow_module_level=True)

import torch  # noqa: E402

import kvq.ops  # noqa: E402

STORAGES = ["bf16", "int8-head", "int4-g32-asym", "q4_0", "fp8-e4m3-head", "nvfp4", "q8_0+had"]


def random_kv(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * (1 + 6 * (torch.rand(shape[-1], generator=g) > 0.9))).to(torch.bfloat16).cuda()


def cache(x, storage):
    return x if storage == "bf16" else kvq.ops.quantize(x, storage)


def problem(B=3, Hq=8, Hkv=2, T=300, D=128, seed=0):
    q = random_kv((B, Hq, D), seed)
    k, v = random_kv((B, Hkv, T, D), seed + 1), random_kv((B, Hkv, T, D), seed + 2)
    lens = torch.tensor([T, T // 3, 1][:B], dtype=torch.int32, device="cuda")
    return q, k, v, lens


def op_args(q, k, v, lens, block_table=None):
    """torch.ops.kvq.decode's arguments for kvq.ops.decode(q, k, v, seq_lens=lens)."""
    return kvq.ops.decode_args(q, k, v, seq_lens=lens, block_table=block_table)


@pytest.mark.parametrize("scheme,ts", [("int8-head", None), ("int4-g32-asym", None), ("q4_0", None), ("nvfp4", None),
                                       ("nvfp4", 0.01), ("fp8-e4m3-head", None), ("int4-chan-t32-asym", None),
                                       ("fp8-e4m3-tensor", None), ("fp8-e4m3-tensor", 0.02)])
def test_quantize_op_is_kvq_gpu_quantize(scheme, ts):
    x = random_kv((2, 3, 70, 64), 4)
    a, b = kvq.ops.quantize(x, scheme, tensor_scale=ts), kvq.gpu.quantize(x, scheme, tensor_scale=ts)
    assert torch.equal(a.data, b.data)
    for name in ("scales", "zero_points", "tensor_scale"):
        ta, tb = getattr(a, name), getattr(b, name)
        assert (ta is None) == (tb is None) and (ta is None or (ta.dtype == tb.dtype and torch.equal(ta, tb)))
    torch.library.opcheck(torch.ops.kvq.quantize.default, (x, scheme, "planar", "", ts, None))
    torch.library.opcheck(torch.ops.kvq.quantize.default, (x, scheme, "planar", "", ts, kvq.gpu.new_status()))


@pytest.mark.parametrize("k_storage", STORAGES)
@pytest.mark.parametrize("v_storage", ["bf16", "int4-g32-asym"])
def test_decode_op_is_kvq_gpu_decode_and_passes_opcheck(k_storage, v_storage):
    q, k, v, lens = problem()
    kc, vc = cache(k, k_storage), cache(v, v_storage)
    o, lse = kvq.ops.decode(q, kc, vc, seq_lens=lens)
    o_ref, lse_ref = kvq.gpu.decode(q, kc, vc, seq_lens=lens)
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    torch.library.opcheck(torch.ops.kvq.decode.default, op_args(q, kc, vc, lens))


def test_decode_in_a_cuda_graph_replays_with_new_inputs():
    q, k, v, lens = problem(B=2, T=1000, seed=7)
    kc, vc = kvq.ops.quantize(k, "int8-head"), kvq.ops.quantize(v, "q4_0")
    static_q = q.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture
        kvq.ops.decode(static_q, kc, vc, seq_lens=lens)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, lse_graph = kvq.ops.decode(static_q, kc, vc, seq_lens=lens)
    for seed in (11, 12):
        new_q = random_kv(tuple(q.shape), seed)
        static_q.copy_(new_q)
        graph.replay()
        o_eager, lse_eager = kvq.ops.decode(new_q, kc, vc, seq_lens=lens)
        torch.cuda.synchronize()
        assert torch.equal(o_graph, o_eager) and torch.equal(lse_graph, lse_eager)


def test_last_split_merge_first_used_inside_a_capture_replays_as_eager():
    # 32 splits over a head block of 3 x 64 values: the last split merges (no merge kernel). The
    # capture stream's counters are allocated while it captures; the replays must leave them zero
    # (a counter left at 1 would make the wrong CTA merge next time).
    q, k, v, lens = problem(B=2, Hq=9, Hkv=3, T=4096, D=64, seed=31)
    kc, vc = kvq.ops.quantize(k, "int8-head"), kvq.ops.quantize(v, "int4-g32-asym")
    static_q = q.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # no warm-up: the first decode on this stream is captured
        o_graph, lse_graph = kvq.gpu.decode(static_q, kc, vc, seq_lens=lens, splits=32)
    for seed in (32, 33, 34):
        new_q = random_kv(tuple(q.shape), seed)
        static_q.copy_(new_q)
        graph.replay()
        o_eager, lse_eager, launch = kvq.gpu.decode(new_q, kc, vc, seq_lens=lens, splits=32, info=True)
        torch.cuda.synchronize()
        assert launch["splits"] == 32
        assert torch.equal(o_graph, o_eager) and torch.equal(lse_graph, lse_eager)


def test_quantize_and_decode_compile_without_graph_breaks():
    q, k, v, lens = problem(seed=21)

    def step(q, k, v, lens):
        return kvq.ops.decode(q, kvq.ops.quantize(k, "int4-g32-asym"), kvq.ops.quantize(v, "q8_0"), seq_lens=lens)

    compiled = torch.compile(step, fullgraph=True)  # fullgraph: a graph break is an error
    o, lse = compiled(q, k, v, lens)
    o_ref, lse_ref = step(q, k, v, lens)
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)


def test_ops_refuse_cpu_tensors_and_mixed_layouts():
    x = torch.zeros(1, 1, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError):
        torch.ops.kvq.quantize(x, "int8-head", "planar", "", None, None)
    q, k, v, lens = problem(B=1, T=40)
    with pytest.raises(kvq.InputError, match="one layout for both"):
        kvq.ops.decode(q, kvq.gpu.Cache("bf16", k, layout="bsnh"), v)


# ---- kvq.ops.append: quantize-on-append on the GPU -----------------------------------------------
import numpy as np  # noqa: E402

TOKEN_LOCAL = ["int8-token", "int8-head-asym", "int4-g32-asym", "int4-g32-asym+had", "int4-head", "q4_1", "q8_0+had64",
               "iq4_nl", "mxfp4", "nvfp4", "fp8-e4m3", "fp8-e4m3-head", "fp8-e4m3-tensor", "int8-tensor"]
# Calibrated tensor-wide scales, small enough that random_kv's outlier channels saturate.
TENSOR_SCALES = {"nvfp4": 0.01, "fp8-e4m3-tensor": 0.02, "int8-tensor": 0.1}


def host_bytes(t):
    return None if t is None else t.contiguous().view(torch.uint8).cpu().numpy().reshape(-1)


def params_of(cache, name, scheme, tokens):
    """The cache's scales or zero points of its first `tokens` slots, in group order, as bytes."""
    t = getattr(cache, name)
    if t is None:
        return None
    B, H, T, _ = cache.data.shape
    rows = t.view(B, T, -1) if kvq.parse_scheme(scheme).granularity == "token" else t.view(B, H, T, -1)
    return host_bytes(rows[:, :tokens] if rows.dim() == 3 else rows[:, :, :tokens])


@pytest.mark.parametrize("scheme", TOKEN_LOCAL)
def test_append_streams_bit_identical_to_append_quantizer(scheme):
    B, H, T, D, capacity = 2, 3, 40, 128, 48
    x = random_kv((B, H, T, D), 31)
    ts = TENSOR_SCALES.get(scheme)
    cache = kvq.ops.empty_cache(scheme, B, H, capacity, D, tensor_scale=ts)
    host = kvq.AppendQuantizer(scheme, tensor_scale=ts)
    pos = torch.zeros(B, dtype=torch.int32, device="cuda")
    for start, stop in [(0, 16)] + [(t, t + 1) for t in range(16, T)]:  # a prefill chunk, then one token at a time
        kvq.ops.append(cache, x[:, :, start:stop], pos + start, tensor_scale=ts)
        host.append(x[:, :, start:stop].float().cpu().numpy())
    r = host.result()
    assert np.array_equal(host_bytes(cache.data[:, :, :T]), np.asarray(r.codes).view(np.uint8).reshape(-1))
    for name, ref in (("scales", r.scales), ("zero_points", r.zero_points)):
        if ref is None or np.asarray(ref).size == 0:  # scale-free FP8 stores none
            continue
        got = host_bytes(cache.scales) if kvq.parse_scheme(scheme).granularity == "tensor" else params_of(cache, name, scheme, T)
        assert np.array_equal(got, np.asarray(ref).view(np.uint8).reshape(-1)), name
    assert not cache.data[:, :, T:].any()  # slots past the stream untouched


def test_append_at_each_sequences_own_position_then_a_graphed_decode():
    # append without a status checks its input for Inf / NaN and waits: eager here; the decode that
    # reads the appended cache replays from a CUDA graph.
    B, H, D, capacity = 3, 2, 128, 64
    k_all, v_all = random_kv((B, H, capacity, D), 41), random_kv((B, H, capacity, D), 42)
    lens = torch.tensor([10, 0, 33], dtype=torch.int32, device="cuda")
    kc, vc = kvq.ops.empty_cache("int8-head", B, H, capacity, D), kvq.ops.empty_cache("q4_0", B, H, capacity, D)
    for b in range(B):  # each sequence's first tokens, as a prefill would leave them
        n = int(lens[b])
        if n:
            one = torch.tensor([0], dtype=torch.int32, device="cuda")
            for c, x in ((kc, k_all), (vc, v_all)):
                part = kvq.ops.empty_cache(c.storage, 1, H, capacity, D)
                kvq.ops.append(part, x[b:b + 1, :, :n], one)
                c.data[b] = part.data[0]
                c.scales.view(B, H, capacity, -1)[b] = part.scales.view(1, H, capacity, -1)[0]
    q = random_kv((B, 8, D), 43)
    pos, seq_lens = lens.clone(), lens.clone() + 1

    def append_token():  # token pos[b] of each sequence, at its own slot
        rows = torch.arange(B, device="cuda")
        kvq.ops.append(kc, k_all[rows, :, pos.long()][:, :, None], pos)
        kvq.ops.append(vc, v_all[rows, :, pos.long()][:, :, None], pos)

    append_token()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kvq.ops.decode(q, kc, vc, seq_lens=seq_lens)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, lse_graph = kvq.ops.decode(q, kc, vc, seq_lens=seq_lens)
    ref_k, ref_v = kvq.gpu.quantize(k_all, "int8-head"), kvq.gpu.quantize(v_all, "q4_0")
    for _ in range(3):
        pos += 1
        seq_lens += 1
        append_token()
        graph.replay()
        torch.cuda.synchronize()
        # the whole cache quantized at once, read over the same lengths: token-local codes are the same
        o_ref, lse_ref = kvq.gpu.decode(q, ref_k, ref_v, seq_lens=seq_lens)
        assert torch.equal(o_graph, o_ref) and torch.equal(lse_graph, lse_ref)


@pytest.mark.parametrize("scheme, why", [("int4-chan-t32-asym+had", "does not read a rotated \\(\\+had\\) window"),
                                         ("int8-tensor-asym", "a per-tensor zero point needs the whole cache"),
                                         ("nvfp4", "appends with a calibrated tensor_scale"),
                                         ("fp8-e4m3-tensor", "appends with a calibrated tensor_scale")])
def test_append_refuses_what_it_cannot_write_a_token_at_a_time(scheme, why):
    with pytest.raises(kvq.SchemeError, match=why):
        kvq.ops.empty_cache(scheme, 1, 1, 8, 64)


def paged_stream(k_scheme, v_scheme, B=3, H=2, D=128, P=16, capacity=96, seed=50, params_in_page=False, layout="nhd"):
    """Caches appended token by token (after a prefill chunk) both contiguous and paged (pages shuffled
    through a pool with spare ones; params_in_page: a page's parameters in its codes' page; layout: the
    pages' order, empty_paged_cache's); yields
    (q, contiguous K, V, paged K, V, block table, seq_lens)."""
    g = torch.Generator().manual_seed(seed)
    per_seq = capacity // P
    table = torch.randperm(B * per_seq + 3, generator=g)[:B * per_seq].view(B, per_seq).to(torch.int32).cuda()
    k_all, v_all = random_kv((B, H, capacity, D), seed + 1), random_kv((B, H, capacity, D), seed + 2)
    flat = [kvq.ops.empty_cache(s, B, H, capacity, D, tensor_scale=TENSOR_SCALES.get(s)) for s in (k_scheme, v_scheme)]
    pages = [kvq.ops.empty_paged_cache(s, B * per_seq + 3, P, H, D, tensor_scale=TENSOR_SCALES.get(s),
                                       params_in_page=params_in_page, layout=layout) for s in (k_scheme, v_scheme)]
    q = random_kv((B, 8, D), seed + 3)
    pos = torch.tensor([0, 5, 17][:B], dtype=torch.int32, device="cuda")
    first = 20
    operands = list(zip(flat, pages, (k_all, v_all), (TENSOR_SCALES.get(k_scheme), TENSOR_SCALES.get(v_scheme))))
    for c, p, x, ts in operands:  # a prefill chunk at each sequence's own start
        rows = torch.arange(B, device="cuda")[:, None]
        chunk = x[rows, :, (pos.long()[:, None] + torch.arange(first, device="cuda"))].permute(0, 2, 1, 3)
        kvq.ops.append(c, chunk, pos, tensor_scale=ts)
        kvq.ops.append(p, chunk, pos, tensor_scale=ts, block_table=table)
    pos += first
    for _ in range(40):  # then one token at a time, across page boundaries
        for c, p, x, ts in operands:
            token = x[torch.arange(B, device="cuda"), :, pos.long()][:, :, None]
            kvq.ops.append(c, token, pos, tensor_scale=ts)
            kvq.ops.append(p, token, pos, tensor_scale=ts, block_table=table)
        pos += 1
        yield q, flat[0], flat[1], pages[0], pages[1], table, pos.clone()


@pytest.mark.parametrize("k_scheme,v_scheme", [("int8-head", "q4_0"),
                                               ("int4-g32-asym", "int8-token"),
                                               ("fp8-e4m3-head", "fp8-e5m2"), ("q8_0+had", "mxfp4"), ("q5_1", "iq4_nl"),
                                               ("bf16", "int8-head"), ("fp8-e4m3-tensor", "int8-tensor")])
def test_paged_append_and_decode_equal_the_contiguous_cache(k_scheme, v_scheme):
    for step, (q, kc, vc, kp, vp, table, lens) in enumerate(paged_stream(k_scheme, v_scheme)):
        if step % 9:
            continue
        o_c, lse_c = kvq.ops.decode(q, kc, vc, seq_lens=lens)
        o_p, lse_p = kvq.ops.decode(q, kp, vp, seq_lens=lens, block_table=table)
        assert torch.equal(o_c, o_p) and torch.equal(lse_c, lse_p), step
    torch.library.opcheck(torch.ops.kvq.decode.default, op_args(q, kp, vp, lens, table))


@pytest.mark.parametrize("k_scheme,v_scheme", [("int8-head", "q4_0"),
                                               ("int4-g32-asym", "int8-token"),
                                               ("q8_0+had", "mxfp4")])
def test_paged_parameters_in_their_codes_pages_append_and_decode_as_their_own_pools(k_scheme, v_scheme):
    """kvq.gpu.one_pool's pages (codes, then scales, then zero points in one allocation): append writes
    and decode reads them through the views' page stride, bit for bit the contiguous cache's."""
    stream = paged_stream(k_scheme, v_scheme, params_in_page=True)
    for step, (q, kc, vc, kp, vp, table, lens) in enumerate(stream):
        if step % 13:
            continue
        assert kp.data.data_ptr() <= kp.scales.data_ptr() < kp.data.data_ptr() + kp.data.stride(0)  # one pool
        o_c, lse_c = kvq.ops.decode(q, kc, vc, seq_lens=lens)
        o_p, lse_p = kvq.ops.decode(q, kp, vp, seq_lens=lens, block_table=table)
        assert torch.equal(o_c, o_p) and torch.equal(lse_c, lse_p), step


@pytest.mark.parametrize("k_scheme,v_scheme,params_in_page", [("int8-head", "q4_0", False), ("bf16", "int4-g32-asym", False),
                                                              ("fp8-e4m3-tensor", "int8-tensor", False),
                                                              ("int4-g32-asym", "int8-token", True)])
def test_hnd_pages_append_and_decode_equal_the_contiguous_cache(k_scheme, v_scheme, params_in_page):
    """Head-major pages (layout="hnd": each page [H, P, row], the Cache its [pages, P, H, row] view):
    append writes and decode reads them through the view's strides, bit for bit the contiguous cache's."""
    stream = paged_stream(k_scheme, v_scheme, params_in_page=params_in_page, layout="hnd")
    for step, (q, kc, vc, kp, vp, table, lens) in enumerate(stream):
        if step % 9:
            continue
        for c in (kp, vp):  # a head's rows of a page lie together
            assert c.data.stride(1) * c.data.shape[1] == c.data.stride(2), c.data.stride()
        o_c, lse_c = kvq.ops.decode(q, kc, vc, seq_lens=lens)
        o_p, lse_p = kvq.ops.decode(q, kp, vp, seq_lens=lens, block_table=table)
        assert torch.equal(o_c, o_p) and torch.equal(lse_c, lse_p), step


def test_paged_decode_replays_in_a_cuda_graph():
    stream = paged_stream("int8-head", "int4-g32-asym")
    q, kc, vc, kp, vp, table, lens = next(stream)
    seq_lens = lens.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kvq.ops.decode(q, kp, vp, seq_lens=seq_lens, block_table=table)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, lse_graph = kvq.ops.decode(q, kp, vp, seq_lens=seq_lens, block_table=table)
    for q, kc, vc, kp2, vp2, table2, lens in stream:  # the same caches appended in place
        seq_lens.copy_(lens)
        graph.replay()
        torch.cuda.synchronize()
        o_ref, lse_ref = kvq.ops.decode(q, kc, vc, seq_lens=lens)
        assert torch.equal(o_graph, o_ref) and torch.equal(lse_graph, lse_ref)


def test_paged_append_refuses_a_missing_block_table():
    kp = kvq.ops.empty_paged_cache("int8-head", 4, 16, 2, 64)
    with pytest.raises(kvq.InputError, match="a paged cache needs its block_table"):
        kvq.ops.append(kp, random_kv((1, 2, 1, 64), 1), torch.zeros(1, dtype=torch.int32, device="cuda"))


def test_status_records_bad_input_where_a_plain_call_raises():
    x = random_kv((1, 2, 5, 64), 60)
    x[0, 1, 3, 7] = float("nan")
    with pytest.raises(kvq.InputError, match="non-finite"):
        kvq.ops.quantize(x, "int8-head")
    status = kvq.gpu.new_status()
    kvq.ops.quantize(x[:, :, :3], "int8-head", status=status)  # finite: nothing recorded
    kvq.gpu.check_status(status, "K")
    kvq.ops.quantize(x, "int8-head", status=status)  # returns without waiting; recorded
    with pytest.raises(kvq.InputError, match=f"K: a non-finite value .*flat element {(1 * 5 + 3) * 64 + 7} "):
        kvq.gpu.check_status(status, "K")
    status.fill_(-1)
    big = torch.full((1, 1, 1, 64), 6e4, dtype=torch.float32, device="cuda")  # an fp16 scale of 6e4 / 127 fits;
    kvq.ops.quantize(big * 1e3, "int8-head", status=status)  # ... of 6e7 / 127 overflows
    with pytest.raises(kvq.InputError, match="a scale overflows its dtype \\(group 0"):
        kvq.gpu.check_status(status, "V")


def test_capture_refuses_an_append_that_would_wait():
    kc = kvq.ops.empty_cache("int8-head", 1, 2, 16, 64)
    x, pos = random_kv((1, 2, 1, 64), 61), torch.zeros(1, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(kvq.InputError, match="needs status="):
        with torch.cuda.graph(graph):
            kvq.ops.append(kc, x, pos)


@pytest.mark.parametrize("k_scheme,v_scheme", [("int8-head", "q4_0"), ("int4-g32-asym+had", "nvfp4"),
                                               ("fp8-e4m3-tensor", "int8-head")])
def test_paged_append_and_decode_captured_in_one_graph(k_scheme, v_scheme):
    """One decode step as a serving engine captures it: append each sequence's new K/V token into its
    page, then decode; replayed token after token, it equals eager contiguous appends and decodes,
    and the pages hold kvq.AppendQuantizer's codes."""
    B, H, Hq, D, P, capacity, prefill = 3, 2, 8, 128, 16, 80, 7
    ts = {s: TENSOR_SCALES.get(s) for s in (k_scheme, v_scheme)}
    g = torch.Generator().manual_seed(70)
    per_seq = capacity // P
    table = torch.randperm(B * per_seq + 2, generator=g)[:B * per_seq].view(B, per_seq).to(torch.int32).cuda()
    k_all, v_all = random_kv((B, H, capacity, D), 71), random_kv((B, H, capacity, D), 72)
    pages = [kvq.ops.empty_paged_cache(s, B * per_seq + 2, P, H, D, tensor_scale=ts[s]) for s in (k_scheme, v_scheme)]
    flat = [kvq.ops.empty_cache(s, B, H, capacity, D, tensor_scale=ts[s]) for s in (k_scheme, v_scheme)]
    zero = torch.zeros(B, dtype=torch.int32, device="cuda")
    for c, p, x, s in zip(flat, pages, (k_all, v_all), (k_scheme, v_scheme)):
        kvq.ops.append(c, x[:, :, :prefill], zero, tensor_scale=ts[s])
        kvq.ops.append(p, x[:, :, :prefill], zero, tensor_scale=ts[s], block_table=table)
    status = kvq.gpu.new_status()
    pos = torch.full((B,), prefill, dtype=torch.int32, device="cuda")
    new_k, new_v, q = (torch.zeros(B, H, 1, D, dtype=torch.bfloat16, device="cuda"),
                       torch.zeros(B, H, 1, D, dtype=torch.bfloat16, device="cuda"), random_kv((B, Hq, D), 73))
    seq_lens = pos + 1

    def step():
        kvq.ops.append(pages[0], new_k, pos, tensor_scale=ts[k_scheme], block_table=table, status=status)
        kvq.ops.append(pages[1], new_v, pos, tensor_scale=ts[v_scheme], block_table=table, status=status)
        return kvq.ops.decode(q, pages[0], pages[1], seq_lens=seq_lens, block_table=table)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (writes slot `prefill` again below)
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, lse_graph = step()
    rows = torch.arange(B, device="cuda")
    for t in range(prefill, prefill + 40):
        pos.fill_(t)
        seq_lens.fill_(t + 1)
        new_k.copy_(k_all[:, :, t:t + 1])
        new_v.copy_(v_all[:, :, t:t + 1])
        graph.replay()
        for c, x, s in zip(flat, (k_all, v_all), (k_scheme, v_scheme)):
            kvq.ops.append(c, x[rows, :, pos.long()][:, :, None], pos, tensor_scale=ts[s])
        o_ref, lse_ref = kvq.ops.decode(q, flat[0], flat[1], seq_lens=seq_lens)
        torch.cuda.synchronize()
        assert torch.equal(o_graph, o_ref) and torch.equal(lse_graph, lse_ref), t
    kvq.gpu.check_status(status)
    T = prefill + 40
    for p, x, s in zip(pages, (k_all, v_all), (k_scheme, v_scheme)):  # each sequence's pages, in order
        host = kvq.AppendQuantizer(s, tensor_scale=ts[s])
        host.append(x[:, :, :T].float().cpu().numpy())
        codes = p.data[table.long()].flatten(1, 2)[:, :T].permute(0, 2, 1, 3)  # [B, H, T, row bytes]
        assert np.array_equal(host_bytes(codes), np.asarray(host.result().codes).view(np.uint8).reshape(-1)), s


def test_append_outside_the_cache_writes_nothing_there_and_says_so():
    x = random_kv((2, 2, 2, 64), 62)
    kc = kvq.ops.empty_cache("int8-head", 2, 2, 16, 64)
    pos = torch.tensor([3, 15], dtype=torch.int32, device="cuda")  # sequence 1's second token: slot 16 of 16
    with pytest.raises(kvq.InputError, match="slot lies outside its cache \\(token 3 of its call"):
        kvq.ops.append(kc, x, pos)
    want = kvq.ops.quantize(x, "int8-head")
    assert torch.equal(kc.data[0, :, 3:5], want.data[0]) and torch.equal(kc.data[1, :, 15], want.data[1, :, 0])
    assert not kc.data[0, :, :3].any() and not kc.data[0, :, 5:].any() and not kc.data[1, :, :15].any()
    kp = kvq.ops.empty_paged_cache("q4_0", 4, 16, 2, 64)
    table = torch.tensor([[0, 1], [2, 7]], dtype=torch.int32, device="cuda")  # page 7: past the pool of 4
    status, before = kvq.gpu.new_status(), kp.data.clone()  # q4_0's empty slots hold code 8, not 0
    kvq.ops.append(kp, x, torch.tensor([5, 15], dtype=torch.int32, device="cuda"), block_table=table, status=status)
    with pytest.raises(kvq.InputError, match="token 3 of its call"):
        kvq.gpu.check_status(status, "V")
    want = kvq.ops.quantize(x, "q4_0").data
    assert torch.equal(kp.data[0, 5:7], want[0].transpose(0, 1)) and torch.equal(kp.data[2, 15], want[1, :, 0])
    assert torch.equal(kp.data[1], before[1]) and torch.equal(kp.data[3], before[3])


# ---- +w<W> windows: raw tokens beside the codes, in pages of their own ---------------------------------
def reference_decode(q, k, v, lens):
    """float64 attention of q [B, Hq, D] over k, v [B, H, T, D] (numpy, the values attention reads),
    the first lens[b] tokens of each sequence."""
    qn = q.double().cpu().numpy()
    B, Hq, D = qn.shape
    group = Hq // k.shape[1]
    o = np.zeros((B, Hq, D))
    for b in range(B):
        n = int(lens[b])
        for h in range(Hq):
            s = k[b, h // group, :n] @ qn[b, h] / np.sqrt(D)
            p = np.exp(s - s.max())
            o[b, h] = p @ v[b, h // group, :n] / p.sum()
    return o


@pytest.mark.parametrize("k_scheme,v_scheme,P,layout", [("int4-g32-asym+w40", "int8-head+w24", 16, "nhd"),
                                                        ("q8_0+w17", "int4-head-asym", 32, "nhd"),
                                                        ("int4-head-asym", "nvfp4+w20", 16, "nhd"),
                                                        ("fp8-e4m3-tensor+w16", "int8-token+w33", 16, "nhd"),
                                                        ("int4-g32-asym+w40", "int8-head+w24", 16, "hnd")])
def test_windowed_append_and_decode_read_the_window_raw(k_scheme, v_scheme, P, layout):
    """Token by token into a contiguous cache and a paged one whose window pages are a ring per
    sequence (a few pages held, not the sequence's): the codes before the window are
    kvq.AppendQuantizer's, and both decodes, at lengths that put each sequence's window elsewhere,
    attend to the values quantize-on-append hands attention (dequantized before the window, raw in it)."""
    B, H, Hq, D, capacity, shorter = 3, 2, 8, 128, 96, [0, 5, 11]
    schemes = (k_scheme, v_scheme)
    ts = [TENSOR_SCALES.get(s.split("+")[0]) for s in schemes]
    windows = [kvq.parse_scheme(s).window for s in schemes]
    per_seq = capacity // P
    g = torch.Generator().manual_seed(80)
    table = torch.randperm(B * per_seq, generator=g).view(B, per_seq).to(torch.int32).cuda()
    ring = (max(w or 0 for w in windows) + max(shorter)) // P + 2  # pages that hold every window read below
    window_table = (torch.arange(B)[:, None] * ring + torch.arange(per_seq)[None, :] % ring).to(torch.int32).cuda()
    flat = [kvq.ops.empty_cache(s, B, H, capacity, D, tensor_scale=t) for s, t in zip(schemes, ts)]
    pages = [kvq.ops.empty_paged_cache(s, B * per_seq, P, H, D, tensor_scale=t, window_pages=B * ring, layout=layout)
             for s, t in zip(schemes, ts)]
    hosts = [kvq.AppendQuantizer(s, tensor_scale=t) for s, t in zip(schemes, ts)]
    xs = [random_kv((B, H, capacity, D), 81), random_kv((B, H, capacity, D), 82)]
    raw = [x.double().cpu().numpy() for x in xs]
    # token-local codes: a token dequantizes alike whenever it is quantized
    deq = [kvq.quantize(x.float().cpu().numpy(), kvq.parse_scheme(s).without_window, tensor_scale=t).dequantized
           for x, s, t in zip(xs, schemes, ts)]
    q = random_kv((B, Hq, D), 83)
    zero = torch.zeros(B, dtype=torch.int32, device="cuda")
    for step, (start, stop) in enumerate([(0, 20)] + [(t, t + 1) for t in range(20, 90)]):
        for c, p, host, x, t, w in zip(flat, pages, hosts, xs, ts, windows):
            new = x[:, :, start:stop]
            kvq.ops.append(c, new, zero + start, tensor_scale=t)
            kvq.ops.append(p, new, zero + start, tensor_scale=t, block_table=table, window_table=None if w is None
                           else window_table)
            host.append(new.float().cpu().numpy())
        if step % 7:
            continue
        lens = [stop - d for d in shorter]
        read = [np.array(d, dtype=np.float64) for d in deq]
        for r, w, x in zip(read, windows, raw):
            for b, n in enumerate(lens):
                first_raw = n if w is None else max(0, n - w)
                r[b, :, first_raw:n] = x[b, :, first_raw:n]
        ref = reference_decode(q, read[0], read[1], lens)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        o_c, _ = kvq.ops.decode(q, flat[0], flat[1], seq_lens=seq_lens)
        o_p, _ = kvq.ops.decode(q, pages[0], pages[1], seq_lens=seq_lens, block_table=table, window_table=window_table)
        for o in (o_c, o_p):
            err = np.abs(o.double().cpu().numpy() - ref).max()
            assert err <= 1e-2 * np.abs(ref).max() + 1e-2, (stop, err)
    for c, host in zip(flat, hosts):  # the codes before the window: AppendQuantizer's
        r = host.result()
        n = r.codes.shape[2]
        assert np.array_equal(host_bytes(c.data[:, :, :n]), np.asarray(r.codes).view(np.uint8).reshape(-1))
    torch.library.opcheck(torch.ops.kvq.decode.default,
                          kvq.ops.decode_args(q, pages[0], pages[1], seq_lens=seq_lens, block_table=table,
                                              window_table=window_table))


def test_windowed_caches_refuse_what_they_cannot_read():
    with pytest.raises(kvq.SchemeError, match="rotated"):
        kvq.ops.empty_cache("int4-g32-asym+had+w16", 1, 1, 8, 64)
    kp = kvq.ops.empty_paged_cache("int8-head+w16", 4, 16, 1, 64)
    x, pos = random_kv((1, 1, 1, 64), 84), torch.zeros(1, dtype=torch.int32, device="cuda")
    table = torch.zeros(1, 2, dtype=torch.int32, device="cuda")
    with pytest.raises(kvq.InputError, match="needs its window_table"):
        kvq.ops.append(kp, x, pos, block_table=table)
    q = random_kv((1, 8, 64), 85)
    with pytest.raises(kvq.InputError, match="needs window_table"):
        kvq.ops.decode(q, kp, kvq.ops.empty_paged_cache("int8-head", 4, 16, 1, 64), seq_lens=pos + 1, block_table=table)
    with pytest.raises(kvq.InputError, match="raw \\(bf16 / fp16\\) K or V beside a \\+wW window"):
        kvq.ops.decode(q, kvq.ops.empty_paged_cache("bf16", 4, 16, 1, 64), kp, seq_lens=pos + 1, block_table=table,
                       window_table=table, variant="decode-tc")


def test_windowed_paged_step_replays_in_a_cuda_graph():
    """Append K and V (+w<W>) into pages and their window ring, then decode, captured once and replayed
    token after token: equal, bit for bit, to the same ops run eagerly on a second set of caches."""
    B, H, Hq, D, P, capacity, schemes = 2, 2, 8, 128, 16, 96, ("int4-g32-asym+w24", "int8-head+w40")
    per_seq, ring = capacity // P, 4
    table = torch.arange(B * per_seq, dtype=torch.int32, device="cuda").flip(0).view(B, per_seq).contiguous()
    window_table = (torch.arange(B)[:, None] * ring + torch.arange(per_seq)[None, :] % ring).to(torch.int32).cuda()
    sets = [[kvq.ops.empty_paged_cache(s, B * per_seq, P, H, D, window_pages=B * ring) for s in schemes]
            for _ in range(2)]
    xs = [random_kv((B, H, capacity, D), 90), random_kv((B, H, capacity, D), 91)]
    q = random_kv((B, Hq, D), 92)
    status = kvq.gpu.new_status()
    pos = torch.zeros(B, dtype=torch.int32, device="cuda")
    new = [torch.zeros(B, H, 1, D, dtype=torch.bfloat16, device="cuda") for _ in schemes]

    def step(caches, st):
        for c, x in zip(caches, new):
            kvq.ops.append(c, x, pos, block_table=table, window_table=window_table, status=st)
        return kvq.ops.decode(q, caches[0], caches[1], seq_lens=pos + 1, block_table=table, window_table=window_table)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(sets[0], status)  # warm-up: writes slot 0, written again by the first replay
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, lse_graph = step(sets[0], status)
    for t in range(70):
        pos.fill_(t)
        for n, x in zip(new, xs):
            n.copy_(x[:, :, t:t + 1])
        graph.replay()
        o_eager, lse_eager = step(sets[1], None)
        torch.cuda.synchronize()
        assert torch.equal(o_graph, o_eager) and torch.equal(lse_graph, lse_eager), t
    kvq.gpu.check_status(status)
    for a, b in zip(*sets):
        assert torch.equal(a.data, b.data) and torch.equal(a.window, b.window)


@pytest.mark.parametrize("k_scheme,v_scheme,P", [("int4-chan-t32-asym", "int4-g32-asym", 32),
                                                 ("int8-chan-t64", "int8-head", 128)])
def test_paged_chan_t_decode_equals_the_contiguous_cache(k_scheme, v_scheme, P):
    """chan-t<N> K (KIVI) in pages that hold whole token groups: codes [pages, P, Hkv, row], each page's
    per-channel parameters [pages, Hkv, P / N, D]; decode equals the contiguous cache bit for bit."""
    B, H, Hq, D, T = 2, 2, 8, 128, 256
    N = kvq.parse_scheme(k_scheme).group
    k, v, q = random_kv((B, H, T, D), 93), random_kv((B, H, T, D), 94), random_kv((B, Hq, D), 95)
    kc, vc = kvq.gpu.quantize(k, k_scheme), kvq.gpu.quantize(v, v_scheme)
    per_seq = T // P
    g = torch.Generator().manual_seed(96)
    table = torch.randperm(B * per_seq, generator=g).view(B, per_seq).to(torch.int32).cuda()
    order = torch.argsort(table.flatten().long())  # pool page j holds (sequence, page) order[j]

    def pages_of(x, per_page):  # [B, H, per_seq * per_page, ...] -> [pool pages, H, per_page, ...]
        x = x.reshape(B, H, per_seq, per_page, *x.shape[3:]).transpose(1, 2).flatten(0, 1)
        return x[order].contiguous()

    def paged(c, storage):
        s = kvq.parse_scheme(storage)
        codes = pages_of(c.data, P).transpose(1, 2).contiguous()  # [pages, P, H, row]
        if s.granularity == "channel":
            rows = lambda t: pages_of(t.view(B, H, T // N, D), P // N)  # noqa: E731
        else:
            rows = lambda t: pages_of(t.view(B, H, T, -1), P)  # noqa: E731
        return kvq.gpu.Cache(storage, codes, rows(c.scales), None if c.zero_points is None else rows(c.zero_points),
                             "paged")

    lens = torch.tensor([T, T - 77], dtype=torch.int32, device="cuda")
    o_c, lse_c = kvq.gpu.decode(q, kc, vc, seq_lens=lens)
    o_p, lse_p = kvq.gpu.decode(q, paged(kc, k_scheme), paged(vc, v_scheme), seq_lens=lens, block_table=table)
    assert torch.equal(o_c, o_p) and torch.equal(lse_c, lse_p)
    with pytest.raises(kvq.InputError, match="a token group must lie in one page"):
        small = kvq.gpu.Cache(k_scheme, torch.zeros(4, 16, H, kc.data.shape[-1], dtype=torch.uint8, device="cuda"),
                              torch.zeros(4 * H * D, dtype=kc.scales.dtype, device="cuda"),
                              None if kc.zero_points is None else torch.zeros(4 * H * D, dtype=kc.scales.dtype,
                                                                              device="cuda"), "paged")
        v16 = kvq.ops.empty_paged_cache(v_scheme, 4, 16, H, D)
        table16 = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
        kvq.gpu.decode(q, small, v16, seq_lens=lens // 16, block_table=table16, variant="decode-tc")


# ---- chan-t<N>: a token group quantized once it fills (and the window has passed it) ---------------------
@pytest.mark.parametrize("k_scheme,v_scheme,P", [("int4-chan-t32-asym", "int8-head", 64),
                                                 ("int8-chan-t64+w40", "int4-g32-asym+w24", 64),
                                                 ("int8-chan-t32", "int4-head-asym", 32)])
def test_chan_t_append_quantizes_each_group_as_append_quantizer(k_scheme, v_scheme, P):
    """A prefill chunk, then token by token, into a contiguous cache and a paged one (pages shuffled,
    the window store a pool of its own): the groups quantized so far are kvq.AppendQuantizer's codes and
    per-channel parameters byte for byte, a plain chan-t<N> cache is read as +w0 (its filling group
    raw), and both decodes attend to what AppendQuantizer hands attention."""
    B, H, Hq, D, capacity = 2, 2, 8, 128, 192
    schemes = (k_scheme, v_scheme)
    per_seq = capacity // P
    g = torch.Generator().manual_seed(130)
    table = torch.randperm(B * per_seq, generator=g).view(B, per_seq).to(torch.int32).cuda()
    window_table = torch.randperm(B * per_seq, generator=g).view(B, per_seq).to(torch.int32).cuda()
    flat = [kvq.ops.empty_cache(s, B, H, capacity, D) for s in schemes]
    pages = [kvq.ops.empty_paged_cache(s, B * per_seq, P, H, D) for s in schemes]
    assert flat[0].storage == kvq.parse_scheme(k_scheme).name + ("+w0" if "+w" not in k_scheme else "")
    hosts = [kvq.AppendQuantizer(s) for s in schemes]
    xs = [random_kv((B, H, capacity, D), 131), random_kv((B, H, capacity, D), 132)]
    read = [np.zeros((B, H, capacity, D)) for _ in schemes]  # what attention reads, per AppendQuantizer
    q = random_kv((B, Hq, D), 133)
    zero = torch.zeros(B, dtype=torch.int32, device="cuda")
    for step, (start, stop) in enumerate([(0, 45)] + [(t, t + 1) for t in range(45, 170)]):
        for c, p, host, x, r in zip(flat, pages, hosts, xs, read):
            new = x[:, :, start:stop]
            kvq.ops.append(c, new, zero + start)
            kvq.ops.append(p, new, zero + start, block_table=table, window_table=window_table if p.window is not None
                           else None)
            first, values = host.append(new.float().cpu().numpy())
            r[:, :, first:stop] = values
        if step % 9:
            continue
        ref = reference_decode(q, read[0], read[1], [stop] * B)
        seq_lens = torch.full((B,), stop, dtype=torch.int32, device="cuda")
        wt = window_table if any(p.window is not None for p in pages) else None
        o_c, _ = kvq.ops.decode(q, flat[0], flat[1], seq_lens=seq_lens)
        o_p, _ = kvq.ops.decode(q, pages[0], pages[1], seq_lens=seq_lens, block_table=table, window_table=wt)
        for o in (o_c, o_p):  # (a paged window region's steps start at a page's half: other roundings)
            err = np.abs(o.double().cpu().numpy() - ref).max()
            assert err <= 1e-2 * np.abs(ref).max() + 1e-2, (stop, err)
    for c, host, s in zip(flat, hosts, schemes):  # the quantized groups: AppendQuantizer's bytes
        sch = kvq.parse_scheme(s)
        r = host.result()
        n = r.codes.shape[2]
        assert n == host.quantized_tokens and n > 0
        assert np.array_equal(host_bytes(c.data[:, :, :n]), np.asarray(r.codes).view(np.uint8).reshape(-1))
        if sch.granularity == "channel":
            groups = -(-capacity // sch.group)
            for name, want in (("scales", r.scales), ("zero_points", r.zero_points)):
                if want is None:
                    continue
                got = getattr(c, name).view(B, H, groups, D)[:, :, :n // sch.group]
                assert np.array_equal(host_bytes(got), np.asarray(want).view(np.uint8).reshape(-1)), name


def paged_in_sequence_order(pool, table, per_page):
    """A paged pool [pages, H, per_page, ...] (codes: pass them as [pages, H, P, row]) read through the
    block table as [B, H, entries * per_page, ...]."""
    B, entries = table.shape
    x = pool[table.long().flatten()].view(B, entries, *pool.shape[1:])
    return x.transpose(1, 2).flatten(2, 3)


@pytest.mark.parametrize("params_in_page", [False, True])
@pytest.mark.parametrize("scheme", ["int8-chan-t32-asym", "int4-chan-t32", "int8-chan-t64+w40", "int4-chan-t64-asym+w7"])
def test_chan_t_append_bytes_contiguous_and_paged(scheme, params_in_page):
    """Every chan-t<N> flavour (8 / 4 bits, symmetric / asymmetric, with and without a window), streamed
    in uneven chunks: the quantized groups' codes, scales and zero points are kvq.AppendQuantizer's, in
    a contiguous cache and, read through the block table, in a paged one (its parameters in pools of
    their own or in their codes' pages)."""
    B, H, D, P, capacity = 3, 2, 64, 64, 256
    sch = kvq.parse_scheme(scheme)
    per_seq = capacity // P
    g = torch.Generator().manual_seed(140)
    table = torch.randperm(B * per_seq + 2, generator=g)[:B * per_seq].view(B, per_seq).to(torch.int32).cuda()
    window_table = torch.randperm(B * per_seq, generator=g).view(B, per_seq).to(torch.int32).cuda()
    flat = kvq.ops.empty_cache(scheme, B, H, capacity, D)
    paged = kvq.ops.empty_paged_cache(scheme, B * per_seq + 2, P, H, D, window_pages=B * per_seq,
                                      params_in_page=params_in_page)
    host = kvq.AppendQuantizer(scheme)
    x = random_kv((B, H, capacity, D), 141)
    zero = torch.zeros(B, dtype=torch.int32, device="cuda")
    bounds = [0, 3, 40, 41, 100, 101, 102, 170, 250]
    for start, stop in zip(bounds, bounds[1:]):
        new = x[:, :, start:stop]
        kvq.ops.append(flat, new, zero + start)
        kvq.ops.append(paged, new, zero + start, block_table=table, window_table=window_table)
        host.append(new.float().cpu().numpy())
    r = host.result()
    n = r.codes.shape[2]
    assert n == host.quantized_tokens and n >= 192
    groups, per_page = -(-capacity // sch.group), P // sch.group
    codes_in_order = paged_in_sequence_order(paged.data.transpose(1, 2), table, P)
    for codes in (flat.data, codes_in_order):
        assert np.array_equal(host_bytes(codes[:, :, :n]), np.asarray(r.codes).view(np.uint8).reshape(-1))
    for name, want in (("scales", r.scales), ("zero_points", r.zero_points)):
        if want is None:
            continue
        got_flat = getattr(flat, name).view(B, H, groups, D)
        got_paged = paged_in_sequence_order(getattr(paged, name).view(-1, H, per_page, D), table, per_page)
        for got in (got_flat, got_paged):
            assert np.array_equal(host_bytes(got[:, :, :n // sch.group]), np.asarray(want).view(np.uint8).reshape(-1)), name


def test_chan_t_append_checks_its_input():
    c = kvq.ops.empty_cache("int4-chan-t32-asym", 1, 2, 64, 64)
    zero = torch.zeros(1, dtype=torch.int32, device="cuda")
    with pytest.raises(kvq.InputError, match="expected torch.bfloat16"):
        kvq.ops.append(c, torch.zeros(1, 2, 3, 64, device="cuda"), zero)
    bad = torch.zeros(1, 2, 3, 64, dtype=torch.bfloat16, device="cuda")
    bad[0, 1, 2, 5] = float("nan")
    with pytest.raises(kvq.InputError, match="non-finite value"):
        kvq.ops.append(c, bad, zero)
    st = kvq.gpu.new_status()
    kvq.ops.append(c, bad, zero, status=st)
    assert st.tolist()[0] == (1 * 3 + 2) * 64 + 5
    with pytest.raises(kvq.InputError, match="do not hold whole token groups of 32"):
        kvq.ops.empty_paged_cache("int4-chan-t32-asym", 4, 16, 2, 64)
