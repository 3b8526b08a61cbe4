"""kvq.gate's devices: how the arrays of a case reach a kernel and how its outputs come back. Every
array a kernel gets passes through one put() (numpy on the CPU, torch tensors on the CPU or a GPU) and
every output through get(); the poison of padding, strided views and inflated caches is laid here.
"""
import numpy as np

from .gate_cases import STRIDE_PAD


def contiguous(a):
    """A C-contiguous copy or view of `a`; 0-dim stays 0-dim (np.ascontiguousarray makes it 1-dim)."""
    return np.ascontiguousarray(a) if np.ndim(a) else np.array(a)


def pad_fill(dtype, kind):
    """What the padding of a strided view or an inflated cache holds: NaN (or a finite 8.0) in float
    arrays, garbage bytes in integer ones."""
    if np.issubdtype(np.dtype(dtype), np.floating):
        return np.nan if kind == "nan" else 8.0
    return 0x7E if kind == "nan" else 0x35


def strided_shape(a):
    """The buffer a strided view of `a` lives in: its last axis STRIDE_PAD elements longer."""
    return a.shape[:-1] + (a.shape[-1] + STRIDE_PAD,)


class CpuDevice:
    """The CPU device: numpy arrays, read-only (a kernel must not write its inputs). Every array a
    kernel gets passes through put() and every output through get(); `values_format` names the float
    format a float32 array holds ("bf16", "fp16"), which a GPU device would allocate it in. strided:
    a view with padded rows (the strided family; the padding holds `kind`'s poison)."""
    name = "cpu"

    @staticmethod
    def put(a, values_format=None, strided=False, kind="nan"):
        if a is None:
            return None
        a = contiguous(a)
        if strided and a.ndim >= 2 and a.size:
            buf = np.full(strided_shape(a), pad_fill(a.dtype, kind), a.dtype)
            buf[..., :a.shape[-1]] = a
            a = buf[..., :a.shape[-1]]
        a.setflags(write=False)
        return a

    @staticmethod
    def get(x):
        return np.asarray(x)

    @staticmethod
    def put_inflated(a, values_format, axis, length, at_end, kind):
        """As TorchDevice.put_inflated (the tests shrink HUGE_OFFSET to run the huge_cache family here)."""
        a = contiguous(a)
        shape = list(a.shape)
        shape[axis] = length
        big = np.full(shape, pad_fill(a.dtype, kind), a.dtype)
        index = [slice(None)] * a.ndim
        index[axis] = slice(length - a.shape[axis], length) if at_end else slice(0, a.shape[axis])
        big[tuple(index)] = a
        big.setflags(write=False)
        return big

    @staticmethod
    def free_bytes():  # no device memory: the huge_cache family does not run here
        return None


class TorchDevice:
    """torch tensors on `where`. Float arrays holding bf16 / fp16 values are allocated in that dtype
    (Q, raw K/V), the rest keep their numpy dtype (codes, scales, lengths, slopes)."""
    where = "cpu"

    @classmethod
    def put(cls, a, values_format=None, strided=False, kind="nan"):
        if a is None:
            return None
        import torch
        t = torch.from_numpy(contiguous(a)).to(cls.where)
        if values_format in ("bf16", "fp16"):
            t = t.to(torch.bfloat16 if values_format == "bf16" else torch.float16)
        if strided and t.dim() >= 2 and t.numel():
            buf = torch.full(strided_shape(t), pad_fill(a.dtype, kind), dtype=t.dtype, device=t.device)
            buf[..., :t.shape[-1]] = t
            t = buf[..., :t.shape[-1]]
        return t

    @classmethod
    def put_inflated(cls, a, values_format, axis, length, at_end, kind):
        """`a` placed in a tensor whose `axis` is `length` long, the rest poisoned: at its start
        (at_end False: tokens past T) or its end (True: pages before the pool's)."""
        import torch
        t = cls.put(a, values_format)
        shape = list(t.shape)
        shape[axis] = length
        big = torch.full(shape, pad_fill(a.dtype, kind), dtype=t.dtype, device=t.device)
        big.narrow(axis, length - t.shape[axis] if at_end else 0, t.shape[axis]).copy_(t)
        return big

    @staticmethod
    def get(x):
        import torch
        if isinstance(x, torch.Tensor):
            x = x.detach()
            return (x.float() if x.is_floating_point() and x.dtype != torch.float64 else x).cpu().numpy()
        return np.asarray(x)

    @staticmethod
    def why_unavailable():
        try:
            import torch  # noqa: F401
        except ImportError:
            return "device 'cuda' (or 'torch-cpu') hands kernels torch tensors: torch is not installed"
        return ""

    @staticmethod
    def free_bytes():
        return None


class TorchCpuDevice(TorchDevice):
    """torch CPU tensors: for torch kernels on a machine without a GPU."""
    name = "torch-cpu"


class CudaDevice(TorchDevice):
    """The GPU device: torch CUDA tensors."""
    name, where = "cuda", "cuda"

    @staticmethod
    def why_unavailable():
        why = TorchDevice.why_unavailable()
        if why:
            return why
        import torch
        return "" if torch.cuda.is_available() else "device 'cuda': torch sees no CUDA device"

    @staticmethod
    def free_bytes():
        import torch
        return torch.cuda.mem_get_info()[0]


DEVICES = {"cpu": CpuDevice, "cuda": CudaDevice, "torch-cpu": TorchCpuDevice}
