"""What bench_peers.py decides without a GPU (experiments/bench/peer_rows.py): the CSV schema kvq bench
reads, byte counts, which shapes FBGEMM's kernel takes, split counts, rotating input sets."""
import os
import re
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "experiments", "bench"))
import peer_rows as pr  # noqa: E402

MACHINE = pr.Machine("Test GPU", "1.2.3", "13.0", "abc123", read_gbps=2000.0, copy_gbps=1500.0)
SEED000_B32 = pr.Shape("seed000", 32, 8, 1, 8192, 128)


def cpp_string(path, name):
    """The value of `NAME = "..."` (adjacent literals joined) in a C++ source of the repository."""
    text = open(os.path.join(ROOT, path)).read()
    m = re.search(name + r'\s*=\s*((?:\s*"[^"]*")+)\s*;', text)
    assert m, f"{path}: {name} not found"
    return "".join(re.findall(r'"([^"]*)"', m.group(1)))


def test_columns_are_kvq_benchs_schema():
    assert pr.COLUMNS == cpp_string("experiments/cli/cmd_bench.cpp", "kColumns").split(",")


def test_fbgemm_peers_name_storages_kvq_bench_times():
    storages = cpp_string("experiments/bench/bench_shapes.hpp", "kBenchStorages").split(",")
    for peer in pr.FBGEMM_PEERS:
        assert f"{peer.scheme(128)}:fbgemm" in storages
    for peer in pr.FLASHINFER_PEERS:  # the kvq storage holding FlashInfer's bytes is benched beside it
        assert peer.scheme in storages
    cmd_bench = open(os.path.join(ROOT, "experiments/cli/cmd_bench.cpp")).read()
    kernels = re.findall(r'\{"([a-z0-9-]+)", "(?::fbgemm)?", (?:true|false)\}', cmd_bench)
    everyone = set(pr.BF16_PEERS) | {p.name for p in pr.FBGEMM_PEERS} | {p.name for p in pr.FLASHINFER_PEERS}
    assert set(kernels) == everyone  # kvq bench shows every peer
    assert pr.FbgemmPeer("x", 4).scheme(128) == "int4-g32-asym"
    assert pr.FbgemmPeer("x", 2).scheme(64) == "int4-g32-asym"
    assert pr.FbgemmPeer("x", 1).scheme(256) == "int4-head-asym"


def test_row_bytes_count_inline_scale_and_shift():
    assert pr.fbgemm_row_bytes(128, 1) == 68
    assert pr.fbgemm_row_bytes(128, 4) == 80
    assert pr.fbgemm_row_bytes(64, 8) == 64
    for head_dim, groups in ((127, 1), (128, 0), (128, 3)):
        with pytest.raises(ValueError, match=f"D={head_dim}"):
            pr.fbgemm_row_bytes(head_dim, groups)


def test_bytes_are_kv_rows_plus_q_and_o():
    q_o = 2 * 2 * 32 * 8 * 128
    assert pr.fbgemm_bytes(SEED000_B32, 1) == 2 * 32 * 8192 * 68 + q_o == 35_782_656
    assert pr.fbgemm_bytes(SEED000_B32, 4) == 2 * 32 * 8192 * 80 + q_o
    assert pr.bf16_bytes(SEED000_B32) == 134_348_800  # the cuDNN row of the committed H100 run
    odd = pr.Shape("odd", 3, 6, 2, 77, 64)
    assert pr.bf16_bytes(odd) == 2 * 3 * 2 * 77 * 64 * 2 + 2 * 2 * 3 * 6 * 64
    assert pr.fbgemm_bytes(odd, 2) == 2 * 3 * 2 * 77 * (32 + 8) + 2 * 2 * 3 * 6 * 64


def test_fbgemm_takes_one_kv_head_d128_and_at_most_16k_keys():
    taken = [s for s in pr.SHAPES if pr.fbgemm_skip_reason(s) is None]
    assert {s.name for s in taken} == {"seed000"} and len(taken) == 5
    assert "Hkv=8" in pr.fbgemm_skip_reason(pr.Shape("llama8b", 1, 32, 8, 1024, 128))
    why = pr.fbgemm_skip_reason(pr.Shape("x", 2, 8, 1, 20000, 64))
    assert "D=64" in why and "T=20000" in why and "Hkv" not in why
    assert pr.fbgemm_skip_reason(pr.Shape("x", 2, 5, 1, 16384, 128)) is None


def test_split_counts():
    assert pr.fbgemm_splits(8192) == [2, 4, 8, 16, 32, 64, 128]
    assert pr.fbgemm_splits(40) == [2, 4, 8, 16, 32]
    assert pr.fbgemm_splits(1, [1, 2]) == [1]
    assert pr.fbgemm_splits(100, [16, 3, 16]) == [3, 16]
    with pytest.raises(ValueError, match="got 0"):
        pr.fbgemm_splits(100, [0, 2])


def test_input_sets_cover_four_times_l2():
    l2 = 50 << 20
    assert pr.input_sets(35_782_656, l2, 80 << 30) == 6  # 6 x 35.8 MB >= 200 MiB > 5 x
    assert pr.input_sets(4 * l2, l2, 80 << 30) == 1
    assert pr.input_sets(4 * l2 + 1, l2, 80 << 30) == 1
    assert pr.input_sets(l2, l2, 5 * l2) == 1  # 4 sets would not fit in 60% of the memory


def test_row_has_every_column_and_derived_numbers():
    us = [10.0, 11.0, 12.0, 13.0, 100.0]
    row = pr.make_row(SEED000_B32, "fbgemm-int4-g1", "int4-head-asym", us, splits=16, calls_per_graph=8, sets=6,
                      nbytes=24_000_000, machine=MACHINE, cudnn_us=24.0)
    assert list(row) == pr.COLUMNS
    assert row["median_us"] == "12.000" and row["p10_us"] == "10.400" and row["p90_us"] == "65.200"
    assert row["GBps"] == "2000.0" and row["pct_of_read"] == "100.00" and row["vs_cudnn"] == "0.500"
    assert (row["splits"], row["k_scheme"], row["v_scheme"], row["reps"]) == (16, "int4-head-asym", "int4-head-asym", 5)
    assert row["layout"] == "fbgemm-rows"
    bf16 = pr.make_row(SEED000_B32, "cudnn", "bf16", [4.0, 6.0], splits=None, calls_per_graph=8, sets=2, nbytes=10_000,
                       machine=MACHINE)
    assert bf16["splits"] == "" and bf16["vs_cudnn"] == "" and bf16["median_us"] == "5.000" and bf16["layout"] == ""
    with pytest.raises(ValueError, match="no timings"):
        pr.make_row(SEED000_B32, "cudnn", "bf16", [], splits=None, calls_per_graph=8, sets=1, nbytes=1, machine=MACHINE)


def test_flashinfer_pages_bytes_and_kernel_choice():
    assert pr.flashinfer_pages(8192) == (512, 16)
    assert pr.flashinfer_pages(17) == (2, 1)
    assert pr.flashinfer_pages(1) == (1, 1)
    with pytest.raises(ValueError, match="T=0"):
        pr.flashinfer_pages(0)
    q_o = 2 * 2 * 32 * 8 * 128
    assert pr.flashinfer_bytes(SEED000_B32, 1) == 2 * 32 * 8192 * 128 + q_o
    assert pr.flashinfer_bytes(SEED000_B32, 2) == pr.bf16_bytes(SEED000_B32)
    assert pr.flashinfer_tensor_cores(SEED000_B32)
    assert not pr.flashinfer_tensor_cores(pr.Shape("mha", 2, 4, 4, 64, 128))


def test_shape_labels_match_kvq_bench():
    """--shapes is one regex for kvq bench and bench_peers.py: the labels must be the same."""
    labels = [s.label for s in pr.SHAPES]
    assert "seed000/B128/T8192" in labels and "smollm2/B8/T1024" in labels and "llama8b/B1/T1024" in labels
    import re
    assert [s.label for s in pr.SHAPES if re.search(r"llama8b/B(1|8)/T1024$", s.label)] == \
        ["llama8b/B1/T1024", "llama8b/B8/T1024"]


PAIRS = (("int8-head", "int8-head"), ("fp8-e4m3", "fp8-e4m3"))


def test_paged_cases_pick_shapes_pairs_and_page_sizes_that_divide_t():
    cases, left_out = pr.paged_cases("smollm2|mha_b128", "int8", [16, 256], PAIRS)
    assert {(s.name, s.T, p, P) for s, p, P in cases if P == 256} == {("smollm2", 1024, PAIRS[0], 256),
                                                                      ("smollm2", 8192, PAIRS[0], 256),
                                                                      ("mha_b128", 1024, PAIRS[0], 256),
                                                                      ("mha_b128", 4096, PAIRS[0], 256)}
    assert len([c for c in cases if c[2] == 16]) == 9  # 6 SmolLM2 shapes and 3 MHA ones, one pair
    assert [(s.label, P) for s, P in left_out] == [("mha_b128/B128/T128", 256)]  # T = 128 < 256


@pytest.mark.parametrize("shapes,pairs,pages,message", [
    ("(", ".", [16], "--shapes '(': not a regular expression"),
    (".", "[", [16], "--pairs '[': not a regular expression"),
    ("llama70b", ".", [16], "--shapes 'llama70b' matches none of: seed000, seed002, llama8b, smollm2, mha_b128"),
    (".", "q4_0", [16], "--pairs 'q4_0' matches none of: int8-head/int8-head, fp8-e4m3/fp8-e4m3"),
    (".", ".", [16, 24, 8], "--pages 24 8: decode-tc reads pages of a power of two >= 16 tokens"),
    ("mha_b128", ".", [16384], "--pages 16384: no page size divides a chosen shape's T (128, 1024, 4096)"),
])
def test_paged_cases_name_the_option_that_leaves_nothing_to_time(shapes, pairs, pages, message):
    with pytest.raises(ValueError) as e:
        pr.paged_cases(shapes, pairs, pages, PAIRS)
    assert str(e.value).startswith(message), str(e.value)


def test_select_matches_labels_in_order_and_names_what_it_could_match():
    picked = pr.select("--shapes", "smollm2/B1/", pr.SHAPES, lambda s: s.label)
    assert [s.label for s in picked] == ["smollm2/B1/T1024", "smollm2/B1/T8192"]
    with pytest.raises(ValueError, match=r"--peers 'fbgemm-int8' matches none of: cudnn, flash2$"):
        pr.select("--peers", "fbgemm-int8", ["cudnn", "flash2", "cudnn"])
