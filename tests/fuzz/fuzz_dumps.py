"""Seeded mutation fuzzer for kvq's dump reading: corrupt HDF5 files must end in one line naming the
file and an exit code (3 input error, 4 corrupt file), never a crash, a hang or a stack trace.

Mutants come from small valid dumps (several writers, formats and dtypes) by raw byte edits (flips,
overwritten words, truncation, deletion, insertion, duplication), by HDF5-level edits with h5py
(wrong ranks, shapes, dtypes and attribute types, values out of range, missing datasets, bad layer
names, huge declared dimensions, NaN in Q/K) and by corrupting the stored bytes of a data chunk.

    fuzz_dumps.py --kvq build/experiments/kvq --count 2000 --seed 7   # a fresh seeded batch
    fuzz_dumps.py --kvq build/experiments/kvq --corpus tests/fuzz/corpus  # the regression corpus
    fuzz_dumps.py ... --save DIR   # copy inputs that crashed or hung into DIR (to grow the corpus)

Exit status 1 when any run crashed, hung, printed more than one line on stderr, gave an internal
error or did not name the file. Prints the outcome classes and, with --report, writes them as JSON.
"""
import argparse
import collections
import concurrent.futures
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "data"))
import kvq_dump  # noqa: E402

# kvq's own limit on a dump check (seconds); the harness waits longer before calling it a hang.
CHECK_SECONDS = "2"
FAILURES = ("crash", "hang", "multi-line", "internal-error", "unnamed-error", "other-exit")


# ---- seeds: small valid dumps from each writer ----------------------------------------------
def _layers(rng, n, B, Hq, Hkv, T, D, Tq, **attrs):
    out = []
    for _ in range(n):
        k = rng.normal(size=(B, Hkv, T, D)).astype(np.float32)
        v = rng.normal(size=(B, Hkv, T, D)).astype(np.float32)
        q = rng.normal(size=(B, Hq, Tq, D)).astype(np.float32)
        out.append(dict(k=k, v=v, q=q, num_q_heads=Hq, **attrs))
    return out


def _legacy_dump(path, rng):
    """Contiguous datasets in HDF5's default (oldest) format, as other tools write them."""
    with h5py.File(path, "w") as f:
        f.attrs.update(kvq_schema=np.int64(1), source="legacy", created_by="h5py", rope="post")
        g = f.create_group("layers/0")
        for name, shape in (("k", (1, 2, 7, 4)), ("v", (1, 2, 7, 4)), ("q", (1, 2, 1, 4))):
            g[name] = rng.normal(size=shape).astype(np.float32)
        g.attrs.update(num_q_heads=np.int64(2), num_kv_heads=np.int64(2), head_dim=np.int64(4))


def _gzip_dump(path, rng):
    """Compressed chunks (deflate + shuffle), as foreign captures may be stored."""
    with h5py.File(path, "w") as f:
        f.attrs.update(kvq_schema=np.int64(1), source="gzip", created_by="h5py", rope="none")
        g = f.create_group("layers/0")
        for name, shape in (("k", (2, 1, 9, 4)), ("v", (2, 1, 9, 4)), ("q", (2, 2, 9, 4))):
            g.create_dataset(name, data=rng.normal(size=shape).astype(np.float32), chunks=(1, 1, 4, 4),
                             compression="gzip", shuffle=True)
        g.attrs.update(num_q_heads=np.int64(2), num_kv_heads=np.int64(1), head_dim=np.int64(4),
                       softmax_scale=0.3, alibi=np.bool_(True))
        f.create_dataset("seq_lens", data=np.array([9, 4], dtype=np.int64), chunks=(2,), compression="gzip")


def make_seeds(directory, kvq_bin):
    rng = np.random.default_rng(1234)
    seeds = {}

    def add(name, write):
        path = os.path.join(directory, name + ".h5")
        write(path)
        seeds[name] = path

    add("v110-fp16-tqT", lambda p: kvq_dump.write_dump(
        p, _layers(rng, 1, 2, 2, 1, 6, 4, 6), source="synthetic:fuzz", created_by="fuzz", rope="post",
        seq_lens=[6, 0], tokens=np.arange(12).reshape(2, 6), dtype="float16"))
    add("v110-bf16-tq1", lambda p: kvq_dump.write_dump(
        p, _layers(rng, 2, 1, 4, 2, 5, 8, 1, alibi=True, softmax_scale=0.5), source="synthetic:fuzz",
        created_by="fuzz", rope="pre", dtype="bfloat16"))
    add("legacy-f32", lambda p: _legacy_dump(p, rng))
    add("gzip-f32", lambda p: _gzip_dump(p, rng))
    add("kvq-synth", lambda p: subprocess.run(
        [kvq_bin, "synth", "--out", p, "--layers", "2", "--batch", "2", "--q-heads", "2", "--kv-heads", "1",
         "--tokens", "6", "--head-dim", "8", "--q-len", "1", "--dtype", "bfloat16"], check=True,
        capture_output=True))
    return seeds


# ---- raw byte mutations ---------------------------------------------------------------------
INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 32, (1 << 63) - 1,
               (1 << 64) - 1]


def raw_mutation(rng, data):
    data = bytearray(data)
    kind = rng.choice(["flip", "flip", "flip", "word", "set", "truncate", "delete", "insert", "duplicate"])
    n = len(data)
    if kind == "flip":
        spots = [rng.randrange(n) for _ in range(rng.choice([1, 1, 2, 3, 8]))]
        for i in spots:
            data[i] ^= 1 << rng.randrange(8)
        return kind, bytes(data), f"flip bits at {spots}"
    if kind == "word":
        width = rng.choice([1, 2, 4, 8])
        i = rng.randrange(max(1, n - width))
        value = rng.choice(INTERESTING + [n, n - 1, rng.randrange(1 << 16)]) & ((1 << (8 * width)) - 1)
        data[i:i + width] = value.to_bytes(width, "little")
        return kind, bytes(data), f"{width}-byte word {value:#x} at {i}"
    if kind == "set":
        i, length = rng.randrange(n), rng.choice([1, 4, 16, 64])
        data[i:i + length] = bytes([rng.choice([0, 0xFF, rng.randrange(256)])]) * len(data[i:i + length])
        return kind, bytes(data), f"set {length} bytes at {i}"
    if kind == "truncate":
        cut = rng.randrange(n)
        return kind, bytes(data[:cut]), f"truncate to {cut} bytes"
    if kind == "delete":
        i, length = rng.randrange(n), rng.choice([1, 2, 8, 64, 512])
        del data[i:i + length]
        return kind, bytes(data), f"delete {length} bytes at {i}"
    if kind == "insert":
        i, length = rng.randrange(n), rng.choice([1, 4, 8, 100])
        data[i:i] = bytes(rng.randrange(256) for _ in range(length))
        return kind, bytes(data), f"insert {length} bytes at {i}"
    i, length = rng.randrange(n), rng.choice([8, 64, 256])
    j = rng.randrange(n)
    data[j:j] = data[i:i + length]
    return kind, bytes(data), f"duplicate {length} bytes from {i} to {j}"


# ---- HDF5-level mutations (h5py, on a copy of a seed) -----------------------------------------
def _datasets(f):
    names = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


def _groups(f):
    names = ["/"]
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Group) else None)
    return names


def _replace(f, name, data, **kw):
    del f[name]
    f.create_dataset(name, data=data, **kw)


def structured_mutation(rng, path):
    """Edits the file at `path` in place; returns (kind, description)."""
    with h5py.File(path, "r+") as f:
        datasets, groups = _datasets(f), _groups(f)
        layer_groups = [g for g in groups if g.startswith("layers/")]
        kind = rng.choice(["rank", "shape", "dtype", "attr-type", "attr-value", "attr-delete", "delete",
                           "layer-name", "huge-dims", "seq_lens", "non-finite", "layers-kind", "empty"])
        name = rng.choice(datasets)
        shape = f[name].shape
        if kind == "rank":
            new = shape[:rng.randrange(len(shape))] if len(shape) > 1 and rng.random() < 0.5 else shape + (2,)
            _replace(f, name, np.zeros(new, np.float32))
        elif kind == "shape":
            new = tuple(max(0, d + rng.choice([-1, 1, 5])) if rng.random() < 0.5 else d for d in shape)
            _replace(f, name, np.ones(new, np.float32))
        elif kind == "dtype":
            dtype = rng.choice(["i1", "u4", "i8", "f8", "S3", "c8", "?"])
            if dtype == "S3":
                _replace(f, name, np.full(shape, b"abc", dtype="S3"))
            else:
                _replace(f, name, np.ones(shape, dtype=dtype))
        elif kind in ("attr-type", "attr-value", "attr-delete"):
            owner = f[rng.choice(groups)]
            keys = list(owner.attrs) or ["kvq_schema"]
            key = rng.choice(keys)
            if kind == "attr-delete":
                owner.attrs.pop(key, None)
            elif kind == "attr-type":
                owner.attrs[key] = rng.choice([np.array([1, 2, 3]), "text", np.float64(2.5), np.bool_(True),
                                               np.array([], dtype=np.int64), np.zeros((2, 2)), b"\xff\xfe"])
            else:
                owner.attrs[key] = rng.choice([np.int64(0), np.int64(-1), np.int64(1 << 62), np.int64(2),
                                               np.float64("nan"), np.float64("inf"), np.float64(-3.0),
                                               np.int32(7), np.uint64((1 << 64) - 1), "bogus", ""])
        elif kind == "delete":
            del f[name]
        elif kind == "layer-name" and layer_groups:
            g = rng.choice([g for g in layer_groups if g.count("/") == 1] or layer_groups)
            f.move(g, "layers/" + rng.choice(["x", "-1", "1.5", "99999999999", " 0", "0x1", "00", "2147483647"]))
        elif kind == "huge-dims":
            dims = tuple(rng.choice([d, 1 << 20, 1 << 31, (1 << 40)]) for d in shape) or (1 << 40,)
            del f[name]
            f.create_dataset(name, shape=dims, dtype=np.float32, chunks=tuple(1 for _ in dims))
        elif kind == "seq_lens":
            values = [rng.choice([-1, 0, 1, 6, 1 << 31, -(1 << 40), 1 << 62]) for _ in range(rng.choice([1, 2, 3]))]
            if "seq_lens" in f:
                del f["seq_lens"]
            f.create_dataset("seq_lens", data=np.array(values, dtype=rng.choice(["i8", "u8", "f4", "i2"])))
        elif kind == "non-finite":
            floats = [d for d in datasets if f[d].dtype.kind == "f" and f[d].size]
            if floats:
                d = f[rng.choice(floats)]
                x = d[...].astype(np.float32)
                x.flat[rng.randrange(x.size)] = rng.choice([np.nan, np.inf, -np.inf])
                d[...] = x
        elif kind == "layers-kind":
            del f["layers"]
            if rng.random() < 0.5:
                f["layers"] = np.zeros(3)
            else:
                f.create_group("layers")
        else:  # an empty dataset or group where data is expected
            _replace(f, name, np.zeros(tuple(0 for _ in shape) or (0,), np.float32))
    return kind, f"{kind} on {name}"


def chunk_mutation(rng, path):
    """Flips bytes inside the stored bytes of one data chunk (compressed or checksummed)."""
    spots = []
    with h5py.File(path, "r") as f:
        for name in _datasets(f):
            dsid = f[name].id
            if f[name].chunks is None:
                continue
            for i in range(dsid.get_num_chunks()):
                info = dsid.get_chunk_info(i)
                if info.size:
                    spots.append((name, info.byte_offset, info.size))
    if not spots:
        return None
    name, offset, size = rng.choice(spots)
    with open(path, "r+b") as fh:
        for _ in range(rng.choice([1, 2, 4])):
            at = offset + rng.randrange(size)
            fh.seek(at)
            b = fh.read(1)
            fh.seek(at)
            fh.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
    return "chunk", f"chunk bytes of {name} at {offset} (+{size})"


def commit_seed():
    """A seed from the checkout's commit: each commit gets fresh mutants, and a CI run of a commit
    replays exactly the batch its author ran. None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        return int(head[:8], 16) if len(head) >= 8 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def make_mutant(rng, seeds, out_path):
    seed_name = rng.choice(sorted(seeds))
    seed = seeds[seed_name]
    shutil.copyfile(seed, out_path)
    roll = rng.random()
    kind, desc = None, None
    try:
        if roll < 0.3:
            kind, desc = structured_mutation(rng, out_path)
        elif roll < 0.4:
            res = chunk_mutation(rng, out_path)
            if res:
                kind, desc = res
    except Exception as e:  # h5py refused an edit: fall back to a raw mutation of the seed
        shutil.copyfile(seed, out_path)
        kind, desc = None, f"(h5py edit failed: {type(e).__name__})"
    if kind is None:
        with open(out_path, "rb") as fh:
            data = fh.read()
        kind, data, desc = raw_mutation(rng, data)
        if rng.random() < 0.15:  # stack a second raw edit
            _, data, desc2 = raw_mutation(rng, data)
            desc += "; " + desc2
        with open(out_path, "wb") as fh:
            fh.write(data)
    return seed_name, kind, desc


# ---- running kvq ------------------------------------------------------------------------------
def command_line(kvq_bin, command, path, scratch):
    if command == "inspect":
        return [kvq_bin, "inspect", path]
    if command == "sweep":
        return [kvq_bin, "sweep", path, "--k", "int8-head", "--v", "int4-head-asym", "--no-latency", "--out",
                os.path.join(scratch, "sweep")]
    if command == "reference":
        return [kvq_bin, "reference", path, "--out", os.path.join(scratch, "ref.h5")]
    if command == "quantize":
        return [kvq_bin, "quantize", path, "--k", "int8-token", "--v", "int4-head", "--out",
                os.path.join(scratch, "q.h5")]
    raise ValueError(command)


def classify(rc, stderr, path, timed_out):
    lines = [line for line in stderr.splitlines() if line.strip()]
    if timed_out:
        return "hang"
    if any("Sanitizer" in line or "runtime error:" in line for line in lines):
        return "crash"
    if rc < 0 or rc >= 128:
        return "crash"
    if rc == 0:
        return "ok" if not lines else "multi-line" if len(lines) > 1 else "ok-with-warning"
    if len(lines) != 1:
        return "multi-line"
    if rc == 1:
        return "internal-error"
    if rc not in (3, 4):
        return "other-exit"
    if not lines[0].startswith("kvq: error: ") or path not in lines[0]:
        return "unnamed-error"
    return "input-error" if rc == 3 else "corrupt-file"


def run_kvq(kvq_bin, command, path, timeout):
    scratch = tempfile.mkdtemp(prefix="kvq_fuzz_run_")
    env = dict(os.environ, KVQ_DUMP_CHECK_SECONDS=CHECK_SECONDS, OMP_NUM_THREADS="1")  # runs go side by side
    start = time.monotonic()
    try:
        proc = subprocess.Popen(command_line(kvq_bin, command, path, scratch), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, errors="replace", env=env,
                                start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: kvq and any child it started
            _, stderr = proc.communicate()
            timed_out = True
        outcome = classify(proc.returncode, stderr, path, timed_out)
        first = stderr.strip().splitlines()[:1]
        return {"command": command, "rc": proc.returncode, "outcome": outcome, "seconds": time.monotonic() - start,
                "stderr": first[0][:300] if first else "", "stderr_lines": len(stderr.strip().splitlines())}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ---- main -------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvq", default=os.environ.get("KVQ_BIN", os.path.join(ROOT, "build", "experiments", "kvq")))
    ap.add_argument("--corpus", help="run every file of this directory (with every command) instead of mutants")
    ap.add_argument("--count", type=int, default=500, help="fresh mutants to run")
    ap.add_argument("--seed", type=int, default=int(os.environ["KVQ_FUZZ_SEED"]) if "KVQ_FUZZ_SEED" in os.environ else None,
                    help="RNG seed (default: $KVQ_FUZZ_SEED, else from the checkout's commit, else random; "
                         "printed either way)")
    ap.add_argument("--commands", default="inspect,sweep,reference,quantize",
                    help="mutants run inspect plus one of these in turn; corpus files run them all")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a run counts as a hang")
    ap.add_argument("--save", help="copy inputs with a failing outcome here")
    ap.add_argument("--report", help="write outcomes as JSON here")
    ap.add_argument("--show", type=int, default=10, help="failures to print in full")
    args = ap.parse_args(argv)
    commands = args.commands.split(",")
    seed = args.seed if args.seed is not None else commit_seed()
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    work = tempfile.mkdtemp(prefix="kvq_fuzz_")
    try:
        jobs = []  # (path, origin, commands)
        if args.corpus:
            for name in sorted(os.listdir(args.corpus)):
                if name.endswith(".h5"):
                    jobs.append((os.path.join(args.corpus, name), {"file": name}, commands))
            print(f"fuzz: corpus {args.corpus}: {len(jobs)} files x {len(commands)} commands")
        else:
            print(f"fuzz: {args.count} fresh mutants, seed {seed} (rerun with --seed {seed})")
            rng = random.Random(seed)
            seeds = make_seeds(work, args.kvq)
            for i in range(args.count):
                path = os.path.join(work, f"mutant-{i:06d}.h5")
                seed_name, kind, desc = make_mutant(rng, seeds, path)
                others = [c for c in commands if c != "inspect"] or ["inspect"]
                jobs.append((path, {"seed": seed_name, "mutation": kind, "detail": desc},
                             sorted({"inspect", others[i % len(others)]})))
        outcomes, failures, runs = collections.Counter(), [], 0
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = {pool.submit(lambda p=path, cs=cs: [run_kvq(args.kvq, c, p, args.timeout) for c in cs]):
                       (path, origin) for path, origin, cs in jobs}
            for fut in concurrent.futures.as_completed(futures):
                path, origin = futures[fut]
                for r in fut.result():
                    runs += 1
                    outcomes[(r["command"], r["outcome"])] += 1
                    if r["outcome"] in FAILURES:
                        failures.append(dict(origin, path=path, **r))
                        if args.save:
                            os.makedirs(args.save, exist_ok=True)
                            digest = hashlib.sha256(open(path, "rb").read()).hexdigest()[:12]
                            shutil.copyfile(path, os.path.join(args.save, f"{r['outcome']}-{r['command']}-{digest}.h5"))
        elapsed = time.monotonic() - start
        by_class = collections.Counter()
        for (_, outcome), n in outcomes.items():
            by_class[outcome] += n
        print(f"fuzz: {len(jobs)} inputs, {runs} kvq runs in {elapsed:.0f} s")
        for outcome, n in sorted(by_class.items(), key=lambda kv: -kv[1]):
            print(f"  {outcome:<16} {n:>7}" + ("   <-- failure" if outcome in FAILURES else ""))
        for f in failures[:args.show]:
            print(f"FAIL {f['outcome']}: kvq {f['command']} {f['path']} ({f.get('detail', f.get('file'))}): "
                  f"rc {f['rc']}, {f['stderr_lines']} stderr lines, first: {f['stderr']}")
        if args.report:
            with open(args.report, "w") as fh:
                json.dump({"seed": None if args.corpus else seed, "inputs": len(jobs), "runs": runs,
                           "seconds": elapsed, "outcomes": dict(by_class),
                           "by_command": {f"{c}/{o}": n for (c, o), n in sorted(outcomes.items())},
                           "failures": failures}, fh, indent=1)
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
