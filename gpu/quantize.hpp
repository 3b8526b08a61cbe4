// GPU quantization of K/V tensors: the same codec as the CPU (quant/codec.hpp), bit for bit, into
// the planar or the FBGEMM inline-row layout. Host API; kernels live in quantize_*.cu.
#pragma once

#include <cuda_runtime.h>

#include <optional>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "quant/codec.hpp"
#include "quant/float_formats.hpp"
#include "quant/groups.hpp"

namespace kvq {

enum class InputDtype { kFp32, kFp16, kBf16 };
enum class CodeLayout { kPlanar, kFbgemm };
const char* to_string(InputDtype d);
const char* to_string(CodeLayout l);
int element_bytes(InputDtype d);
// x as an input tensor of dtype d holds it (RNE to fp16 / bf16; fp32 unchanged).
inline float round_to_input(float x, InputDtype d) {
  return d == InputDtype::kFp32 ? x : d == InputDtype::kFp16 ? round_to_fp16(x) : round_to_bf16(x);
}

// One quantize call (device pointers). Shapes and strides as in KvView: D contiguous.
struct QuantizeParams {
  Scheme scheme;
  KvShape shape;                        // [B, H, T, D]
  const void* input = nullptr;          // elements of in_dtype
  InputDtype in_dtype = InputDtype::kBf16;
  int64_t stride_b = 0, stride_h = 0, stride_t = 0;  // in elements
  CodeLayout layout = CodeLayout::kPlanar;
  uint8_t* codes = nullptr;             // planar [B, H, T, D*bits/8]; FBGEMM rows [B, T, H, D/2 + 4n]
  void* scales = nullptr;               // planar: [num_groups] in the scale dtype
  void* zeros = nullptr;                // planar, asymmetric: [num_groups] in the scale dtype
  GroupStats* stats = nullptr;          // workspace [num_groups] (variants that need it)
  GroupStats* partials = nullptr;       // workspace for per-tensor reductions [kMaxPartials]
  uint8_t* scratch = nullptr;           // workspace for layout conversion (planar bytes)
  const int32_t* seq_lens = nullptr;    // +wW: [B] on the device (nullptr: all T); the window keeps code 0
  float* rotated = nullptr;             // +had: workspace, the input rotated along D (fp32, BNSH)
  unsigned long long* first_bad = nullptr;       // min flat [B,H,T,D] index of a non-finite input
  unsigned long long* first_overflow = nullptr;  // min group index whose scale overflows
  // nvfp4: the fp32 per-tensor scale s_t [1], written by the launch: the given one, or amax / 2688
  // over the quantized elements (computed on the device).
  float* tensor_scale = nullptr;
  // A given tensor scale: nvfp4's s_t, or a symmetric per-tensor scheme's one scale (kernels then
  // use given_scale_params instead of the statistics, which still find non-finite input).
  bool tensor_scale_given = false;
  float given_tensor_scale = 0.0f;
};

inline constexpr int kMaxPartials = 1024;

// Sizes of a quantized result in bytes.
struct QuantizedSizes {
  int64_t codes = 0, scales = 0, zeros = 0;  // planar: codes, scale and zero arrays; FBGEMM: rows in `codes`
  int64_t tensor_scale = 0;                  // nvfp4: 4 (one fp32); 0 otherwise
};
QuantizedSizes quantized_sizes(const Scheme& s, const KvShape& shape, CodeLayout layout);

// A quantized tensor downloaded from the device: bytes exactly as the kernels wrote them.
struct GpuQuantized {
  std::vector<uint8_t> codes, scales, zeros;
  std::vector<uint8_t> tensor_scale;  // nvfp4: the fp32 s_t's 4 bytes; empty otherwise
};

// The device input of a quantize call: a tensor already on the device, BNSH or BSNH.
struct DeviceKv {
  const void* data;
  InputDtype dtype;
  KvShape shape;
  int64_t stride_b, stride_h, stride_t;
  static DeviceKv bnsh(const void* data, InputDtype dtype, KvShape s) {
    return {data, dtype, s, s.heads * s.tokens * s.head_dim, s.tokens * s.head_dim, s.head_dim};
  }
};

// Where a quantize call writes when the caller owns the outputs (Python's torch tensors): device
// pointers of quantized_sizes' byte counts; zeros only for asymmetric planar schemes.
struct QuantizeOutputs {
  uint8_t* codes = nullptr;
  void* scales = nullptr;
  void* zeros = nullptr;
  float* tensor_scale = nullptr;  // nvfp4
};

// The caller's device memory for a workspace's temporaries (Python: torch's allocator, so that a
// quantize allocates nothing and syncs nothing and can be captured in a CUDA graph): `data` of
// quantize_scratch_bytes bytes, the stream the launch runs on. `status`, when given: the two error
// flags (first non-finite element, first overflowing group; ~0 for none) the caller keeps across
// launches and reads when it chooses (the first two entries of kvq.gpu.new_status's three), in place
// of the workspace's own, which check_flags reads.
struct QuantizeScratch {
  void* data = nullptr;
  cudaStream_t stream = nullptr;
  unsigned long long* status = nullptr;
};
int64_t quantize_scratch_bytes(const Scheme& s, const KvShape& shape, CodeLayout layout);

// Device outputs and workspaces for quantizing one input with one scheme; reusable across launches
// (timing replays the same launch).
class QuantizeWorkspace {
 public:
  // seq_lens (+wW schemes): each sequence's length, checked as the CPU quantizer checks them (they
  // are uploaded: not capturable). outputs: write there instead of buffers of its own (download()
  // then has nothing to return). tensor_scale: a calibrated tensor-wide scale (quantize()'s, in
  // quant/quantize.hpp: nvfp4's s_t or a symmetric per-tensor scheme's scale); nullopt: computed
  // from the input. scratch: the temporaries in the caller's memory (else its own).
  QuantizeWorkspace(const DeviceKv& input, const Scheme& scheme, CodeLayout layout,
                    const std::vector<int32_t>& seq_lens = {}, const QuantizeOutputs* outputs = nullptr,
                    std::optional<float> tensor_scale = std::nullopt, const QuantizeScratch* scratch = nullptr);
  const QuantizeParams& params() const { return params_; }
  // Clears the error flags and poisons the outputs, so that an unwritten byte shows.
  void reset();
  // Throws InputError with the CPU quantizer's message when the last launch flagged non-finite
  // input or a scale overflow, or was given a tensor scale it cannot use (check_given_tensor_scale).
  // (With the caller's status flags, only the tensor scale: the flags are the caller's to read.)
  void check_flags(const std::string& tensor_name, cudaStream_t stream);
  GpuQuantized download() const;
  int64_t bytes_moved() const;  // input read once + codes, scales and zero points written once

 private:
  void check_tensor_scale(const std::string& tensor_name) const;

  DeviceKv input_;
  bool external_outputs_ = false, external_status_ = false;
  cudaStream_t stream_ = nullptr;
  QuantizeParams params_;
  DeviceBuffer<uint8_t> codes_, scales_, zeros_, tensor_scale_;  // the outputs, when not the caller's
  DeviceBuffer<uint8_t> own_scratch_;  // the temporaries, when not in the caller's scratch
  DeviceBuffer<int32_t> seq_lens_;
  unsigned long long* flags_ = nullptr;  // the workspace's two error flags (in the scratch)
};

// Runs `launch` (a registered variant's launch function) in a fresh workspace and checks its
// flags: non-finite input and scale overflow throw InputError with the CPU quantizer's message.
GpuQuantized run_quantize(void (*launch)(const QuantizeParams&, cudaStream_t), const DeviceKv& input,
                          const Scheme& scheme, CodeLayout layout, const std::string& tensor_name,
                          cudaStream_t stream = nullptr, const std::vector<int32_t>& seq_lens = {},
                          std::optional<float> tensor_scale = std::nullopt);

// ---- dequantize -------------------------------------------------------------------------------
// Planar codes back to fp32 values [B, H, T, D] (BNSH, contiguous), element by element through
// quant/planar_codes.hpp: the CPU's dequantize arithmetic, so the same bits. +had: the rotated
// values (what is stored); a +wW window's tokens: the value of code 0 (their own values are the
// caller's). Device pointers; scales / zeros in the scheme's scale dtype as the quantizers store them.
struct DequantizeParams {
  Scheme scheme;
  KvShape shape;
  const uint8_t* codes = nullptr;
  const void* scales = nullptr;       // nullptr for scale-free schemes
  const void* zeros = nullptr;        // asymmetric schemes (q4_1 / q5_1: the min)
  const float* tensor_scale = nullptr;  // nvfp4: s_t [1]
  float* out = nullptr;
};
void launch_dequantize(const DequantizeParams& p, cudaStream_t stream);

// ---- kernels' launch functions (one per variant) ----------------------------------------------
// Generic: any scheme (+had: a rotation pass into p.rotated first; +wW: statistics over the
// quantized tokens, code 0 in the window), any even D, any strides; stats pass (two-pass
// reduction for per-tensor), params pass, encode pass; FBGEMM through a planar scratch and a row
// conversion. The block formats take launch_quantize_blocks.
void launch_quantize_generic(const QuantizeParams& p, cudaStream_t stream);
// The block formats (q8_0 ... nvfp4), planar: one thread per block of 32 (nvfp4 16) elements along
// D, parameters and codes by the scalar codec (quant/block_formats.hpp); nvfp4's tensor scale by a
// deterministic amax reduction first. Reads p.input as it is (quantize-generic rotates first).
void launch_quantize_blocks(const QuantizeParams& p, cudaStream_t stream);
// Fused row-wise: head and gG granularities, D in {64, 128, 256}: one warp per (b, h, t) row
// reads it once, reduces the groups with shuffles and writes codes and scales.
void launch_quantize_rowwarp(const QuantizeParams& p, cudaStream_t stream);
bool rowwarp_supports(const Scheme& s, int64_t head_dim);
// One thread per scale group, or per 32-element segment of a larger one (head and gG, G a multiple
// of 8; above 32, a power-of-two multiple of 32): the per-group codec work done by few lanes, two
// passes over the bytes (the second from L1).
void launch_quantize_groupthread(const QuantizeParams& p, cudaStream_t stream);
bool groupthread_supports(const Scheme& s, int64_t head_dim);

// Per-token (token granularity, D a multiple of 8, planar): a team of 1-32 lanes of one warp per
// (b, t) token, its Hkv x D elements read once into registers in 8-element chunks, reduced with
// xor-shuffles, encoded from the registers.
void launch_quantize_tokenteam(const QuantizeParams& p, cudaStream_t stream);
bool tokenteam_supports(const Scheme& s, int64_t head_dim);
// Per-tensor (tensor granularity, D a multiple of 8, planar): a deterministic two-pass, a partial
// statistics pass into p.partials, then an encode pass whose blocks each merge the partials.
void launch_quantize_tensor2pass(const QuantizeParams& p, cudaStream_t stream);
bool tensor2pass_supports(const Scheme& s, int64_t head_dim);

// The tensor statistics and codes are taken from: for +had schemes the rotated rows in p.rotated
// (fp32, BNSH; quantize-generic writes them), else the input.
QuantizeParams statistics_view(const QuantizeParams& p);

// Statistics of groups [g0, g1) into p.stats (the generic stats pass; also used to describe an
// overflowing group in error messages).
void launch_group_stats(const QuantizeParams& p, int64_t g0, int64_t g1, cudaStream_t stream);

}  // namespace kvq
