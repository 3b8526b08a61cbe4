// One case of the decode gate (kvq validate): how K and V are stored (raw or by the CPU codec), where
// the cache's rows lie (packed, strided, past 2^31 elements, in shuffled pages), and the operands put
// on the device with every position the kernel must not read poisoned.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "experiments/common/decode_shapes.hpp"
#include "experiments/gate/paged_cache.hpp"
#include "gpu/decode.hpp"
#include "gpu/device.hpp"
#include "quant/scheme.hpp"

namespace kvq::gate_case {

// How K and V are stored for a case: each raw bf16/fp16 (BNSH or BSNH) or quantized by the CPU codec.
struct Storage {
  KvFormat k_format = KvFormat::kBf16, v_format = KvFormat::kBf16;
  std::optional<Scheme> k, v;  // the quantized operands
  bool bsnh = false;           // raw operands only

  std::string name() const {
    if (!k && !v && k_format == v_format) return fmt::format("{} {}", to_string(k_format), bsnh ? "BSNH" : "BNSH");
    auto one = [](const std::optional<Scheme>& s, KvFormat f) { return s ? to_string(*s) : std::string(to_string(f)); };
    return fmt::format("K {} / V {}{}", one(k, k_format), one(v, v_format),
                       k_format == KvFormat::kInt4Fbgemm ? " FBGEMM" : "");
  }
  std::string formats() const {
    return k_format == v_format ? to_string(k_format) : fmt::format("{}/{}", to_string(k_format), to_string(v_format));
  }
};

// Where the cache's rows lie (kvq.gate's strided, huge_cache and paged families): packed BNSH; rows
// kStridePad bytes apart; a token capacity that puts the last sequence's first key past 2^31
// elements; or pages of Case::page_tokens shuffled through a pool (paged_cache.hpp: codes NHD,
// per-row parameters head-major in their pages).
enum class Placement { kPacked, kStrided, kHuge, kPaged };
constexpr int64_t kStridePad = 16;  // 16: the kernels' 16-byte loads stay aligned
constexpr int64_t kHugeOffset = int64_t{1} << 31;

struct Case {
  std::string name;
  DecodeShape shape;
  std::vector<int32_t> seq_lens;  // empty: all T
  bool alibi = false;
  Storage storage;
  int splits = 0;  // forced (split-K variants); 0: the heuristic
  Placement placement = Placement::kPacked;
  std::vector<int64_t> broken = {};  // sequences whose rows are not judged (kvq.gate's nonfinite family)
  int page_tokens = 0;               // Placement::kPaged
};

// One of K or V on the device, and the values the reference sees (dequantized, padding zeroed).
struct DeviceOperand {
  DeviceBuffer<uint8_t> codes, scales, zeros, window_values, tensor_scale;
  KvOperand op;
  KvWindow window;  // +wW: the raw tokens (bf16, NaN outside the window)
  std::vector<float> reference_values;  // BNSH
};

// The cache's token capacity as placed: T, or the T at which the first key of the last (sequence,
// KV head) starts past kHugeOffset elements.
int64_t placed_tokens(const Case& c);
std::vector<float> random_normal(size_t n, uint32_t seed, int64_t head_dim, float outlier = 12.0f);
int64_t seq_len(const Case& c, int64_t b);
std::vector<int64_t> lengths(const Case& c);
bool has_window(const Storage& st);
// Each sequence's first token that K's or V's +wW window keeps raw: where its window pages begin.
std::vector<int64_t> first_window_tokens(const Case& c);
// Padding rows (t >= seq_len) get garbage codes and NaN parameters on the device (raw: NaN
// values): the kernel must never read them into the output. So do a +wW scheme's window rows in
// the codes, and every row outside the window in its raw values.
DeviceOperand make_operand(const Case& c, std::vector<float> x, const std::optional<Scheme>& scheme, KvFormat format,
                           const Paging* paging = nullptr, const Paging* window_paging = nullptr);

}  // namespace kvq::gate_case
