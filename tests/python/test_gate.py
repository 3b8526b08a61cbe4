"""kvq.gate on the CPU: the correct numpy kernels (kvq/gate_examples.py) pass every family in every
layout, each deliberately wrong kernel (gate_kernels.py) fails the family that must catch it, declared
limits give [SKIP] with the kernel's reason, padding is poisoned where the docs say, the JSON report
has kvq validate's fields, the command line's exit codes, and docs/gate.md's examples run as written.
ctest puts build/python on PYTHONPATH."""
import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import kvq
import kvq.gate as gate
import kvq.gate_devices as gate_devices
from kvq.gate_examples import numpy_bnsh, numpy_bsnh, numpy_decode, numpy_fbgemm, numpy_ggml, numpy_paged

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import gate_kernels as wrong  # noqa: E402

from kvq.gate_cases import FULL_ONLY, PAGED_LAYOUTS, RAW_STORAGES  # noqa: E402

QUICK_FAMILIES = [f for f in gate.FAMILIES if f not in FULL_ONLY]


# families the numpy example kernels skip in some layout or storage (strides undeclared, spaced pages
# outside a paged layout, Inf / NaN in a quantized cache)
NOT_FOR_THE_EXAMPLES = ("strided", "spaced_pages", "nonfinite")


def run(kern, k="bf16", v="bf16", cases="quick", **kw):
    return gate.check(kern, k, v, cases=cases, log=None, **kw)


def statuses(report):
    return {c.label: c.status for c in report.cases}


# ---- correct kernels pass ----

@pytest.mark.parametrize("kern,k,v", [
    (numpy_bnsh, "bf16", "bf16"), (numpy_bnsh, "int4-chan-t32-asym", "int8-token-asym"),
    (numpy_bnsh, "fp8-e4m3-head", "fp8-e5m2"),
    (numpy_bsnh, "fp16", "bf16"), (numpy_bsnh, "int8-tensor", "int4-g32"),
    (numpy_paged, "bf16", "bf16"), (numpy_paged, "int8-head", "int4-g32-asym"),
    (numpy_paged, "int4-token-asym", "fp8-e4m3-g32-fp32"),
    (gate.Kernel(numpy_decode, name="numpy-paged-7", layout="paged", page_size=7), "int8-tensor", "fp16"),
    (gate.Kernel(numpy_decode, name="numpy-paged-64", layout="paged", page_size=64), "int4-chan-t32-asym", "int8-head"),
    # +w<W> windows: the last W tokens raw beside the codes
    (numpy_bnsh, "int4-g32-asym+w40", "int8-head+w24"), (numpy_bsnh, "q8_0+w17", "int4-head-asym"),
    (numpy_paged, "int8-token+w33", "fp8-e4m3-tensor+w16"),
    (gate.Kernel(numpy_decode, name="numpy-paged-32", layout="paged", page_size=32), "int8-chan-t32-asym+w20", "nvfp4+w5"),
    (numpy_fbgemm, "int4-g32-asym", "int4-head-asym"), (numpy_fbgemm, "bf16", "int4-g64-asym"),
    # llama.cpp's cache types and mxfp4 / nvfp4, planar
    (numpy_bnsh, "q4_0", "q5_1"), (numpy_bsnh, "iq4_nl", "nvfp4"), (numpy_paged, "mxfp4", "q8_0"),
    (numpy_paged, "q5_0", "q4_1"), (numpy_bnsh, "nvfp4", "mxfp4")])
def test_correct_kernels_pass_every_family(kern, k, v):
    r = run(kern, k, v)
    assert r.ok, [c.line(r.kernel) for c in r.with_status("FAIL")]
    assert {c.family for c in r.cases} == set(QUICK_FAMILIES)
    # skipped: storages that cannot exist at D = 96 (FBGEMM: 3 groups, g64), the strided views (the kernels
    # declare contiguous arrays), spaced pages outside a paged layout, Inf / NaN in a quantized cache
    expected = {"strided"} | ({"head_dim"} if kern is numpy_fbgemm else set())
    expected |= set() if kern.layout in PAGED_LAYOUTS else {"spaced_pages"}
    expected |= set() if k in RAW_STORAGES and v in RAW_STORAGES else {"nonfinite"}
    assert r.families("SKIP") == expected and len(r.with_status("SKIP")) == len(expected)
    for c in r.with_status("SKIP"):
        assert c.family != "head_dim" or "head_dim 96" in c.detail, c.detail
    assert all("page_size=" in c.shape for c in r.cases) == (kern.layout == "paged")


def test_full_cases_and_reading_padding_that_is_masked_away_passes():
    r = run(numpy_bnsh, "int8-head", "int8-head", cases="full", reruns=5)
    assert r.ok and {c.family for c in r.cases} == set(gate.FAMILIES)
    # skipped: strides undeclared, spaced pages (bnsh), Inf / NaN (int8), the 2^31-element cache (no GPU)
    assert r.families("SKIP") == {"strided", "spaced_pages", "nonfinite", "huge_cache"}
    assert [c.status for c in r.cases].count("OK") == len(r.cases) - 4

    def masked(case):  # reads every stored key, then masks the padding away exactly
        from kvq.gate_examples import cache_bnsh
        k, v = cache_bnsh(case, case.k), cache_bnsh(case, case.v)
        T = k.shape[2]
        valid = np.arange(T)[None, :] < case.seq_lens[:, None]  # [B, T]
        k = np.where(valid[:, None, :, None], k, 0)
        v = np.where(valid[:, None, :, None], v, 0)
        o, lse = np.zeros(case.q.shape, np.float32), np.full(case.q.shape[:2], -np.inf, np.float32)
        for b in range(case.batch):
            for h in range(case.num_q_heads):
                s = np.where(valid[b], (k[b, h // case.group] @ case.q[b, h]) * np.float32(case.softmax_scale),
                             -np.inf)
                if case.alibi_slopes is not None:
                    s = s - case.alibi_slopes[h] * (case.seq_lens[b] - 1 - np.arange(T)).astype(np.float32)
                if valid[b].any():
                    p = np.exp(s - s.max())
                    o[b, h], lse[b, h] = p @ v[b, h // case.group] / p.sum(), s.max() + np.log(p.sum())
        return kvq.round_to_format(o, "bf16"), lse
    r = run(gate.Kernel(masked, layout="paged"), "int4-g32-asym", "int8-head")
    assert r.ok, [c.line(r.kernel) for c in r.with_status("FAIL")]


# ---- wrong kernels are caught ----

@pytest.mark.parametrize("name", sorted(wrong.WRONG))
def test_wrong_kernel_is_caught(name):
    kern, must_fail = wrong.WRONG[name]
    failed = run(kern).families("FAIL")
    assert must_fail <= failed, (name, sorted(failed))
    if name in ("fixed_softmax_scale", "ignores_alibi", "noisy"):  # and nothing else catches these
        assert failed == must_fail, (name, sorted(failed))


def test_reading_padding_is_named_in_every_layout_and_storage():
    for layout, k in (("bnsh", "bf16"), ("bsnh", "int8-tensor"), ("paged", "int4-g32-asym"),
                      ("fbgemm", "int4-head-asym")):
        r = run(gate.Kernel(wrong.reads_padding, layout=layout), k, k, cases=["varlen", "no_keys"])
        assert r.families("FAIL") == {"varlen", "no_keys"}, (layout, k)
        varlen = r.cases[0]
        assert varlen.detail.startswith("reads padding: O changes when the padding (positions >= seq_len"), \
            varlen.detail
    # a per-tensor scale cannot be poisoned: the garbage codes alone give a wrong, finite O
    r = run(gate.Kernel(wrong.reads_padding), "int8-tensor", "int8-tensor", cases=["varlen"])
    assert "reads padding" in r.cases[0].detail and "NaN there" not in r.cases[0].detail


def test_wrong_int4_decoding_is_caught_in_every_layout():
    for layout, k, v in (("bnsh", "int4-g32-asym", "int4-g32-asym"), ("bsnh", "int4-head", "int4-g32"),
                         ("paged", "int4-head-asym", "int4-token-asym"), ("fbgemm", "int4-g32-asym", "int4-head-asym")):
        for fn in (wrong.nibbles_swapped, wrong.scale_zero_swapped):
            if fn is wrong.scale_zero_swapped and "asym" not in k:
                continue
            r = run(gate.Kernel(fn, layout=layout), k, v, cases=["varlen", "one_key"])
            assert r.families("FAIL") == {"varlen", "one_key"}, (fn.__name__, layout)


def test_ignoring_the_page_table_is_caught():
    r = run(gate.Kernel(wrong.ignores_page_table, layout="paged"), "int8-head", "int8-head", cases=["varlen", "reruns"])
    assert r.families("FAIL") == {"varlen", "reruns"}


def test_bf16_accumulation_fails_its_declared_profile():
    r = run(gate.Kernel(wrong.bf16_pv), cases=["varlen", "long"])
    assert r.families("FAIL") == {"varlen", "long"}
    assert all(c.tolerance.max_err > c.tolerance.max_bound for c in r.cases)


def test_non_determinism_is_reported_not_failed_when_declared():
    r = run(gate.Kernel(wrong.noisy, deterministic=False), cases=["varlen", "reruns"], reruns=3)
    assert r.ok
    assert re.search(r"2 of 2 reruns differ from the first .*declared non-deterministic: reported, not failed",
                     r.cases[-1].detail), r.cases[-1].detail
    r = run(wrong.WRONG["noisy"][0], cases=["reruns"], reruns=3)
    assert not r.ok and "2 of 2 reruns differ" in r.cases[0].detail


def test_kernel_errors_and_wrong_shapes_fail_the_case_and_the_gate_goes_on():
    def raises(case):
        raise RuntimeError("CUDA error: out of memory")
    r = run(raises, cases=["mha", "batch0"])
    assert [c.status for c in r.cases] == ["FAIL", "FAIL"]
    assert r.cases[0].detail == "error: RuntimeError: CUDA error: out of memory"
    r = run(lambda case: (numpy_decode(case)[0][:, :, None], numpy_decode(case)[1]), cases=["mha"])
    assert r.cases[0].detail == "error: O has shape [2, 4, 1, 128], expected [B, Hq, D] = [2, 4, 128]"
    r = run(gate.Kernel(numpy_decode, returns_lse=False), cases=["mha"])
    assert "expected O alone (the kernel declares returns_lse=False)" in r.cases[0].detail

    def writes_input(case):
        case.q[0, 0, 0] = 0
    r = run(writes_input, cases=["mha"])
    assert "read-only" in r.cases[0].detail


def test_outputs_that_are_not_arrays_fail_the_case_and_the_gate_goes_on():
    class Unreadable:  # as a torch bf16 tensor handed back on device 'cpu': numpy cannot take it
        def __array__(self, *args, **kwargs):
            raise TypeError("Got unsupported ScalarType BFloat16")

    r = run(lambda case: ([[1.0, 2.0], [3.0]], numpy_decode(case)[1]), cases=["mha", "one_key"])
    assert [c.status for c in r.cases] == ["FAIL", "FAIL"]
    assert r.cases[0].detail.startswith("error: O is not readable as an array on device 'cpu' (ValueError: ")
    r = run(lambda case: (numpy_decode(case)[0], Unreadable()), cases=["mha", "one_key"])
    assert [c.detail for c in r.cases] == ["error: LSE is not readable as an array on device 'cpu' "
                                           "(TypeError: Got unsupported ScalarType BFloat16)"] * 2


def test_o_alone_is_judged_without_lse():
    r = run(gate.Kernel(lambda case: numpy_decode(case)[0], returns_lse=False))
    assert r.ok and all("LSE not returned (declared)" in c.detail for c in r.cases if not c.skipped)


# ---- declarations: SKIP with the kernel's reason ----

def test_declared_limits_are_skipped_with_the_reason():
    kern = gate.Kernel(numpy_decode, name="limited", head_dims={64, 128}, max_tokens=1024, alibi=False)
    r = run(kern, cases=["head_dim", "alibi", "long", "mha"])
    got = {c.label: (c.status, c.detail) for c in r.cases}
    assert r.ok
    assert got["head_dim B=2 Hq=4 Hkv=2 T=300 D=96 lens 300,293"] == (
        "SKIP", "skipped: head_dim 96 (the kernel declares head_dims [64, 128])")
    assert got["head_dim B=2 Hq=4 Hkv=2 T=300 D=64 lens 300,293"][0] == "OK"
    assert got["group of 6, ALiBi B=2 Hq=12 Hkv=2 T=300 D=128 lens 299,5 alibi"] == (
        "SKIP", "skipped: ALiBi (the kernel declares alibi=False)")
    assert got["long B=2 Hq=8 Hkv=2 T=2048 D=128 lens 2048,1500"] == (
        "SKIP", "skipped: T = 2048 (the kernel declares max_tokens 1024)")
    r = run(gate.Kernel(numpy_decode, storages={"bf16", "int4-g32-asym"}), "bf16", "int8-head")
    assert r.ok and len(r.with_status("SKIP")) == len(r.cases)
    assert r.cases[0].detail == "skipped: V storage int8-head (the kernel declares storages bf16, int4-g32-asym)"
    r = run(numpy_bnsh, "int4-g64", "int4-g64", cases=["head_dim"])
    assert [c.status for c in r.cases] == ["OK", "SKIP", "OK"]
    assert r.cases[1].detail == ("skipped: storage int4-g64 at head_dim 96: int4-g64: group size 64 does not divide "
                                 "head_dim 96")


def test_why_not_and_a_profile_per_storage_pair_are_declarations():
    def why_not(spec, k, v):
        return "no GQA groups of 16" if spec.q_heads // spec.kv_heads == 16 else ""

    def profile(k, v):
        return "fp32-obf16" if k == v else "fp32-pbf16-obf16"
    kern = gate.Kernel(numpy_decode, name="declared", why_not=why_not, profile=profile)
    r = run(kern, "bf16", "bf16", cases=["group16", "mha"])
    got = {c.family: (c.status, c.detail) for c in r.cases}
    assert got["group16"] == ("SKIP", "skipped: no GQA groups of 16") and got["mha"][0] == "OK"
    assert r.to_json()["gate"]["declarations"]["profile"] == "fp32-obf16"
    assert run(kern, "bf16", "fp16", cases=["mha"]).to_json()["gate"]["declarations"]["profile"] == "fp32-pbf16-obf16"
    with pytest.raises(ValueError, match="precision profile 'nope'"):
        run(gate.Kernel(numpy_decode, profile=lambda k, v: "nope"), cases=["mha"])
    with pytest.raises(TypeError, match="why_not must be callable"):
        gate.Kernel(numpy_decode, why_not="no")


def test_kvq_validate_python_runs_the_gate(tmp_path):
    kvq_bin = os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))
    if not os.path.exists(kvq_bin):
        pytest.skip(f"no kvq binary at {kvq_bin}")
    report = tmp_path / "v.json"
    r = subprocess.run([kvq_bin, "validate", "--python", "kvq.gate_examples:numpy_paged", "--k", "int8-head", "--v",
                        "bf16", "--quick", "--report", str(report)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[OK]   numpy-paged varlen GQA K int8-head / V bf16 paged" in r.stdout
    assert json.loads(report.read_text())["variants"][0]["failed"] == 0
    r = subprocess.run([kvq_bin, "validate", "--python", os.path.join(HERE, "gate_kernels.py") + ":off_by_one",
                        "--layout", "bsnh", "--quick", "--report", str(report)], capture_output=True, text=True)
    assert r.returncode == 1 and "[FAIL] off_by_one" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([kvq_bin, "validate", "--python", "kvq.gate_examples:nothing", "--quick"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "has no attribute 'nothing'" in r.stderr, r.stdout + r.stderr


def test_arguments_the_gate_cannot_run_are_errors():
    with pytest.raises(ValueError, match="layout 'bsnh' given, but kernel numpy-bnsh declares 'bnsh'"):
        gate.check(numpy_bnsh, layout="bsnh", log=None)
    with pytest.raises(ValueError, match="FBGEMM's inline rows hold int4 asymmetric"):
        gate.check(numpy_fbgemm, "int8-head", "int8-head", log=None)
    with pytest.raises(ValueError, match="32 does not divide page_size 16"):
        gate.check(numpy_paged, "int4-chan-t32-asym", "bf16", log=None)
    with pytest.raises(ValueError, match=r"does not gate \+had storages"):
        gate.check(numpy_bnsh, "int4-g32-asym+had", "bf16", log=None)
    with pytest.raises(ValueError, match="window's raw tokens lie beside the codes in the bnsh, bsnh and paged"):
        gate.check(numpy_fbgemm, "int4-g32-asym+w8", "bf16", log=None)
    with pytest.raises(kvq.SchemeError):
        gate.check(numpy_bnsh, "int4-g3x", "bf16", log=None)
    with pytest.raises(ValueError, match="storage 'q4_1': FBGEMM's inline rows hold kvq's int4 schemes, not"):
        gate.check(numpy_fbgemm, "q4_1", "bf16", log=None)
    with pytest.raises(ValueError, match="expected 'quick', 'full' or family names"):
        gate.check(numpy_bnsh, cases=["varlen", "nope"], log=None)
    with pytest.raises(ValueError, match="precision profile 'fp32-pbf8'"):
        gate.Kernel(numpy_decode, profile="fp32-pbf8")
    with pytest.raises(ValueError, match="device 'tpu': kvq.gate runs on cpu, cuda, torch-cpu"):
        gate.check(numpy_bnsh, device="tpu", log=None)
    if gate_devices.CudaDevice.why_unavailable():  # no torch or no GPU here: the reason, before any case runs
        with pytest.raises(ValueError, match="device 'cuda'"):
            gate.check(numpy_bnsh, device="cuda", log=None)


# ---- what the kernel is given ----

def captured(layout, k, v, family, **declarations):
    seen = []
    gate.check(gate.Kernel(lambda case: seen.append(case) or numpy_decode(case), layout=layout, **declarations), k, v,
               cases=[family], log=None)
    return seen[0]  # the first call: NaN / garbage in the padding


def test_padding_is_poisoned_where_the_docs_say():
    c = captured("bnsh", "bf16", "int8-head", "varlen")  # lengths 300, 0, 177
    assert c.q.shape == (3, 8, 128) and c.seq_lens.tolist() == [300, 0, 177] and c.block_table is None
    assert np.array_equal(kvq.round_to_format(c.q, "bf16"), c.q)
    assert np.isnan(c.k.values[1]).all() and np.isnan(c.k.values[2, :, 177:]).all()
    assert np.isfinite(c.k.values[2, :, :177]).all() and np.isfinite(c.k.values[0]).all()
    assert np.isnan(c.v.scales[2, :, 177:]).all() and np.isfinite(c.v.scales[2, :, :177]).all()
    assert c.v.codes.dtype == np.int8 and c.v.scales.dtype == np.float16 and not c.v.codes.flags.writeable

    c = captured("paged", "int8-token", "int4-g32-asym", "odd_t")  # T 37, lengths 37, 20, 1, pages of 16
    table, pages = c.block_table, c.k.codes.shape[0]
    assert c.page_size == 16 and table.shape == (3, 3) and pages == 3 + 2 + 1 + 2
    own = [table[0, :3], table[1, :2], table[2, :1]]
    used = np.concatenate(own)
    assert len(set(used.tolist())) == 6 and used.tolist() != list(range(6))  # shuffled
    unused = sorted(set(range(pages)) - set(used.tolist()))
    assert len(unused) == 2 and set(table[1, 2:].tolist() + table[2, 1:].tolist()) <= set(unused)
    assert np.isnan(c.k.scales[unused]).all() and np.isnan(c.v.zero_points[unused]).all()
    assert np.isnan(c.k.scales[table[0, 2], 37 - 32:]).all()  # the last page's tail past T
    assert np.isnan(c.v.scales[table[1, 1], 4:]).all() and np.isfinite(c.v.scales[table[1, 1], :4]).all()
    assert np.isfinite(c.k.scales[table[2, 0], :1]).all() and np.isnan(c.k.scales[table[2, 0], 1:]).all()
    # the pages hold the sequences' tokens in table order: gathering them gives the planar cache back
    from kvq.gate_examples import cache_bnsh
    k = cache_bnsh(c, c.k)
    assert k.shape == (3, 2, 48, 128) and np.isfinite(k[1, :, :20]).all() and np.isnan(k[1, :, 20:]).all()


def test_block_formats_arrive_as_stored_with_their_padding_poisoned():
    c = captured("paged", "mxfp4", "nvfp4", "odd_t")  # T 37, lengths 37, 20, 1, pages of 16
    table, pages = c.block_table, c.k.codes.shape[0]
    unused = sorted(set(range(pages)) - set(table[0, :3].tolist() + table[1, :2].tolist() + table[2, :1].tolist()))
    assert c.k.scales.dtype == np.uint8 and c.k.scales.shape == (pages, 16, 2, 4)  # e8m0, one per 32
    assert c.v.scales.shape == (pages, 16, 2, 8) and c.k.codes.shape == (pages, 16, 2, 64)  # e4m3, one per 16
    assert (c.k.scales[unused] == 0xFF).all() and (c.v.scales[table[1, 1], 4:] == 0xFF).all()  # NaN in both
    assert (c.v.scales[table[1, 1], :4] != 0xFF).all()
    assert c.k.tensor_scale is None and c.v.tensor_scale.dtype == np.float32 and c.v.tensor_scale.shape == ()
    ref = kvq.quantize(np.zeros((1, 1, 1, 128), np.float32) + 1, "nvfp4")
    assert ref.tensor_scale is not None and np.isfinite(c.v.tensor_scale)
    c = captured("bnsh", "q5_1", "q8_0", "varlen")  # lengths 300, 0, 177
    assert c.k.codes.shape == (3, 2, 300, 80) and c.k.codes.dtype == np.uint8  # D/2 nibbles, then D/8 fifth bits
    assert c.k.zero_points.dtype == np.float16 and np.isnan(c.k.zero_points[2, :, 177:]).all()
    assert c.v.codes.dtype == np.int8 and np.isfinite(c.v.scales[0]).all()


@pytest.mark.parametrize("k,v", [("q4_0", "q8_0"), ("q5_1", "iq4_nl"), ("nvfp4", "mxfp4"), ("bf16", "q5_0")])
def test_ggml_blocks_as_llama_cpp_keeps_them(k, v):
    r = run(numpy_ggml, k, v)
    assert r.ok, [c.line(r.kernel) for c in r.with_status("FAIL")]
    skipped = [c for c in r.with_status("SKIP") if c.family not in NOT_FOR_THE_EXAMPLES]
    # ggml's block_nvfp4 holds 64 elements: not at D = 96
    assert [c.detail for c in skipped] == (["skipped: storage nvfp4 at head_dim 96: ggml's block_nvfp4 holds 64 "
                                            "elements"] if k == "nvfp4" else [])
    c = captured("ggml", "q4_1", "bf16", "odd_t")  # T 37, lengths 37, 20, 1
    assert c.k.blocks.shape == (3, 37, 2, 4 * 20) and c.k.blocks.dtype == np.uint8 and c.k.codes is None
    assert c.v.values.shape == (3, 37, 2, 128)  # raw operands in the cache's [B, T, H, D]
    params = c.k.blocks.reshape(3, 37, 2, 4, 20)[..., :4].copy().view(np.float16)  # d, m of each block
    assert np.isnan(params[1, 20:]).all() and np.isfinite(params[1, :20]).all() and np.isfinite(params[0]).all()
    r = run(gate.Kernel(wrong.ggml_blocks_reversed, layout="ggml"), "q8_0", "q4_0", cases=["varlen"])
    assert not r.ok
    with pytest.raises(ValueError, match="storage 'int8-head': the ggml layout holds llama.cpp's cache types"):
        gate.check(numpy_ggml, "int8-head", "bf16", log=None)


def test_wrong_block_decoding_is_caught():
    for kern, k, v in ((wrong.fifth_bits_ignored, "q5_0", "q5_1"), (wrong.e2m1_not_doubled, "mxfp4", "nvfp4")):
        r = run(gate.Kernel(kern), k, v, cases=["varlen", "mha"])
        assert not r.ok and {c.status for c in r.cases} == {"FAIL"}, [c.line(r.kernel) for c in r.cases]


def test_fbgemm_rows_are_the_planar_codes_and_parameters():
    c = captured("fbgemm", "int4-g32-asym", "bf16", "odd_t")
    assert c.k.rows.shape == (3, 37, 2, 64 + 4 * 4) and c.k.rows.dtype == np.uint8
    assert c.v.values.shape == (3, 37, 2, 128)  # raw operands in FBGEMM's BSNH
    params = c.k.rows[0, :, :, :16].copy().view(np.float16).reshape(37, 2, 4, 2)
    assert np.isfinite(params).all() and np.isnan(c.k.rows[1, 20:, :, :16].copy().view(np.float16)).all()


def test_alibi_and_softmax_scale_reach_the_kernel():
    c = captured("bsnh", "bf16", "bf16", "alibi")
    assert c.alibi_slopes.dtype == np.float32 and np.array_equal(c.alibi_slopes, np.float32(kvq.alibi_slopes(12)))
    assert c.softmax_scale == 1 / np.sqrt(128) and c.k.values.shape == (2, 300, 2, 128)
    c = captured("bnsh", "bf16", "bf16", "mqa")
    assert c.softmax_scale == 0.25 and c.alibi_slopes is None and c.group == 8


# ---- the verdict, as check_tolerance computes it ----

def test_tolerance_mirrors_check_tolerance():
    ref = np.array([[[1.0, -2.0]], [[0.0, 0.0]]])  # [B=2, Hq=1, D=2]; row 1 has no keys
    ref_lse = np.array([[0.5], [-np.inf]])
    mimic = ref + np.array([[[0.01, 0.0]], [[0.0, 0.0]]])
    floor = 2 * float(gate.bf16_noise(ref).max())
    assert floor == 2 * 2.0 ** -8  # bf16(bf16(1.3) - 0.3) = 1 - 2^-8
    bound = gate.tolerance(ref, ref_lse, ref, ref_lse, mimic, ref_lse).max_bound
    assert bound == pytest.approx(2 * 0.01 + floor, rel=1e-12)
    for factor, ok in ((1 - 1e-6, True), (1 + 1e-6, False)):
        out = ref.copy()
        out[0, 0, 0] += bound * factor
        t = gate.tolerance(out, ref_lse, ref, ref_lse, mimic, ref_lse)
        assert t.ok == ok and t.worst == ((0, 0, 0), out[0, 0, 0], 1.0)
    # empty rows: O = 0 and LSE = -inf exactly (-0.0 is 0)
    assert gate.tolerance(np.where(ref == 0, -0.0, ref), ref_lse, ref, ref_lse, ref, ref_lse).ok
    t = gate.tolerance(ref, np.array([[0.5], [0.0]]), ref, ref_lse, ref, ref_lse)
    assert not t.ok and t.problem == "row [1, 0] has no keys but O != 0 or LSE = 0.0"
    nan = ref.copy()
    nan[0, 0, 1] = np.nan
    t = gate.tolerance(nan, ref_lse, ref, ref_lse, ref, ref_lse)
    assert not t.ok and t.problem == "O[0, 0, 1] = nan (ref -2)"
    lse = ref_lse + np.array([[8 * 2.0 ** -23], [0]])  # 8 fp32 ulps at max(|LSE|, 1) = 1
    assert gate.tolerance(ref, lse, ref, ref_lse, ref, ref_lse).ok
    assert not gate.tolerance(ref, lse * (1 + 1e-9), ref, ref_lse, ref, ref_lse).ok


# ---- the report and the command line ----

def test_json_report_has_kvq_validates_fields(tmp_path):
    path = tmp_path / "sub" / "gate.json"
    gate.check(gate.Kernel(wrong.reads_padding, name="reads-padding"), cases=["varlen", "mha"], report=str(path),
               log=None)
    doc = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON report"))
    assert set(doc) == {"gpu", "dump", "gate", "variants", "cases"}
    assert doc["variants"] == [{"variant": "reads-padding", "cases": 2, "failed": 1, "skipped": 0, "refused": 0,
                                "values_checked": 3 * 8 * 128 + 2 * 4 * 128}]
    assert doc["gate"]["declarations"]["layout"] == "bnsh" and doc["gate"]["k"] == "bf16"
    varlen, mha = doc["cases"]
    for case in doc["cases"]:
        assert {"variant", "case", "scheme", "dtype", "layout", "shape", "values", "ok", "skipped", "detail",
                "family", "status", "error", "bound", "worst"} <= set(case)
    assert (varlen["case"], varlen["scheme"], varlen["dtype"], varlen["layout"]) == ("varlen GQA", "bf16 BNSH", "bf16",
                                                                                     "BNSH")
    assert varlen["ok"] is False and varlen["status"] == "FAIL" and varlen["worst"]["value"] is None
    assert varlen["worst"]["index"] == [1, 0, 0] and varlen["detail"].startswith("reads padding")
    assert mha["ok"] is True and mha["bound"]["max"] >= mha["error"]["max"] > 0


def gate_cli(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(kvq.__file__)),
                                                                  os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "kvq.gate", *args], capture_output=True, text=True, env=env, cwd=cwd)


def test_command_line_exit_codes(tmp_path):
    r = gate_cli("kvq.gate_examples:numpy_fbgemm", "--k", "int4-g32-asym", "--v", "bf16", "--cases", "varlen,one_key",
                 "--report", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[0].startswith("[OK]   numpy-fbgemm varlen GQA K int4-g32-asym / V bf16 FBGEMM B=3")
    assert json.loads((tmp_path / "r.json").read_text())["variants"][0]["failed"] == 0
    # a file path and a plain function: --layout and --profile apply
    r = gate_cli(os.path.join(HERE, "gate_kernels.py") + ":off_by_one", "--cases", "one_key", "--layout", "bsnh")
    assert r.returncode == 1 and r.stdout.startswith("[FAIL] off_by_one one key bf16 BSNH"), r.stdout + r.stderr
    for args, message in [
            (["no_such_module_kvq:fn"], "cannot import 'no_such_module_kvq': ModuleNotFoundError"),
            ([os.path.join(HERE, "gate_kernels.py") + ":missing"], "has no attribute 'missing'"),
            (["kvq.gate_examples"], "expected module:function or path/to/file.py:function"),
            (["nowhere/kernel.py:fn"], "'nowhere/kernel.py': no such file"),
            (["kvq.gate_examples:np"], "is a module, not a callable or kvq.gate.Kernel"),
            (["kvq.gate_examples:numpy_bnsh", "--k", "int4-g3x"], "int4-g3x"),
            (["kvq.gate_examples:numpy_bnsh", "--layout", "paged"], "layout 'paged' given, but kernel numpy-bnsh"),
            (["kvq.gate_examples:numpy_bnsh", "--cases", "varlen,nope"], "family names"),
            (["kvq.gate_examples:numpy_bnsh", "--layout", "nope"], "invalid choice: 'nope'")]:
        r = gate_cli(*args)
        assert r.returncode == 2 and r.stdout == "", (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, (args, r.stderr)


def test_docs_examples_run_as_written(tmp_path):
    with open(os.path.join(ROOT, "docs", "gate.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) == 2
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for block in blocks:
            exec(compile(block, "docs/gate.md", "exec"), {"print": lambda *a: None})
    finally:
        os.chdir(cwd)
    assert json.loads((tmp_path / "gate.json").read_text())["variants"][0]["variant"] == "numpy-paged"


def test_kvq_exports_gate_lazily():
    r = subprocess.run([sys.executable, "-c", "import sys, kvq; assert 'kvq.gate' not in sys.modules; "
                        "print(kvq.gate.check.__module__, kvq.gate_examples.numpy_paged.layout)"],
                       capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0 and r.stdout.split() == ["kvq.gate", "paged"], r.stderr


# ---- the mutation score, refusals, the large-logit and split families ----

def test_mutation_score_catches_every_bug_class():
    """kvq.gate_mutants: every mutant FAILs a case of its families and its right kernel passes them."""
    from kvq.gate_mutants import CATALOGUE, mutation_score
    lines = []
    report = mutation_score(log=lines.append)
    assert report.all_caught, [line for line in lines if line.startswith("[FAIL]")]
    assert lines[-1] == f"{len(CATALOGUE)} of {len(CATALOGUE)} bug classes caught"
    # the classes the new families exist for: caught by them, and by nothing that ran before them (ALiBi's
    # biases of -200 over 300 keys catch a merge by the first split too, in kernels that take ALiBi)
    new = ("large_logits", "split_stress", "shared_pages", "spaced_pages", "strided", "nonfinite", "long", "huge_cache",
           "reruns")
    old = [f for f in gate.FAMILIES if f not in new]
    for name in ("no_running_max", "batch_max", "merge_by_first_split", "shared_pages_owned", "page_ids_16bit",
                 "ignores_strides", "packed_keys"):
        c = next(c for c in CATALOGUE if c.name == name)
        r = run(c.mutant, c.k, c.v, cases=old)
        assert r.families("FAIL") == ({"alibi"} if name == "merge_by_first_split" else set()), name


def test_the_torch_catalogue_is_caught_on_torch_tensors():
    """The same bug classes in torch (kvq.gate_mutants_torch) on torch CPU tensors; on a GPU the device run
    checks device "cuda", with int32_offsets too."""
    pytest.importorskip("torch")
    from kvq.gate_mutants import CATALOGUE, mutation_score, torch_catalogue
    report = mutation_score("torch-cpu", log=None)
    assert report.all_caught, [r.failed or r.right_failed for r in report.results if not r.ok]
    assert len(report.results) == len(CATALOGUE) == len(torch_catalogue()) - 1


def test_mutants_command_line():
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "kvq.gate_mutants", *args], capture_output=True, text=True)
    r = cli("no_running_max", "reads_padding")
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "2 of 2 bug classes caught", r.stdout + r.stderr
    r = cli("no_such_bug")
    assert r.returncode == 2 and "no_such_bug" in r.stderr
    assert "merge_by_first_split" in cli("--list").stdout


def test_large_logits_leave_exp_range_in_the_sequences_that_ask_for_it():
    from kvq.gate_cases import case_specs
    spec = next(s for s in case_specs(["large_logits"]) if s.name == "large logits")
    inputs = gate._Inputs(spec, "bf16", "bf16", "bnsh", 16, 0, gate_devices.CpuDevice)
    k, lens = inputs.ops["k"].reference, inputs.lens
    top = {}
    for b, mode in enumerate(spec.logits):
        s = np.einsum("hd,htd->ht", inputs.q[b].astype(np.float64),
                      np.repeat(k[b], spec.q_heads // spec.kv_heads, axis=0)[:, :lens[b]]) * spec.scale()
        top[mode] = (s.max(), s.min())
    assert top["plain"][0] < 40 and top["plain"][1] > -40
    assert top["large"][0] > 88.7 and top["large"][1] < -88.7  # past float32's exp, both signs
    assert top["negative"][0] < -200  # every key far below zero: exp(s) alone is 0 / 0
    assert top["dominant@0.5"][0] > 250 and sorted(top)  # one key far above the rest


def test_a_refusal_is_reported_apart_from_a_failure():
    def picky(case):
        if case.num_kv_heads == 1:
            raise NotImplementedError("MQA is not supported by this kernel")
        if case.head_dim == 256:
            raise gate.Refused("head_dim 256")
        return numpy_decode(case)
    r = run(gate.Kernel(picky, name="picky"), cases=["mqa", "head_dim", "mha"])
    assert r.ok and not r.with_status("FAIL")
    refused = r.with_status("REFUSED")
    assert [c.family for c in refused] == ["head_dim", "mqa"]
    assert "MQA is not supported" in refused[1].detail and refused[1].line("picky").startswith("[REFUSED]")
    assert "0 failed, 2 refused by the kernel, 0 skipped" in r.summary()

    def broken(case):
        raise RuntimeError("illegal memory access")
    assert run(gate.Kernel(broken), cases=["mha"]).with_status("FAIL")


# ---- serving engines' own cache layouts ----

@pytest.mark.parametrize("layout", ["vllm", "flashinfer_nhd", "flashinfer_hnd"])
@pytest.mark.parametrize("storage", ["bf16", "fp8-e4m3-tensor", "fp8-e5m2"])
def test_engine_layouts_pass_the_right_kernel(layout, storage):
    r = run(gate.Kernel(numpy_decode, layout=layout), storage, storage)
    assert r.ok, [c.line(r.kernel) for c in r.with_status("FAIL")]
    assert r.families("SKIP") == {"strided"} | (set() if storage == "bf16" else {"nonfinite"})


def test_engine_layouts_hold_the_cache_as_the_engines_do():
    c = captured("vllm", "fp8-e4m3-tensor", "fp8-e4m3-tensor", "odd_t")  # T 37, lengths 37, 20, 1, blocks of 16
    pages = 3 + 2 + 1 + 2  # the sequences' pages and two spare ones
    assert c.kv_cache.shape == (pages, 2, 16, 2, 128) and c.kv_cache.dtype == np.uint8
    assert np.array_equal(c.k.codes, c.kv_cache[:, 0]) and np.array_equal(c.v.codes, c.kv_cache[:, 1])
    assert c.block_table.shape == (3, 3) and c.kv_indptr is None
    spec = next(s for s in gate.case_specs(["odd_t"]))
    stored = gate._Inputs(spec, "fp8-e4m3-tensor", "fp8-e4m3-tensor", "vllm", 16, 0,
                          gate_devices.CpuDevice).ops  # the same case
    assert c.k_scale == float(stored["k"].arrays["scales"][0].reshape(-1)[0]) and float(c.k.scales) == c.k_scale
    assert c.v_scale == float(stored["v"].arrays["scales"][0].reshape(-1)[0]) != c.k_scale

    c = captured("flashinfer_hnd", "bf16", "bf16", "odd_t")
    assert c.block_table is None and c.kv_cache.shape == (pages, 2, 2, 16, 128)  # [pages, 2, Hkv, page_size, D]
    indptr, indices, last = c.kv_indptr, c.kv_indices, c.kv_last_page_len
    assert indptr.tolist() == [0, 3, 5, 6] and last.tolist() == [37 - 32, 20 - 16, 1] and len(set(indices.tolist())) == 6
    unused = sorted(set(range(pages)) - set(indices.tolist()))
    assert np.isnan(c.kv_cache[unused]).all()  # spare pages poisoned
    tail = c.kv_cache[indices[indptr[1] - 1], :, :, last[0]:]  # sequence 0's last page past its length
    assert np.isnan(tail).all() and np.isfinite(c.kv_cache[indices[indptr[1] - 1], :, :, :last[0]]).all()


def test_engine_layouts_refuse_what_the_engines_do_not_hold():
    for k, v, message in (("int8-head", "int8-head", "holds bf16 / fp16 values or FP8 codes"),
                          ("bf16", "fp16", "one array of one dtype")):
        with pytest.raises(ValueError, match=message):
            run(gate.Kernel(numpy_decode, layout="flashinfer_nhd"), k, v)


def test_a_token_indexed_pool_is_pages_of_one_token():
    """SGLang's pool (req_to_token -> a slot per token) is the paged layout with page_size 1."""
    r = run(gate.Kernel(numpy_decode, layout="paged", page_size=1), "int8-head", "fp16")
    assert r.ok and all("page_size=1" in c.shape for c in r.cases)


# ---- spaced pages, strided views, Inf / NaN isolation, the cache past 2^31 elements ----

def test_spaced_pages_lie_far_apart_past_int16():
    c = captured("paged", "bf16", "bf16", "spaced_pages")
    used = np.concatenate([c.block_table[b, :-(-n // 16)] for b, n in enumerate(c.seq_lens.tolist())])
    assert used.max() > 32767 and len(set(used.tolist())) == len(used) and np.diff(np.sort(used)).min() > 1000
    pool = c.k.values.shape[0]
    assert pool > 32767 and np.isnan(c.k.values[np.setdiff1d(np.arange(pool), used)[:100]]).all()


def test_strided_views_reach_a_kernel_that_declares_strides():
    c = captured("bnsh", "int8-head", "bf16", "strided", strides=True)
    for a in (c.q, c.k.codes, c.k.scales, c.v.values):
        assert not a.flags.c_contiguous and a.strides[-2] == (a.shape[-1] + 8) * a.itemsize
        pad = np.lib.stride_tricks.as_strided(a, a.shape[:-1] + (a.shape[-1] + 8,), a.strides)[..., a.shape[-1]:]
        assert (np.isnan(pad) if a.dtype.kind == "f" else pad == 0x7E).all()  # the rows' padding poisoned
    assert c.seq_lens.flags.c_contiguous
    r = run(gate.Kernel(numpy_decode, strides=True), "int4-g32-asym", "fp16", cases=["strided"])
    assert r.ok and not r.with_status("SKIP")


def test_nonfinite_values_stay_in_their_sequence():
    c = captured("bsnh", "bf16", "bf16", "nonfinite")  # [B, T, H, D]; lengths 300, 291, 150, 40
    n = c.seq_lens.tolist()
    assert np.isposinf(c.v.values[1, n[1] // 2, 1, 5]) and np.isnan(c.k.values[2, n[2] // 2, 1, 5])
    assert np.isfinite(c.k.values[0]).all() and np.isfinite(c.v.values[3, :n[3]]).all()
    assert np.isfinite(c.v.values[1, :n[1]]).sum() == n[1] * 2 * 128 - 1  # one value broken
    r = run(numpy_bsnh, cases=["nonfinite"])  # the broken sequences' own rows are not judged
    assert r.ok and r.cases[0].values == 2 * 8 * 128

    def off(case):  # wrong in sequence 3 only: reported at its own index, not at its place among the judged rows
        o, lse = numpy_decode(case)
        o = o.copy()
        o[3, 0, 0] += 1.0
        return o, lse
    r = run(gate.Kernel(off), cases=["nonfinite"])
    assert r.with_status("FAIL") and r.cases[0].worst[0] == (3, 0, 0)
    from kvq.gate_mutants import packed_keys  # one sequence's Inf reaches the others
    r = run(gate.Kernel(packed_keys), cases=["nonfinite"])
    assert r.with_status("FAIL")


@pytest.fixture
def huge_on_the_cpu(monkeypatch):
    """The huge_cache family on numpy arrays, past 2^20 elements instead of 2^31."""
    monkeypatch.setattr(gate, "HUGE_OFFSET", 1 << 20)
    monkeypatch.setattr(gate_devices.CpuDevice, "free_bytes", staticmethod(lambda: 1 << 50))
    return 1 << 20


@pytest.mark.parametrize("kern,k,v", [
    (numpy_bnsh, "bf16", "int8-head"), (numpy_bsnh, "int4-chan-t32-asym", "int8-token"),
    (numpy_paged, "int8-head", "bf16"), (gate.Kernel(numpy_decode, layout="vllm"), "fp16", "fp16"),
    (gate.Kernel(numpy_decode, layout="flashinfer_hnd"), "fp8-e4m3", "fp8-e4m3"),
    (numpy_fbgemm, "int4-head-asym", "int4-g32-asym"), (numpy_ggml, "q4_0", "q8_0")])
def test_a_huge_cache_puts_the_last_sequence_past_the_offset(huge_on_the_cpu, kern, k, v):
    r = run(kern, k, v, cases=["huge_cache"])
    assert r.ok and r.cases[0].status == "OK", r.cases[0].detail
    c = captured(kern.layout, k, v, "huge_cache", page_size=kern.page_size)  # lengths 64, 0, 33, 64; Hkv 4
    op = c.k
    data = next(getattr(op, f) for f in ("values", "codes", "rows", "blocks") if getattr(op, f) is not None)
    if c.block_table is not None or c.kv_indices is not None:  # every page in use past the offset
        pages = c.block_table[[0, 2, 3], :-(-64 // 16)] if c.block_table is not None else c.kv_indices
        assert pages.min() * (data.size // data.shape[0]) >= huge_on_the_cpu
    else:  # the last sequence's first key (its last KV head in BNSH)
        first = (3, 3, 0) if kern.layout == "bnsh" else (3, 0, 3)
        assert np.ravel_multi_index(first + (0,), data.shape) >= huge_on_the_cpu and c.tokens > 64


def test_offsets_that_wrap_fail_the_huge_cache(huge_on_the_cpu):
    def wrapping(case):  # element offsets that wrap at the (shrunk) offset, as 32-bit ones wrap at 2^31
        def read(a):
            B, H, T, D = a.shape
            n = int(max(case.seq_lens))
            idx = ((np.arange(B)[:, None, None, None] * H + np.arange(H)[:, None, None]) * T + np.arange(n)[:, None]) * D
            idx = idx + np.arange(D)
            return a.reshape(-1)[((idx + huge_on_the_cpu) % (2 * huge_on_the_cpu) - huge_on_the_cpu) % a.size]
        from kvq.gate_examples import attend
        return attend(case.q, read(case.k.values), read(case.v.values), case.seq_lens, case.softmax_scale, None)
    assert run(gate.Kernel(wrapping), cases=["huge_cache"]).with_status("FAIL")
    assert run(numpy_bnsh, cases=["huge_cache"]).ok


def test_the_peers_table_keeps_refusals_apart(tmp_path):
    """experiments/gate/gate_table.py: a family with refusals shows them beside OK, never as a failure,
    and refused.md lists each refusal with its message."""
    sys.path.insert(0, os.path.join(ROOT, "experiments", "gate"))
    import gate_table
    def refusing(case):
        if case.num_kv_heads == 1:
            raise NotImplementedError("MQA is not supported")
        return numpy_decode(case)
    rows, failures, refusals = [], [], []
    args = type("Args", (), {"out": str(tmp_path), "cases": ["mha", "mqa", "group16"], "reruns": None})()
    real_check = gate_table.gate.check  # the table gates on device "cuda": the same cases on the CPU here
    gate_table.gate.check = lambda *a, **kw: real_check(*a, **{**kw, "device": "cpu"})
    try:
        gate_table.run_one(gate.Kernel(refusing, name="refusing"), "refusing", "bf16", "bf16", args, rows, failures,
                           refusals)
    finally:
        gate_table.gate.check = real_check
    gate_table.write_tables(rows, failures, refusals, str(tmp_path))
    table = (tmp_path / "table.md").read_text()
    assert "| refusing | bf16 / bf16 | OK | REFUSED 1 | REFUSED 1 |" in table, table
    assert not failures and [c.family for _, _, _, c in refusals] == ["mqa", "group16"]
    assert "MQA is not supported" in (tmp_path / "refused.md").read_text()
    assert gate_table.cell({"OK": "2", "FAIL": "1", "REFUSED": "1", "SKIP": "0"}) == "FAIL"
    assert gate_table.cell({"OK": "0", "FAIL": "0", "REFUSED": "0", "SKIP": "3"}) == "skip"



@pytest.mark.parametrize("argv,message", [
    (["--peers", "sdpa_flash,flashinfer"], "--peers flashinfer: not in gate_peers.PEERS (sdpa_cudnn, "),
    (["--cases", "varlen,nan"], "--cases varlen,nan: expected quick, full or families of varlen, head_dim, "),
    (["--reruns", "1"], "--reruns 1: expected >= 2"),
])
def test_the_peers_table_refuses_names_it_would_only_skip(tmp_path, capsys, argv, message):
    """A misspelt peer or family used to fill the table with SKIP rows and exit 0."""
    sys.path.insert(0, os.path.join(ROOT, "experiments", "gate"))
    import gate_table
    with pytest.raises(SystemExit) as e:
        gate_table.main(["--out", str(tmp_path / "gate"), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "gate").exists()  # refused before anything ran or was written


def test_the_peers_table_without_its_cpp_report_still_runs_and_fails(tmp_path, capsys):
    """A missing --cpp report (kvq validate did not write it) is warned of before the run, which still
    writes its tables, and the exit status is 1: the comparison asked for did not happen."""
    sys.path.insert(0, os.path.join(ROOT, "experiments", "gate"))
    import gate_table
    assert gate_table.main(["--out", str(tmp_path), "--peers", "", "--kvq", "", "--cpp", "missing/validate.json"]) == 1
    assert "--cpp missing/validate.json: no such file" in capsys.readouterr().err
    assert (tmp_path / "table.md").exists()

def test_the_peers_table_refuses_a_variant_the_build_lacks(tmp_path, capsys):
    import kvq.gpu
    if kvq.gpu._gpu is None:
        pytest.skip("a CPU-only build: no registry to ask (each run then says why it skips)")
    sys.path.insert(0, os.path.join(ROOT, "experiments", "gate"))
    import gate_table
    with pytest.raises(SystemExit):
        gate_table.main(["--out", str(tmp_path), "--peers", "", "--kvq", "decode-tc,decode-tc2"])
    assert "--kvq decode-tc2: not a decode variant of this build (decode-cudacore, " in capsys.readouterr().err

def test_a_kernel_that_reads_codes_in_the_window_fails():
    """+w<W>: the window's tokens are read raw; their codes and parameters are poisoned, so a kernel that
    dequantizes every token (the window ignored) attends to NaN there."""
    def no_window(case):
        drop = lambda op: dataclasses.replace(op, window=None)  # noqa: E731
        return numpy_decode(dataclasses.replace(case, k=drop(case.k), v=drop(case.v)))
    r = run(gate.Kernel(no_window, name="no-window", layout="bnsh"), "int8-head+w24", "int4-g32-asym")
    assert not r.ok and r.with_status("FAIL")
