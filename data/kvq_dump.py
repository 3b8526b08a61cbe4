"""Reading and writing kvq dumps (HDF5 schema v1, see docs/data.md) with h5py and numpy.

bfloat16 has no HDF5 or numpy type: kvq declares it as an HDF5 float type with bfloat16's layout
(sign bit 15, 8 exponent bits at 7 with bias 127, 7 mantissa bits). h5py reads such a dataset as
float32 (HDF5 converts exactly); `write_dump(..., dtype="bfloat16")` writes one.

Files are written in the HDF5 1.10 format (checksummed metadata) with every dataset chunked and
Fletcher32-checksummed, and text attributes as fixed-length UTF-8 (inside the checksummed object
header; variable-length strings live in HDF5's global heap, which has no checksum), so a flipped
byte is an HDF5 checksum error rather than silent garbage or a crash. h5py reads such attributes as
bytes: `text()` decodes either kind. Not libver="latest": h5py's HDF5 (2.x) would then use object
versions that kvq's HDF5 1.10 cannot read.
"""
import os

import h5py
import numpy as np

SCHEMA = 1
DTYPES = ("float32", "float16", "bfloat16")
LIBVER = ("v110", "v110")  # the newest format HDF5 1.10 (kvq's C++ side) reads
CHUNK_BYTES = 1 << 20


def chunk_shape(shape, itemsize):
    """Chunks of at most CHUNK_BYTES: whole trailing dimensions, one partial, then 1s (as kvq's
    C++ writer, data/h5_writer.cpp). None for an empty dataset (it cannot be chunked)."""
    if not shape or 0 in shape:
        return None
    chunk, budget = [1] * len(shape), max(1, CHUNK_BYTES // itemsize)
    for i in reversed(range(len(shape))):
        chunk[i] = min(shape[i], budget)
        budget //= chunk[i]
        if chunk[i] < shape[i] or budget <= 1:
            break
    return tuple(chunk)


def set_text_attr(obj, name, value):
    """A text attribute as kvq writes them: fixed-length UTF-8, stored in the object header."""
    data = value.encode("utf-8")
    obj.attrs.create(name, data, dtype=h5py.string_dtype("utf-8", max(1, len(data))))


def text(value):
    """A text attribute's value as str, whether stored fixed-length (bytes in h5py) or variable-length."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def create_checked_dataset(group, name, data):
    """A dataset as kvq writes them: chunked and Fletcher32-checksummed (contiguous when empty)."""
    data = np.asarray(data)
    chunks = chunk_shape(data.shape, data.dtype.itemsize)
    if chunks is None:
        return group.create_dataset(name, data=data, track_times=False)
    return group.create_dataset(name, data=data, chunks=chunks, fletcher32=True, track_times=False)


def bf16_type():
    """The HDF5 datatype kvq uses for bfloat16."""
    t = h5py.h5t.IEEE_F32LE.copy()
    t.set_fields(15, 7, 8, 0, 7)  # shrink in this order: fields, offset, precision, size
    t.set_offset(0)
    t.set_precision(16)
    t.set_size(2)
    t.set_ebias(127)
    return t


def to_bf16_bits(x):
    """float32 array -> bfloat16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    rounded[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded


def _refuse_overflow(values, stored_finite, shown, dataset, dtype):
    """A finite value that rounding to `dtype` made infinite is an error (as kvq's C++ writer), not an inf."""
    lost = np.isfinite(values) & ~stored_finite
    if lost.any():
        at = np.unravel_index(int(np.argmax(lost)), values.shape)
        largest = "65504" if dtype == "float16" else "3.39e38"
        raise ValueError(f"{shown}: {dataset}: value {float(values[at]):.9g} at [{', '.join(str(int(i)) for i in at)}] "
                         f"overflows {dtype} (largest finite {largest}); store float32 or rescale")


def _write_tensor(group, name, values, dtype, shown):
    values = np.asarray(values, dtype=np.float32)
    dataset = f"{group.name}/{name}"
    if dtype == "float32":
        create_checked_dataset(group, name, values)
    elif dtype == "float16":
        with np.errstate(over="ignore"):
            stored = values.astype(np.float16)
        _refuse_overflow(values, np.isfinite(stored), shown, dataset, dtype)
        create_checked_dataset(group, name, stored)
    elif dtype == "bfloat16":
        bits = to_bf16_bits(values)
        _refuse_overflow(values, (bits & 0x7F80) != 0x7F80, shown, dataset, dtype)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_obj_track_times(False)
        chunks = chunk_shape(values.shape, 2)
        if chunks is not None:
            dcpl.set_chunk(chunks)
            dcpl.set_fletcher32()
        space = h5py.h5s.create_simple(values.shape)
        ds = h5py.h5d.create(group.id, name.encode(), bf16_type(), space, dcpl=dcpl)
        ds.write(h5py.h5s.ALL, h5py.h5s.ALL, bits, mtype=bf16_type())
    else:
        raise ValueError(f"dtype {dtype!r}: expected one of {DTYPES}")


def read_text_option(ap, path):
    """The UTF-8 text of the file given as --text: a usage error of `ap` (exit 2) naming the file where
    it is missing or not UTF-8 (a Latin-1 or binary file), before any model loads."""
    if not os.path.isfile(path):
        ap.error(f"--text {path}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        ap.error(f"--text {path}: not UTF-8 text ({e.reason} at byte {e.start})")


def text_source(prompt, text_path):
    """What a capture ran on, for its `source`: the text file's name, or the prompt's length. Two
    captures of one model on other texts then have other sources."""
    return f"prompt of {len(prompt)} characters" if prompt is not None else os.path.basename(text_path)


def write_dump(path, layers, *, source, created_by, rope, seq_lens=None, tokens=None, dtype="float32",
               rope_pairs=None):
    """Writes a schema-v1 dump.

    rope_pairs (optional): which channels RoPE pairs in K and Q, "half" ((i, i + D/2): Hugging Face,
    vLLM) or "adjacent" ((2i, 2i + 1): llama.cpp, llama2.c).

    layers: list of dicts with k and v [B, Hkv, T, D], optional q [B, Hq, Tq, D], num_q_heads,
    and optional softmax_scale and alibi. seq_lens [B] and tokens [B, T] are optional.
    """
    if rope not in ("post", "pre", "none"):
        raise ValueError(f"rope {rope!r}: expected post, pre or none")
    if rope_pairs not in (None, "half", "adjacent"):
        raise ValueError(f"rope_pairs {rope_pairs!r}: expected half or adjacent")
    # Written beside the path and moved onto it when whole: a failure part-way (a bad layer) leaves
    # an earlier file at `path` as it was and no partial file (as kvq's C++ writer).
    partial = f"{path}.partial-{os.getpid()}"
    try:
        _write_dump_file(partial, layers, source=source, created_by=created_by, rope=rope, seq_lens=seq_lens,
                         tokens=tokens, dtype=dtype, rope_pairs=rope_pairs, shown=path)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise


def _write_dump_file(path, layers, *, source, created_by, rope, seq_lens, tokens, dtype, rope_pairs, shown):
    with h5py.File(path, "w", track_order=False, libver=LIBVER) as f:
        f.attrs["kvq_schema"] = np.int64(SCHEMA)
        set_text_attr(f, "source", source)
        set_text_attr(f, "created_by", created_by)
        set_text_attr(f, "rope", rope)
        if rope_pairs is not None:
            set_text_attr(f, "rope_pairs", rope_pairs)
        group = f.create_group("layers")
        for index, layer in enumerate(layers):
            k, v = np.asarray(layer["k"]), np.asarray(layer["v"])
            if k.ndim != 4 or k.shape != v.shape:
                raise ValueError(f"layer {index}: k {k.shape} and v {v.shape} must both be [B, Hkv, T, D]")
            g = group.create_group(str(index))
            _write_tensor(g, "k", k, dtype, shown)
            _write_tensor(g, "v", v, dtype, shown)
            num_q_heads = int(layer.get("num_q_heads", k.shape[1]))
            if layer.get("q") is not None:
                q = np.asarray(layer["q"])
                if q.ndim != 4 or q.shape[0] != k.shape[0] or q.shape[1] != num_q_heads or q.shape[3] != k.shape[3]:
                    raise ValueError(f"layer {index}: q {q.shape} must be [B, Hq={num_q_heads}, Tq, D]")
                _write_tensor(g, "q", q, dtype, shown)
            g.attrs["num_q_heads"] = np.int64(num_q_heads)
            g.attrs["num_kv_heads"] = np.int64(k.shape[1])
            g.attrs["head_dim"] = np.int64(k.shape[3])
            if layer.get("softmax_scale") is not None:
                g.attrs["softmax_scale"] = np.float64(layer["softmax_scale"])
            g.attrs["alibi"] = np.bool_(layer.get("alibi", False))
        if seq_lens is not None:
            create_checked_dataset(f, "seq_lens", np.asarray(seq_lens, dtype=np.int32))
        if tokens is not None:
            create_checked_dataset(f, "tokens", np.asarray(tokens, dtype=np.int32))


def read_dump(path):
    """The dump as a dict: attrs, layers (list of dicts of float32 arrays and attrs), seq_lens, tokens."""
    with h5py.File(path, "r") as f:
        if int(f.attrs.get("kvq_schema", -1)) != SCHEMA:
            raise ValueError(f"{path}: kvq_schema is {f.attrs.get('kvq_schema')}, expected {SCHEMA}")
        out = {"attrs": {k: (text(v) if isinstance(v, (bytes, str)) else v) for k, v in f.attrs.items()}, "layers": []}
        for name in sorted(f["layers"], key=int):
            g = f["layers"][name]
            layer = {key: g[key].astype("float32")[...] for key in ("k", "v", "q") if key in g}
            layer.update({key: g.attrs[key] for key in g.attrs})
            out["layers"].append(layer)
        out["seq_lens"] = f["seq_lens"][...] if "seq_lens" in f else None
        out["tokens"] = f["tokens"][...] if "tokens" in f else None
    return out
