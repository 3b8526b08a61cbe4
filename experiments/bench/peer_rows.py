"""What bench_peers.py times and writes, without torch (so CI tests it): the DESIGN.md decode shapes,
the peers, which shapes FBGEMM's kernel takes, FlashInfer's page table and kernel choice, byte counts,
the number of rotating input sets, and the CSV row in `kvq bench`'s schema (experiments/cli/cmd_bench.cpp,
kColumns), and which (shape, storage pair, page size) cases bench_paged.py times."""
import re
import statistics
from dataclasses import dataclass

# kvq bench's CSV columns, in order; tests/python/test_bench_peers.py checks them against cmd_bench.cpp.
COLUMNS = ("shape,B,HQ,HKV,T,D,kernel,k_scheme,v_scheme,layout,splits,heads_per_cta,median_us,p10_us,p90_us,reps,"
           "calls_per_graph,input_sets,bytes,GBps,pct_of_read,read_GBps,copy_GBps,vs_cudnn,floor_us,gpu,driver,"
           "cuda,commit").split(",")


@dataclass(frozen=True)
class Shape:
    name: str
    B: int
    HQ: int
    HKV: int
    T: int
    D: int

    @property
    def label(self):
        """kvq bench's shape label (experiments/common/decode_shapes.cpp), which --shapes matches."""
        return f"{self.name}/B{self.B}/T{self.T}"


# The DESIGN.md decode shapes (experiments/common/decode_shapes.cpp), plus MHA at B=128 for the bf16 peers.
SHAPES = ([Shape("seed000", b, 8, 1, 8192, 128) for b in (32, 64, 128, 256, 512)] +
          [Shape("seed002", 1, 32, 8, 1024, 128)] +
          [Shape("llama8b", b, 32, 8, t, 128) for b in (1, 8, 64) for t in (1024, 8192, 32768)
           if (b, t) != (64, 32768)] +
          [Shape("smollm2", b, 9, 3, t, 64) for b in (1, 8, 64) for t in (1024, 8192)] +
          [Shape("mha_b128", 128, 32, 32, t, 128) for t in (128, 1024, 4096)])


@dataclass(frozen=True)
class FbgemmPeer:
    """FBGEMM's INT4 `gqa_attn_splitk` on its inline rows with `groups` (scale, shift) fp16 pairs per
    row, named in the CSV by the kvq scheme that stores the same numbers (kvq's `:fbgemm` storage)."""
    name: str
    groups: int

    def scheme(self, head_dim):
        return "int4-head-asym" if self.groups == 1 else f"int4-g{head_dim // self.groups}-asym"


BF16_PEERS = ("cudnn", "flash2")  # PyTorch SDPA backends
FBGEMM_PEERS = (FbgemmPeer("fbgemm-int4-g1", 1), FbgemmPeer("fbgemm-int4-g4", 4))
FBGEMM_MAX_T = 16384  # gqa_attn_splitk's MAX_T
# num_split_ks tried per shape; the seed searched 2..128. One split does not fit shared memory at T=8192.
FBGEMM_SPLITS = (2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class FlashInferPeer:
    """FlashInfer's paged batch decode (BatchDecodeWithPagedKVCacheWrapper) over a K/V cache of torch
    dtype `kv_dtype` (named, so that this module needs no torch) with `kv_bytes` bytes per element, bf16
    queries and outputs; named in the CSV by the kvq scheme that stores the same K/V bytes (`fp8-e4m3`:
    e4m3 codes with no scale, FlashInfer's per-tensor k_scale / v_scale left at 1)."""
    name: str
    kv_dtype: str
    kv_bytes: int
    scheme: str


FLASHINFER_PEERS = (FlashInferPeer("flashinfer-fp8-e4m3", "float8_e4m3fn", 1, "fp8-e4m3"),
                    FlashInferPeer("flashinfer-bf16", "bfloat16", 2, "bf16"))
FLASHINFER_PAGE = 16  # tokens per page, vLLM's default block size


def select(option, rx, items, name_of=str):
    """The items whose name (name_of) matches the regex `rx` of command-line option `option`;
    ValueError naming the option where `rx` is malformed or matches none (with the names it could)."""
    try:
        pattern = re.compile(rx)
    except re.error as e:
        raise ValueError(f"{option} {rx!r}: not a regular expression ({e})") from None
    picked = [i for i in items if pattern.search(name_of(i))]
    if not picked:
        names = ", ".join(dict.fromkeys(name_of(i) for i in items))
        raise ValueError(f"{option} {rx!r} matches none of: {names}")
    return picked


def paged_cases(shapes_re, pairs_re, pages, pairs, shapes=SHAPES):
    """bench_paged.py's cases: (shape, (K, V) storage pair, page tokens) for the shapes whose name matches
    `shapes_re`, the pairs whose "K/V" matches `pairs_re`, and the page sizes that divide the shape's T
    (returned second: the (shape, P) pairs left out for that). ValueError naming the option at fault
    where a page size is not one decode-tc reads (a power of two >= 16), a regex is malformed or
    matches nothing (select), or no case is left."""
    bad = [P for P in pages if P < 16 or P & (P - 1)]
    if bad:
        raise ValueError(f"--pages {' '.join(map(str, bad))}: decode-tc reads pages of a power of two >= 16 tokens")
    picked = select("--shapes", shapes_re, shapes, lambda s: s.name)
    chosen = select("--pairs", pairs_re, pairs, lambda p: f"{p[0]}/{p[1]}")
    cases = [(s, p, P) for s in picked for p in chosen for P in pages if s.T % P == 0]
    left_out = [(s, P) for s in picked for P in pages if s.T % P]
    if not cases:
        raise ValueError(f"--pages {' '.join(map(str, pages))}: no page size divides a chosen shape's T "
                         f"({', '.join(sorted({str(s.T) for s in picked}, key=int))})")
    return cases, left_out


def flashinfer_pages(T, page=FLASHINFER_PAGE):
    """(pages per sequence, tokens in its last page): FlashInfer's last_page_len is 1..page."""
    if T < 1:
        raise ValueError(f"FlashInfer pages: T={T}, a sequence needs at least one key")
    pages = -(-T // page)
    return pages, T - page * (pages - 1)


def flashinfer_tensor_cores(shape):
    """FlashInfer's tensor-core decode (its prefill kernel with one query row per sequence) when several
    query heads share a KV head, its CUDA-core decode kernel for MHA."""
    return shape.HQ > shape.HKV


def fbgemm_skip_reason(shape):
    """None when gqa_attn_splitk takes the shape, else why not (one line)."""
    why = []
    if shape.HKV != 1:
        why.append(f"Hkv={shape.HKV} (it takes 1 KV head)")
    if shape.D != 128:
        why.append(f"D={shape.D} (it takes 128)")
    if shape.T > FBGEMM_MAX_T:
        why.append(f"T={shape.T} (it takes at most {FBGEMM_MAX_T})")
    return ", ".join(why) or None


def fbgemm_splits(T, candidates=FBGEMM_SPLITS):
    """The split counts to try at T keys: each split keeps at least one key."""
    bad = [s for s in candidates if s < 1]
    if bad:
        raise ValueError(f"FBGEMM split counts must be >= 1, got {bad[0]}")
    return sorted({s for s in candidates if s <= max(T, 1)})


def fbgemm_row_bytes(head_dim, groups):
    """One token's row: `groups` fp16 (scale, shift) pairs, then head_dim/2 bytes of packed codes."""
    if head_dim % 2 or groups < 1 or head_dim % groups:
        raise ValueError(f"FBGEMM rows: D={head_dim} with {groups} groups is not a valid row")
    return head_dim // 2 + 4 * groups


def q_o_bytes(shape):
    """Q read and O written, bf16."""
    return 2 * 2 * shape.B * shape.HQ * shape.D


def bf16_bytes(shape):
    """Bytes one bf16 decode moves: K and V read once, Q and O."""
    return 2 * shape.B * shape.HKV * shape.T * shape.D * 2 + q_o_bytes(shape)


def fbgemm_bytes(shape, groups):
    """Bytes one FBGEMM INT4 decode moves: K and V rows with their inline scale/shift, Q and O (the
    split partials are the kernel's scratch, as kvq's are; kvq's decode_bytes_moved counts the same
    rows and also its 4-byte LSE per query head, which FBGEMM does not return)."""
    return 2 * shape.B * shape.HKV * shape.T * fbgemm_row_bytes(shape.D, groups) + q_o_bytes(shape)


def flashinfer_bytes(shape, kv_bytes):
    """Bytes one FlashInfer decode moves: the live K and V elements at kv_bytes each, Q and O (not the
    page table, 4 bytes per page, nor split-KV scratch; with T a multiple of the page size no page holds
    a dead token)."""
    return 2 * shape.B * shape.HKV * shape.T * shape.D * kv_bytes + q_o_bytes(shape)


def input_sets(set_bytes, l2_bytes, memory_bytes):
    """Rotating input sets so that the working set is >= 4x L2 (one set when that would not fit in
    60% of the device memory, or when one set already does it)."""
    sets = max(1, -(-4 * l2_bytes // max(set_bytes, 1)))
    return 1 if sets * set_bytes > 0.6 * memory_bytes else sets


def percentile(values, q):
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


@dataclass(frozen=True)
class Machine:
    gpu: str
    driver: str
    cuda: str
    commit: str
    read_gbps: float  # read-only bandwidth measured in the same process
    copy_gbps: float  # device-to-device copy (read + write)


def make_row(shape, kernel, scheme, us, *, splits, calls_per_graph, sets, nbytes, machine, cudnn_us=None):
    """One CSV row in kvq bench's schema from the per-call times `us` (layout "fbgemm-rows" for FBGEMM's
    inline-row cache, as kvq's ":fbgemm" storages)."""
    if not us:
        raise ValueError(f"{shape.name} B={shape.B} {kernel}: no timings")
    med = statistics.median(us)
    gbps = nbytes / (med * 1e3)
    row = {"shape": shape.name, "B": shape.B, "HQ": shape.HQ, "HKV": shape.HKV, "T": shape.T, "D": shape.D,
           "kernel": kernel, "k_scheme": scheme, "v_scheme": scheme,
           "layout": "fbgemm-rows" if kernel.startswith("fbgemm") else "", "splits": splits if splits else "",
           "heads_per_cta": "", "median_us": f"{med:.3f}", "p10_us": f"{percentile(us, 0.1):.3f}",
           "p90_us": f"{percentile(us, 0.9):.3f}", "reps": len(us), "calls_per_graph": calls_per_graph,
           "input_sets": sets, "bytes": nbytes, "GBps": f"{gbps:.1f}",
           "pct_of_read": f"{100 * gbps / machine.read_gbps:.2f}", "read_GBps": f"{machine.read_gbps:.1f}",
           "copy_GBps": f"{machine.copy_gbps:.1f}", "vs_cudnn": f"{med / cudnn_us:.3f}" if cudnn_us else "",
           "floor_us": "", "gpu": machine.gpu, "driver": machine.driver, "cuda": machine.cuda, "commit": machine.commit}
    return row
