#include "experiments/common/decode_shapes.hpp"

#include <fmt/format.h>

#include <regex>

#include "quant/errors.hpp"

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

std::vector<DecodeShape> design_decode_shapes(const std::string& regex, const std::string& option) {
  std::regex re;
  try {
    re = std::regex(regex);
  } catch (const std::regex_error& e) {
    throw InputError(fmt::format("{} '{}': not a valid regular expression ({})", option, regex, e.what()));
  }
  std::vector<DecodeShape> out;
  for (const DecodeShape& s : design_decode_shapes())
    if (std::regex_search(s.label(), re)) out.push_back(s);
  if (out.empty())
    throw InputError(fmt::format("{} '{}' matches none of the shapes (seed000, seed002, llama8b, smollm2; a label "
                                 "reads seed000/B128/T8192)", option, regex));
  return out;
}

}  // namespace kvq
