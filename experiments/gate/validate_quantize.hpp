// The adoption gate for quantize variants: every case compares the GPU bytes with the CPU
// quantizer's (codes, scales, zero points, FBGEMM rows), or the GPU error message with the CPU's.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpu/registry.hpp"
#include "quant/kv_tensor.hpp"

namespace kvq {

struct CaseResult {
  std::string variant, name, scheme, dtype, layout, shape, detail;
  int64_t values = 0;
  bool ok = false;
  bool skipped = false;  // the variant does not support the case (detail says why); not a failure
};

struct ValidateOptions {
  bool quick = false;  // small shapes only (for compute-sanitizer)
  int reruns = 250;
  std::string bundled_dump;  // a real dump (the bundled one, or --dump); empty: no real-dump cases
};

// Runs every case the variant supports; `report` is called after each case (for [OK]/[FAIL] lines).
std::vector<CaseResult> validate_quantize_variant(const QuantizeVariant& v, const ValidateOptions& options,
                                                  const std::function<void(const CaseResult&)>& report);

nlohmann::json to_json(const CaseResult& r);

// A CPU-quantized tensor in the bytes the GPU kernels write and read (planar codes, scales and
// zero points in the scale dtype; or FBGEMM rows in `codes`).
GpuQuantized device_bytes(const QuantizedKv& q, CodeLayout layout);

}  // namespace kvq
