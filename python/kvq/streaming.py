"""Quantize-on-append: a K or V cache quantized token by token, as an inference engine writes it."""
import numpy as np

from . import _core


class AppendQuantizer:
    """One K or V cache [B, H, T, D] whose tokens are quantized as they are appended.

    Per-token, per-head and per-group (g<G>) schemes quantize each appended token at once: their
    groups never span tokens, so the codes equal those of quantizing the whole cache in one call.
    chan-t<N> (KIVI-style, per channel over N tokens) quantizes a group of N tokens when its N-th
    token arrives; until then those tokens stay as they were given (full precision). A +w<W> window
    quantizes a token only once W newer tokens follow it (chan-t<N>: whole groups), which gives the
    codes of quantizing the whole cache with the window. Scale-free FP8 converts each token at once.
    +had stores the rotated tokens; append() returns them rotated back to the input basis (in
    float64, H being its own inverse), which gives attention the same Q.K and P.V as rotating the
    query and the output would, so the model needs no change. A per-tensor scale needs the finished
    cache, so per-tensor schemes and nvfp4 (its s_t) take a calibrated one as `tensor_scale` (as
    engines keep a calibrated k_scale / v_scale for an FP8 cache) and are refused without it; then
    each token quantizes at once with that scale. The block formats (q8_0 ... nvfp4) quantize each
    token at once.
    """

    def __init__(self, scheme, name="cache", tensor_scale=None):
        self.scheme = scheme if isinstance(scheme, _core.Scheme) else _core.parse_scheme(scheme)
        # The scheme each quantized run of tokens is quantized with: the window only decides when.
        self._base = self.scheme.without_window
        if self.scheme.granularity == "tensor" and self.scheme.asymmetric:
            raise _core.SchemeError(f"{self.scheme.name}: a per-tensor zero point needs the whole cache, which "
                                    "quantize-on-append does not have; use a symmetric or a finer-grained scheme")
        needs_scale = self.scheme.format == "nvfp4" or (self.scheme.granularity == "tensor" and not self.scheme.scale_free)
        if needs_scale and tensor_scale is None:
            raise _core.SchemeError(f"{self.scheme.name}: its per-tensor scale needs the whole cache, which quantize-on-"
                                    "append does not have; give a calibrated tensor_scale ("
                                    + ("amax / (6 * 448))" if self.scheme.format == "nvfp4" else "e.g. amax / FMAX or qmax)"))
        if not needs_scale and tensor_scale is not None:
            raise _core.SchemeError(f"{self.scheme.name}: tensor_scale is given, but only nvfp4 and per-tensor schemes "
                                    "have one")
        self.tensor_scale = tensor_scale
        self.name = name
        self.tokens = 0       # tokens appended so far
        self._pending = None  # appended tokens not quantized yet (chan-t<N>), as given
        self._chunks = []     # QuantizeResult of each quantized run of tokens, in token order

    @property
    def quantized_tokens(self):
        return self.tokens - (0 if self._pending is None else self._pending.shape[2])

    def append(self, x):
        """Appends x [B, H, t, D] (float16/32/64; float64 is rounded to float32 for the codec).

        Returns (start, values): the cache's tokens start .. self.tokens - 1 as attention should read
        them now, values [B, H, self.tokens - start, D]: dequantized where quantized, as given where
        pending. start is the first new token, or earlier when a chan-t<N> group just filled and
        its pending tokens were replaced by their quantized values."""
        x = np.asarray(x)
        if x.ndim != 4:
            raise _core.InputError(f"{self.name}: expected new tokens [B, H, t, D], got shape {list(x.shape)}")
        if not (np.issubdtype(x.dtype, np.floating) or x.dtype.name == "bfloat16"):  # as kvq.quantize takes them
            raise _core.InputError(f"{self.name}: new tokens of dtype {x.dtype}, expected a float type (float16, "
                                   "bfloat16, float32, float64)")
        if self._pending is not None and (x.shape[:2] != self._pending.shape[:2] or x.shape[3] != self._pending.shape[3]):
            raise _core.InputError(f"{self.name}: appended tokens have shape {list(x.shape)}, the cache has "
                                   f"[B, H, D] = {[*self._pending.shape[:2], self._pending.shape[3]]}")
        start = self.quantized_tokens
        pending = x if self._pending is None else np.concatenate([self._pending, x], axis=2)
        total = self.tokens + x.shape[2]
        quantizable = total if self.scheme.window is None else max(0, total - self.scheme.window)
        if self.scheme.granularity == "channel":
            quantizable = quantizable // self.scheme.group * self.scheme.group
        ready = quantizable - start
        values = np.empty(pending.shape, np.result_type(x.dtype, np.float32))
        if ready:
            chunk = _core.quantize(pending[:, :, :ready], self._base, tensor_scale=self.tensor_scale,
                                   name=f"{self.name} (tokens {start}..{start + ready - 1}, t counted from {start})")
            self._chunks.append(chunk)
            values[:, :, :ready] = (_core.hadamard_rotate_back(chunk.dequantized,
                                                               self.scheme.rotation_block(x.shape[-1]))
                                    if self.scheme.hadamard else chunk.dequantized)
        values[:, :, ready:] = pending[:, :, ready:]
        self._pending = pending[:, :, ready:].copy()
        self.tokens += x.shape[2]
        return start, values

    def result(self):
        """The quantized tokens so far as one QuantizeResult (None before any): the codes, scales
        and zero points that quantizing those tokens in one call gives (with the scheme less its
        window: the window's tokens are not among them)."""
        if not self._chunks:
            return None
        scale_axis = 1 if self.scheme.granularity == "token" else 2  # token scales are [B, T]
        codes = np.concatenate([c.codes for c in self._chunks], axis=2)
        if self.scheme.scale_free or self.scheme.granularity == "tensor":
            scales = self._chunks[0].scales  # empty, or the one given scale
        else:
            scales = np.concatenate([c.scales for c in self._chunks], axis=scale_axis)
        zeros = None
        if self.scheme.asymmetric:
            zeros = np.concatenate([c.zero_points for c in self._chunks], axis=scale_axis)
        return _core.QuantizeResult(codes, scales, zeros, scheme=self._base,
                                    tensor_scale=self.tensor_scale if self.scheme.format == "nvfp4" else None)


class FloatStorage:
    """A cache kept in a float format instead: 'fp32', 'fp16' or 'bf16' round each appended token
    to it (round to nearest even, through float32); 'none' keeps the values exactly as given."""

    BITS = {"fp32": 32, "fp16": 16, "bf16": 16}

    def __init__(self, name):
        if name not in ("none", *self.BITS):
            raise _core.SchemeError(f"unknown cache storage '{name}': expected none, fp32, fp16, bf16 or a kvq scheme")
        self.name = name
        self.tokens = 0

    def append(self, x):
        """Same contract as AppendQuantizer.append: (start, values) of the new tokens."""
        x = np.asarray(x)
        start, self.tokens = self.tokens, self.tokens + x.shape[2]
        if self.name == "none":
            return start, x
        return start, _core.round_to_format(x, self.name).astype(np.result_type(x.dtype, np.float32))


def cache_storage(name, cache_name="cache"):
    """What a K or V cache keeps: 'none', 'fp32', 'fp16', 'bf16' (FloatStorage) or a kvq scheme
    name (AppendQuantizer). Both have append(x) -> (start, values)."""
    if name == "none" or name in FloatStorage.BITS:
        return FloatStorage(name)
    return AppendQuantizer(name, cache_name)
