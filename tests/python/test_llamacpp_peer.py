"""experiments/eval/llamacpp_peer.py's plumbing, with a stand-in for llama-cpp-python's Llama (the real
library is built by the script itself, outside CI): what it asks llama.cpp for (cache types, flash
attention, the rotation switch in the environment), how it scores the logits and matches kvq's rows."""
import os
import sys
import types

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments", "eval"))
import llamacpp_peer  # noqa: E402


def fake_llama_cpp(calls, vocab=50):
    """A llama_cpp module whose Llama returns fixed logits plus noise that grows with the cache's bits
    lost (and shrinks with the rotation), so the metrics' order is known."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((16, vocab)).astype(np.float32) * 3
    loss = {1: 0.0, 8: 0.01, 6: 0.1, 2: 0.4}  # f16, q8_0, q5_0, q4_0

    class Llama:
        def __init__(self, **kw):
            self.kw = kw
            self.rotated = os.environ.get("LLAMA_ATTN_ROT_DISABLE") != "1"
            calls.append((kw["type_k"], kw["type_v"], kw["flash_attn"], self.rotated))

        def eval(self, tokens):
            n = len(tokens)
            scale = loss[self.kw["type_k"]] + 0.5 * loss[self.kw["type_v"]]
            if self.rotated:
                scale /= 3
            noise = np.random.default_rng(self.kw["type_k"] * 10 + self.kw["type_v"]).standard_normal((n, vocab))
            self.scores = base[:n] + scale * noise + (0 if self.kw["flash_attn"] else 1e-3 * noise)

    return types.SimpleNamespace(Llama=Llama)


def test_rows_ask_llama_cpp_for_each_pair_rotated_and_not_and_match_kvq(monkeypatch):
    monkeypatch.delenv("LLAMA_ATTN_ROT_DISABLE", raising=False)
    calls = []
    runner = llamacpp_peer.LlamaCpp(fake_llama_cpp(calls), "m.gguf", 16, 1)
    tokens = list(range(16))
    predictions = {("q4_0+had", "fp16"): 0.01, ("q4_0", "fp16"): 0.2}
    rows, floor = llamacpp_peer.peer_rows(runner, tokens, [("q4_0", "f16"), ("q8_0", "q5_0")], 128, "gguf:m", predictions)
    # the reference (f16, flash on), the floor (f16, flash off), then each pair rotated and not
    assert calls[:2] == [(1, 1, True, True), (1, 1, False, True)]
    assert calls[2:] == [(2, 1, True, True), (2, 1, True, False), (8, 6, True, True), (8, 6, True, False)]
    assert "LLAMA_ATTN_ROT_DISABLE" not in os.environ  # restored
    assert [(r["ctk"], r["ctv"], r["rotation"], r["kvq_k_scheme"], r["kvq_v_scheme"]) for r in rows] == [
        ("q4_0", "f16", 1, "q4_0+had", "fp16"), ("q4_0", "f16", 0, "q4_0", "fp16"),
        ("q8_0", "q5_0", 1, "q8_0+had", "q5_0+had64"), ("q8_0", "q5_0", 0, "q8_0", "q5_0")]
    assert 0 < floor < min(r["kld_mean"] for r in rows)
    assert rows[0]["kld_mean"] < rows[1]["kld_mean"]  # the stand-in's rotation lowers the noise
    assert rows[0]["llamacpp_over_kvq"] == pytest.approx(rows[0]["kld_mean"] / 0.01)
    assert rows[0]["kvq_plus_floor"] == pytest.approx(0.01 + floor)
    assert rows[0]["llamacpp_over_kvq_plus_floor"] == pytest.approx(rows[0]["kld_mean"] / (0.01 + floor))
    assert rows[2]["kvq_kld_mean"] == "" and rows[2]["llamacpp_over_kvq"] == ""
    assert all(r["below_floor"] == 0 for r in rows)
    assert all(r["kvq_runtime_kld_mean"] == "" and r["llamacpp_over_kvq_runtime"] == "" for r in rows)


def test_kvq_runtime_column_runs_kvq_names_of_each_pair(monkeypatch):
    monkeypatch.delenv("LLAMA_ATTN_ROT_DISABLE", raising=False)
    asked = []

    class Runtime:
        def kld(self, k_name, v_name):
            asked.append((k_name, v_name))
            return 0.02

    runner = llamacpp_peer.LlamaCpp(fake_llama_cpp([]), "m.gguf", 16, 1)
    rows, _ = llamacpp_peer.peer_rows(runner, list(range(16)), [("q4_0", "q4_0")], 128, "gguf:m", {},
                                      kvq_runtime=Runtime())
    assert asked == [("q4_0+had", "q4_0+had64"), ("q4_0", "q4_0")]
    assert [r["kvq_runtime_kld_mean"] for r in rows] == [0.02, 0.02]
    assert rows[1]["llamacpp_over_kvq_runtime"] == pytest.approx(rows[1]["kld_mean"] / 0.02)


def test_pairs_and_arguments_are_checked(tmp_path, capsys):
    assert llamacpp_peer.parse_pairs("q4_0/f16,iq4_nl/q8_0") == [("q4_0", "f16"), ("iq4_nl", "q8_0")]
    with pytest.raises(ValueError, match="'q4_k/f16': expected K/V with llama.cpp's cache types"):
        llamacpp_peer.parse_pairs("q4_k/f16")
    with pytest.raises(ValueError, match="'q4_0': expected K/V"):
        llamacpp_peer.parse_pairs("q4_0")
    assert llamacpp_peer.main(["--lib", str(tmp_path)]) == 2
    assert "no llama_cpp package there" in capsys.readouterr().err


# ---- llamacpp_blocks.py: llama.cpp's stored cache blocks against kvq's codec -------------------------
import struct  # noqa: E402

import llamacpp_blocks  # noqa: E402


def seq_state(k_layers, v_layers, cells):
    """Bytes laid out as llama_state_seq_get_data writes them (one stream, V not transposed)."""
    out = struct.pack("<IiI", llamacpp_blocks.STATE_MAGIC, 0, 1) + struct.pack("<I", cells)
    out += b"".join(struct.pack("<iIi", pos, 1, 0) for pos in range(cells))
    out += struct.pack("<II", 0, len(k_layers))
    for layers in (k_layers, v_layers):
        for kind, data in layers:
            out += struct.pack("<iQ", kind, data.shape[1]) + data.tobytes()
    return out


class FakeCaches:
    """cache_state() as llama.cpp would answer it if its codec were kvq's: f32 rows of fixed K / V, or
    kvq's blocks of them for a type (`corrupt`: one byte of layer 0's K changed)."""

    def __init__(self, k, v, corrupt=False):
        self.k, self.v, self.corrupt, self.asked = k, v, corrupt, []

    def cache_state(self, tokens, ctk, ctv, rotation=True):
        from kvq import llamacpp
        self.asked.append((ctk, ctv, rotation))
        T = self.k.shape[0]
        if ctk == "f32":
            rows = [(0, np.frombuffer(x.astype(np.float32).tobytes(), np.uint8).reshape(T, -1)) for x in (self.k, self.v)]
        else:
            names = llamacpp.cache_schemes(ctk, ctv, self.k.shape[2], rotation)
            rows = [(2, llamacpp_blocks.kvq_blocks(x, n).copy()) for x, n in zip((self.k, self.v), names)]
            if self.corrupt:
                rows[0][1][3, 5] ^= 1
        return seq_state([rows[0]] * 2, [rows[1]] * 2, T)


def test_blocks_state_is_parsed_and_blocks_compared():
    rng = np.random.default_rng(1)
    k, v = (rng.standard_normal((6, 2, 64)).astype(np.float32) for _ in range(2))
    parsed_k, parsed_v = llamacpp_blocks.parse_seq_state(FakeCaches(k, v).cache_state(range(6), "f32", "f32"))
    assert len(parsed_k) == len(parsed_v) == 2 and parsed_k[0][1].shape == (6, 2 * 64 * 4)
    np.testing.assert_array_equal(np.frombuffer(parsed_v[1][1].tobytes(), np.float32).reshape(6, 2, 64), v)

    fake = FakeCaches(k, v)
    rows = llamacpp_blocks.check(fake, list(range(6)), 64, 2, types=("q4_0",))
    assert fake.asked == [("f32", "f32", True), ("q4_0", "q4_0", True), ("q4_0", "q4_0", False)]
    assert [(r["rotation"], r["side"], r["kvq_scheme"]) for r in rows] == [
        (1, "k", "q4_0+had"), (1, "v", "q4_0+had"), (0, "k", "q4_0"), (0, "v", "q4_0")]
    assert all(r["blocks"] == 6 * 2 * 2 and r["identical_blocks"] == r["blocks"] for r in rows)
    # one changed byte is one differing block; rotated and plain blocks are not the same bytes
    bad = llamacpp_blocks.check(FakeCaches(k, v, corrupt=True), list(range(6)), 64, 2, types=("q4_0",))
    assert [r["identical_blocks"] for r in bad if r["side"] == "k"] == [23, 23]
    assert not np.array_equal(llamacpp_blocks.kvq_blocks(k, "q4_0+had"), llamacpp_blocks.kvq_blocks(k, "q4_0"))


def test_blocks_state_errors():
    with pytest.raises(ValueError, match="magic 0x1234, expected 0xaf143cd8"):
        llamacpp_blocks.parse_seq_state(struct.pack("<IiI", 0x1234, 0, 1))
    transposed = struct.pack("<IiII", llamacpp_blocks.STATE_MAGIC, 0, 1, 1) + struct.pack("<iIi", 0, 1, 0) + \
        struct.pack("<II", 1, 1)
    with pytest.raises(ValueError, match="V transposed"):
        llamacpp_blocks.parse_seq_state(transposed)
    with pytest.raises(ValueError, match="no cells for sequence 0"):
        llamacpp_blocks.parse_seq_state(struct.pack("<IiII", llamacpp_blocks.STATE_MAGIC, 0, 1, 0))
