#include "experiments/common/decode_shapes.hpp"

#include <fmt/format.h>

namespace kvq {

std::string DecodeShape::label() const { return fmt::format("{}/B{}/T{}", group, batch, tokens); }

std::vector<DecodeShape> design_decode_shapes() {
  std::vector<DecodeShape> shapes;
  for (int64_t b : {32, 64, 128, 256, 512}) shapes.push_back({"seed000", b, 8, 1, 8192, 128});
  shapes.push_back({"seed002", 1, 32, 8, 1024, 128});
  for (int64_t b : {1, 8, 64})
    for (int64_t t : {1024, 8192, 32768})
      if (!(b == 64 && t == 32768)) shapes.push_back({"llama8b", b, 32, 8, t, 128});
  // The real model of the main job (SmolLM2-135M): GQA 3, head_dim 64.
  for (int64_t b : {1, 8, 64})
    for (int64_t t : {1024, 8192}) shapes.push_back({"smollm2", b, 9, 3, t, 64});
  return shapes;
}

}  // namespace kvq
