"""The main job's steps on a GGUF model, with test_gguf_llama's tiny synthetic GGUF Llama in place of
SmolLM2: the capture tool (data/capture.py: RoPE pair orders, decode queries, a dump kvq reads and
sweeps), kvq eval on a GGUF file, and the answer (experiments/eval/which_scheme.py)."""
import csv
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
h5py = pytest.importorskip("h5py")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE, os.path.join(ROOT, "data"), os.path.join(ROOT, "experiments", "eval")]
import capture  # noqa: E402
import test_gguf_llama as tiny_gguf  # noqa: E402
import which_scheme  # noqa: E402

TEXT = " ".join(["hello world dog cat 20"] * 12)


def kvq_cli(*args):
    binary = os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    text = folder / "text.txt"
    text.write_text(TEXT)
    return tiny_gguf.write_gguf(folder / "tiny.gguf", tiny_gguf.hf_weights(3)), text, folder / "cache"


def run_capture(model, out, *args):
    path, text, cache = model
    return capture.main(["--model", str(path), "--text", str(text), "--cache-dir", str(cache), "--out", str(out),
                         *args])


def test_capture_orders_and_queries(model, tmp_path):
    assert run_capture(model, tmp_path / "hf.h5", "--tokens", "40", "--queries", "5") == 0
    assert run_capture(model, tmp_path / "cpp.h5", "--tokens", "40", "--queries", "all", "--rope-order",
                       "llamacpp") == 0
    with h5py.File(tmp_path / "hf.h5") as hf, h5py.File(tmp_path / "cpp.h5") as cpp:
        assert hf.attrs["rope_pairs"] == b"half" and cpp.attrs["rope_pairs"] == b"adjacent"
        assert hf["layers/0/k"].shape == (1, tiny_gguf.HKV, 40, tiny_gguf.D)
        assert hf["layers/1/q"].shape == (1, tiny_gguf.HQ, 5, tiny_gguf.D)
        assert cpp["layers/1/q"].shape == (1, tiny_gguf.HQ, 40, tiny_gguf.D)
        # llama.cpp's channel 2i + c is Hugging Face's c * D/2 + i: the same numbers, reordered
        half = tiny_gguf.D // 2
        perm = np.array([c * half + i for i in range(half) for c in range(2)])
        for name in ("k", "q"):
            a, b = hf[f"layers/1/{name}"][...], cpp[f"layers/1/{name}"][...][:, :, -hf[f"layers/1/{name}"].shape[2]:]
            np.testing.assert_allclose(b, a[..., perm], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(cpp["layers/1/v"][...], hf["layers/1/v"][...], rtol=1e-4, atol=1e-5)
    inspect = kvq_cli("inspect", tmp_path / "cpp.h5")
    assert inspect.returncode == 0 and "adjacent: channels (2i, 2i + 1)" in inspect.stdout
    sweep = kvq_cli("sweep", tmp_path / "hf.h5", "--k", "int4-g8-asym,int8-head", "--v", "int8-head",
                    "--out", tmp_path / "sweep")
    assert sweep.returncode == 0, sweep.stderr
    rows = list(csv.DictReader(open(tmp_path / "sweep" / "sweep.csv")))
    assert len(rows) == 2 * 2 and all(float(r["out_rel_l2_mean"]) > 0 for r in rows)


def test_capture_says_when_the_context_or_the_text_cuts_tokens(model, tmp_path, capsys):
    path, _, cache = model
    long = tmp_path / "long.txt"
    long.write_text(" ".join([TEXT] * 6))  # more tokens than the tiny model's context of 256
    assert capture.main(["--model", str(path), "--text", str(long), "--cache-dir", str(cache), "--tokens", "300",
                         "--out", str(tmp_path / "ctx.h5")]) == 0
    assert ("kvq capture: note: capturing 256 tokens, fewer than --tokens 300: the model's context is 256"
            in capsys.readouterr().err)
    with h5py.File(tmp_path / "ctx.h5") as f:
        assert f["layers/0/k"].shape[2] == 256
    assert run_capture(model, tmp_path / "short.h5", "--tokens", "200") == 0
    err = capsys.readouterr().err
    assert "fewer than --tokens 200: the text has" in err and "context" not in err


def test_capture_refuses_bad_arguments(model, tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_capture(model, tmp_path / "x.h5", "--queries", "some")
    with pytest.raises(SystemExit):
        run_capture(model, tmp_path / "x.h5", "--tokens", "0")
    (tmp_path / "latin1.txt").write_bytes("café au lait".encode("latin-1"))
    with pytest.raises(SystemExit):
        capture.main(["--model", str(model[0]), "--text", str(tmp_path / "latin1.txt"),
                      "--out", str(tmp_path / "x.h5")])
    assert "latin1.txt: not UTF-8 text (invalid continuation byte at byte 3)" in capsys.readouterr().err
    assert capture.main(["--model", str(tmp_path / "absent.gguf"), "--out", str(tmp_path / "x.h5")]) == 2
    assert "absent.gguf: no such GGUF file" in capsys.readouterr().err
    assert not (tmp_path / "x.h5").exists()


def test_eval_runs_a_gguf_file(model, tmp_path):
    import kvq_eval
    path, text, cache = model
    out = tmp_path / "eval"
    assert kvq_eval.main(["--model", str(path), "--text", str(text), "--max-tokens", "48", "--k", "none,int8-head",
                          "--v", "none,int4-g8-asym+w8", "--out", str(out), "--no-plot"]) == 0
    rows = {(r["k_scheme"], r["v_scheme"]): r for r in csv.DictReader(open(out / "eval.csv"))}
    assert float(rows[("none", "none")]["kld_mean"]) == 0.0
    assert rows[("none", "none")]["source"] == "gguf:tiny" and rows[("none", "none")]["tokens"] == "48"
    assert 0 < float(rows[("int8-head", "none")]["kld_mean"]) < float(rows[("int8-head", "int4-g8-asym+w8")]["kld_mean"])


def write_rows(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_which_scheme_picks_the_smallest_pair_within_each_budget(tmp_path, capsys):
    def e2e(k, bits, kld):
        return {"source": "gguf:m", "tokens": 512, "k_scheme": k, "v_scheme": k, "kv_bits_per_element": bits,
                "kld_mean": kld, "top1_agreement": 0.9, "ppl_delta": 0.1, "out_rel_l2_mean": kld * 10}
    write_rows(tmp_path / "eval.csv", [e2e("none", 32, 0), e2e("int8-head", 8.25, 4e-4), e2e("int8-token", 8.08, 9e-4),
                                       e2e("int4-g32-asym", 5, 6e-3), e2e("int4-head", 4.25, 0.2)])

    def sweep(layer, k, bits, err, source="gguf:m (text.txt, 1024 tokens, rope order hf)"):  # a capture's source
        return {"source": source, "layer": layer, "k_scheme": k, "v_scheme": k, "out_rel_l2_mean": err,
                "kv_bits_per_element": bits}
    write_rows(tmp_path / "sweep.csv", [sweep(0, "int4-g32-asym", 5, 0.1), sweep(1, "int4-g32-asym", 5, 0.3),
                                        sweep(0, "int4-head", 4.25, 0.15), sweep(1, "int4-head", 4.25, 0.5),
                                        sweep(0, "int8-head", 8.25, 0.01), sweep(1, "int8-head", 8.25, 0.02)])
    assert which_scheme.main([str(tmp_path / "eval.csv"), "--sweep", str(tmp_path / "sweep.csv"),
                              "--max-kld", "1e-3,1e-2,1e-6"]) == 0
    out = capsys.readouterr().out
    assert "KLD budget 0.001 nats:\n  K int8-token, V int8-token: 8.08 bits" in out
    assert "KLD budget 0.01 nats:\n  K int4-g32-asym, V int4-g32-asym: 5.00 bits" in out
    # the pick's mean rel-L2 is 0.2: layer 0 stays within it with the cheaper int4-head (0.15), layer 1
    # only with the dearer int8-head (int4-g32-asym has 0.3 there)
    assert "    K int4-head, V int4-head (4.25 bits): layers 0\n    K int8-head, V int8-head (8.25 bits): layers 1\n" in out
    assert "(Spearman over 3 pairs, per layer): mean 1.000" in out
    assert "KLD budget 1e-06 nats:\n  no scheme pair stays within it" in out
    assert which_scheme.main([str(tmp_path / "sweep.csv")]) == 2  # not eval results
    assert "no column" in capsys.readouterr().err
    # another model's sweep is refused, not put beside this model's numbers
    write_rows(tmp_path / "other.csv", [sweep(0, "int8-head", 8.25, 0.01, "gguf:other (text.txt, 64 tokens)")])
    assert which_scheme.main([str(tmp_path / "eval.csv"), "--sweep", str(tmp_path / "other.csv")]) == 2
    assert "other.csv: kvq sweep results of gguf:other, not of gguf:m (the evaluated model)" in capsys.readouterr().err


def test_which_scheme_averages_a_layer_over_the_dumps_of_a_sweep(tmp_path):
    """Two captures of the model (two texts, or one text twice): each layer's error is the mean over
    both dumps, not the last dump's row."""
    def sweep(dump, layer, k, err):
        return {"source": "gguf:m (prompt of 80 characters, 64 tokens, rope order hf)", "dump": dump, "layer": layer,
                "k_scheme": k, "v_scheme": k, "out_rel_l2_mean": err, "kv_bits_per_element": 8.25}
    write_rows(tmp_path / "sweep.csv", [sweep(0, 0, "int8-head", 0.01), sweep(0, 1, "int8-head", 0.02),
                                        sweep(1, 0, "int8-head", 0.05), sweep(1, 1, "int8-head", 0.04)])
    table = which_scheme.sweep_table(str(tmp_path / "sweep.csv"), "gguf:m")
    assert table[("int8-head", "int8-head")] == {0: (pytest.approx(0.03), 8.25), 1: (pytest.approx(0.03), 8.25)}


def test_layer_lists():
    assert which_scheme.layer_list([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert which_scheme.layer_list([3]) == "3"


def test_spearman_by_hand():
    assert which_scheme.ranks([3.0, 1.0, 2.0, 2.0]) == [4.0, 1.0, 2.5, 2.5]
    assert which_scheme.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert which_scheme.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks [1, 2, 3] vs [1, 3, 2]: 1 - 6 * (0 + 1 + 1) / (3 * 8) = 0.5
    assert which_scheme.spearman([1, 2, 3], [5, 9, 7]) == pytest.approx(0.5)


def test_a_bad_rope_pairs_attribute_is_refused(model, tmp_path):
    assert run_capture(model, tmp_path / "d.h5", "--tokens", "12") == 0
    with h5py.File(tmp_path / "d.h5", "a") as f:
        f.attrs["rope_pairs"] = "sideways"
    r = kvq_cli("inspect", tmp_path / "d.h5")
    assert r.returncode == 3
    assert "d.h5: / attribute rope_pairs: expected half or adjacent, got 'sideways'" in r.stderr


def test_which_scheme_names_llama_cpp_cache_types_as_llama_cpp_runs_them(tmp_path, capsys):
    def e2e(k, v, bits, kld, head_dim=64):
        return {"source": "gguf:m", "tokens": 512, "head_dim": head_dim, "k_scheme": k, "v_scheme": v,
                "kv_bits_per_element": bits, "kld_mean": kld, "top1_agreement": 0.9, "ppl_delta": 0.1,
                "out_rel_l2_mean": kld * 10}
    write_rows(tmp_path / "eval.csv", [e2e("none", "none", 32, 0), e2e("q8_0", "q8_0", 8.5, 4e-4),
                                       e2e("q8_0+had", "q8_0+had", 8.5, 1e-4), e2e("int4-g32-asym", "int4-g32-asym", 5, 6e-3),
                                       e2e("q5_0", "q5_0", 5.5, 2e-2), e2e("q4_0+had", "q4_0+had", 4.5, 3e-2),
                                       e2e("q4_0", "q4_0", 4.5, 1.2e-1)])
    assert which_scheme.main([str(tmp_path / "eval.csv"), "--max-kld", "1e-3,2.5e-2,5e-2,1e-6"]) == 0
    out = capsys.readouterr().out
    assert ("KLD budget 0.001 nats:\n  K q8_0+had, V q8_0+had: 8.50 bits per element, KLD 1.000e-04" in out and
            "  in llama.cpp: -ctk q8_0 -ctv q8_0 (kvq: K q8_0+had, V q8_0+had), 8.50 bits per element" in out)
    # kvq's own int4 pair is the smaller one; of llama.cpp's, only the unrotated q5_0 was evaluated within it
    assert ("KLD budget 0.025 nats:\n  K int4-g32-asym, V int4-g32-asym: 5.00 bits" in out and
            "  in llama.cpp: LLAMA_ATTN_ROT_DISABLE=1 -ctk q5_0 -ctv q5_0 (kvq: K q5_0, V q5_0)" in out)
    assert "  in llama.cpp: -ctk q4_0 -ctv q4_0 (kvq: K q4_0+had, V q4_0+had), 4.50 bits" in out
    assert "KLD budget 1e-06 nats:\n  no scheme pair stays within it" in out


def test_which_scheme_names_a_value_that_is_not_a_number(tmp_path, capsys):
    row = {"source": "gguf:m", "k_scheme": "int8-head", "v_scheme": "int8-head", "kv_bits_per_element": 8.25,
           "kld_mean": 4e-4, "top1_agreement": 0.9, "ppl_delta": 0.1, "out_rel_l2_mean": 4e-3}
    write_rows(tmp_path / "eval.csv", [row, dict(row, k_scheme="int4-head", kld_mean="")])
    assert which_scheme.main([str(tmp_path / "eval.csv")]) == 2
    err = capsys.readouterr().err
    assert err == f"which_scheme: error: {tmp_path / 'eval.csv'}: line 3, column kld_mean: expected a number, got ''\n"


@pytest.mark.parametrize("budgets", ["nan", "1e-3,-1e-2", "1e-3,,"])
def test_which_scheme_refuses_budgets_that_are_not_kl_values(tmp_path, capsys, budgets):
    with pytest.raises(SystemExit) as e:
        which_scheme.main([str(tmp_path / "eval.csv"), "--max-kld", budgets])
    assert e.value.code == 2 and f"--max-kld {budgets!r}: expected non-negative numbers" in capsys.readouterr().err
