"""`pip install .` in a fresh virtual environment gives a working `import kvq` whose quantizer is byte
for byte the kvq command line's. pip fetches the build requirements (scikit-build-core, nanobind)
and numpy from PyPI, then compiles only the CPU libraries the module needs."""
import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUNDLED = os.path.join(ROOT, "data", "dumps", "stories260k.h5")
SCHEMES = ["int8-head", "int4-g4-asym", "int4-chan-t32-asym-fp32", "int8-token-asym"]

INSIDE = textwrap.dedent("""
    import sys
    import numpy as np
    import kvq
    assert kvq.__file__.startswith(sys.prefix), kvq.__file__  # the installed package, not a build tree
    x = np.load(sys.argv[1])
    out = {}
    for scheme in sys.argv[3:]:
        r = kvq.quantize(x, scheme, name="K")
        out[scheme + "/codes"], out[scheme + "/scales"], out[scheme + "/dequantized"] = r.codes, r.scales, r.dequantized
        if r.zero_points is not None:
            out[scheme + "/zero_points"] = r.zero_points
    try:
        kvq.quantize(x, "int4-g3")
        raise SystemExit("no error for int4-g3")
    except kvq.SchemeError as e:
        assert str(e) == "int4-g3: group size 3 does not divide head_dim 8", e
    start, values = kvq.AppendQuantizer("int8-head").append(x[:, :, :2])
    assert start == 0 and values.shape == (1, 4, 2, 8)
    o, lse = kvq.attention(x[:, :, -1:], x, x)
    assert o.shape == (1, 4, 1, 8)
    np.savez(sys.argv[2], **out)
    print("kvq", kvq.__version__, "from", kvq.__file__)
""")


def kvq_cli(*args):
    binary = os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq"))
    r = subprocess.run([binary, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_pip_install_in_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    # CPU only: the GPU module would compile every kernel (minutes on CI's 2 cores) and cannot run there
    r = subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                        "-C", "cmake.define.KVQ_CUDA=OFF", ROOT], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    with h5py.File(BUNDLED) as f:
        k = f["layers/3/k"][...]
    np.save(tmp_path / "k.npy", k)
    r = subprocess.run([python, "-c", INSIDE, str(tmp_path / "k.npy"), str(tmp_path / "out.npz"), *SCHEMES], env=env,
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out.npz")
    for scheme in SCHEMES:
        kvq_cli("quantize", BUNDLED, "--layers", "3", "--k", scheme, "--v", scheme, "--out", tmp_path / "q.h5")
        with h5py.File(tmp_path / "q.h5") as f:
            g = f["layers/3/k"]
            for name in ("codes", "scales", "zero_points", "dequantized"):
                if name in g:
                    assert got[f"{scheme}/{name}"].dtype == g[name].dtype
                    assert got[f"{scheme}/{name}"].tobytes() == g[name][...].tobytes(), (scheme, name)
