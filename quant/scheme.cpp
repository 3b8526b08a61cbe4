#include "quant/scheme.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "quant/block_formats.hpp"

namespace kvq {
namespace {

// The block formats by name; each is the group granularity with its block as the group.
struct BlockName {
  const char* name;
  CodeFormat format;
  int bits;
  bool has_min;  // q4_1 / q5_1 store a min beside the scale: kvq's zero point, hence "asymmetric"
  ScaleDtype scale_dtype;
};
constexpr BlockName kBlockNames[] = {
    {"q8_0", CodeFormat::kQ8_0, 8, false, ScaleDtype::kFp16},
    {"q4_0", CodeFormat::kQ4_0, 4, false, ScaleDtype::kFp16},
    {"q4_1", CodeFormat::kQ4_1, 4, true, ScaleDtype::kFp16},
    {"q5_0", CodeFormat::kQ5_0, 5, false, ScaleDtype::kFp16},
    {"q5_1", CodeFormat::kQ5_1, 5, true, ScaleDtype::kFp16},
    {"iq4_nl", CodeFormat::kIq4Nl, 4, false, ScaleDtype::kFp16},
    {"mxfp4", CodeFormat::kMxfp4, 4, false, ScaleDtype::kE8M0},
    {"nvfp4", CodeFormat::kNvfp4, 4, false, ScaleDtype::kE4M3},
};

const BlockName* find_block_name(std::string_view name) {
  for (const BlockName& b : kBlockNames)
    if (name == b.name) return &b;
  return nullptr;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos) return parts;
    start = pos + 1;
  }
}

// A positive decimal integer, or -1.
int parse_positive(std::string_view digits) {
  int value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size() || value <= 0) return -1;
  return value;
}

[[noreturn]] void bad(std::string_view name, std::string_view why) {
  throw SchemeError(fmt::format(
      "unknown scheme '{}': {} (expected int8|int4 - tensor|token|head|g<G>|chan-t<N> [-sym|-asym] [-fp16|-fp32], "
      "or fp8-e4m3|fp8-e5m2 [- tensor|token|head|g<G> [-fp16|-fp32]], or q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl|mxfp4|nvfp4, "
      "then optionally +had and +w<W>, e.g. int4-g32-asym, fp8-e4m3-head, int4-chan-t32-asym+w128, q4_0+had)",
      name, why));
}

// The granularity at parts[1] (and parts[2] for chan-tN); returns the index of the first suffix.
size_t parse_granularity(std::string_view name, const std::vector<std::string_view>& parts, Scheme& s) {
  const std::string_view gran = parts[1];
  if (gran == "tensor") {
    s.granularity = Granularity::kTensor;
  } else if (gran == "token") {
    s.granularity = Granularity::kToken;
  } else if (gran == "head") {
    s.granularity = Granularity::kHead;
  } else if (gran.size() > 1 && gran[0] == 'g') {
    s.granularity = Granularity::kGroup;
    s.group = parse_positive(gran.substr(1));
    if (s.group < 0) bad(name, fmt::format("group size in '{}' must be a positive integer", gran));
  } else if (gran == "chan") {
    s.granularity = Granularity::kChannel;
    if (parts.size() < 3 || parts[2].size() < 2 || parts[2][0] != 't')
      bad(name, "per-channel needs a token group, e.g. chan-t32");
    s.group = parse_positive(parts[2].substr(1));
    if (s.group < 0) bad(name, fmt::format("token group in '{}' must be a positive integer", parts[2]));
    return 3;
  } else {
    bad(name, fmt::format("granularity '{}' is not tensor, token, head, g<G> or chan-t<N>", gran));
  }
  return 2;
}

// "int8-head-asym" or "fp8-e4m3-g32-fp32" or "fp8-e5m2" (no modifiers).
Scheme parse_base(std::string_view name, std::string_view base) {
  const std::vector<std::string_view> parts = split(base, '-');
  Scheme s;
  size_t next = 2;
  if (const BlockName* b = find_block_name(parts[0])) {
    if (parts.size() > 1)
      bad(name, fmt::format("the block format {} takes no suffixes (its block, scale and rounding are fixed); "
                            "modifiers follow '+', e.g. {}+had", b->name, b->name));
    s.format = b->format;
    s.bits = b->bits;
    s.granularity = Granularity::kGroup;
    s.group = block_elements(b->format);
    s.asymmetric = b->has_min;
    s.scale_dtype = b->scale_dtype;
    return s;
  }
  if (parts[0] == "fp8") {
    if (parts.size() < 2 || (parts[1] != "e4m3" && parts[1] != "e5m2"))
      bad(name, fmt::format("FP8 needs its format, e4m3 or e5m2, e.g. fp8-e4m3-head; got '{}'",
                            parts.size() < 2 ? "" : parts[1]));
    s.format = parts[1] == "e4m3" ? CodeFormat::kFp8E4M3 : CodeFormat::kFp8E5M2;
    if (parts.size() == 2) {  // scale-free
      s.granularity = Granularity::kTensor;
      s.scale_free = true;
      return s;
    }
    const std::vector<std::string_view> rest(parts.begin() + 1, parts.end());  // rest[1]: the granularity
    next = parse_granularity(name, rest, s) + 1;
    if (s.granularity == Granularity::kChannel)
      bad(name, "FP8 schemes take tensor, token, head or g<G> scales, not per-channel chan-t<N>");
  } else if (parts[0] == "int8" || parts[0] == "int4") {
    s.bits = parts[0] == "int8" ? 8 : 4;
    if (parts.size() < 2) bad(name, "missing granularity");
    next = parse_granularity(name, parts, s);
  } else {
    bad(name, fmt::format("bits '{}' must be int8, int4 or fp8 (or a block format: q8_0, q4_0, q4_1, q5_0, q5_1, "
                          "iq4_nl, mxfp4, nvfp4)", parts[0]));
  }

  bool seen_symmetry = false, seen_dtype = false;
  for (; next < parts.size(); ++next) {
    const std::string_view p = parts[next];
    if ((p == "sym" || p == "asym") && !seen_symmetry) {
      if (p == "asym" && s.fp8()) bad(name, "FP8 schemes are symmetric (scale = amax / FMAX); '-asym' is not available");
      s.asymmetric = p == "asym";
      seen_symmetry = true;
    } else if ((p == "fp16" || p == "fp32") && !seen_dtype) {
      s.scale_dtype = p == "fp16" ? ScaleDtype::kFp16 : ScaleDtype::kFp32;
      seen_dtype = true;
    } else {
      bad(name, fmt::format("unexpected or repeated suffix '{}'", p));
    }
  }
  return s;
}

}  // namespace

Scheme parse_scheme(std::string_view name) {
  const std::vector<std::string_view> parts = split(name, '+');
  Scheme s = parse_base(name, parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string_view m = parts[i];
    const bool rotation = m.substr(0, 3) == "had" &&
                          std::all_of(m.begin() + 3, m.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (rotation && !s.hadamard) {
      s.hadamard = true;
      if (m.size() > 3) {  // +had<N>: blocks of N elements
        const std::string_view digits = m.substr(3);
        int n = 0;
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
        if (ec != std::errc() || end != digits.data() + digits.size() || n < 2 || (n & (n - 1)) != 0)
          bad(name, fmt::format("rotation block in '+{}' must be a power of two >= 2, e.g. +had64", m));
        s.hadamard_block = n;
      }
    } else if (m.size() > 1 && m[0] == 'w' && !s.has_window()) {
      const std::string_view digits = m.substr(1);
      int w = -1;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), w);
      if (ec != std::errc() || end != digits.data() + digits.size() || w < 0)
        bad(name, fmt::format("window in '+{}' must be a non-negative number of tokens, e.g. +w128", m));
      s.window = w;
    } else {
      bad(name, fmt::format("unexpected or repeated modifier '+{}' (modifiers: +had, +had<N>, +w<W>)", m));
    }
  }
  return s;
}

std::string to_string(const Scheme& s) {
  std::string gran;
  switch (s.granularity) {
    case Granularity::kTensor: gran = "tensor"; break;
    case Granularity::kToken: gran = "token"; break;
    case Granularity::kHead: gran = "head"; break;
    case Granularity::kGroup: gran = fmt::format("g{}", s.group); break;
    case Granularity::kChannel: gran = fmt::format("chan-t{}", s.group); break;
  }
  std::string base;
  if (s.block_format()) {
    for (const BlockName& b : kBlockNames)
      if (b.format == s.format) base = b.name;
  } else if (s.fp8()) {
    const char* f = s.format == CodeFormat::kFp8E4M3 ? "fp8-e4m3" : "fp8-e5m2";
    base = s.scale_free ? f : fmt::format("{}-{}{}", f, gran, s.scale_dtype == ScaleDtype::kFp32 ? "-fp32" : "");
  } else {
    base = fmt::format("int{}-{}{}{}", s.bits, gran, s.asymmetric ? "-asym" : "",
                       s.scale_dtype == ScaleDtype::kFp32 ? "-fp32" : "");
  }
  if (s.hadamard) base += s.hadamard_block > 0 ? fmt::format("+had{}", s.hadamard_block) : "+had";
  if (s.has_window()) base += fmt::format("+w{}", s.window);
  return base;
}

const char* granularity_name(Granularity g) {
  switch (g) {
    case Granularity::kTensor: return "tensor";
    case Granularity::kToken: return "token";
    case Granularity::kHead: return "head";
    case Granularity::kGroup: return "group";
    case Granularity::kChannel: return "channel";
  }
  return "?";
}

const char* scale_dtype_name(ScaleDtype dt) {
  switch (dt) {
    case ScaleDtype::kFp16: return "float16";
    case ScaleDtype::kFp32: return "float32";
    case ScaleDtype::kE8M0: return "e8m0";
    case ScaleDtype::kE4M3: return "e4m3";
  }
  return "?";
}

std::string format_name(const Scheme& s) {
  switch (s.format) {
    case CodeFormat::kInt: return "int";
    case CodeFormat::kFp8E4M3: return "fp8-e4m3";
    case CodeFormat::kFp8E5M2: return "fp8-e5m2";
    default:
      for (const BlockName& b : kBlockNames)
        if (b.format == s.format) return b.name;
  }
  return "?";
}

std::vector<Scheme> parse_scheme_list(std::string_view names) {
  std::vector<Scheme> schemes;
  for (std::string_view name : split(names, ',')) {
    if (name.empty()) throw SchemeError(fmt::format("empty scheme name in list '{}'", names));
    const Scheme s = parse_scheme(name);
    for (const Scheme& earlier : schemes)  // the same scheme twice would give every row of it twice
      if (to_string(earlier) == to_string(s))
        throw SchemeError(fmt::format("scheme '{}' is listed twice in '{}' (as '{}')", name, names, to_string(s)));
    schemes.push_back(s);
  }
  return schemes;
}

void check_scheme_fits(const Scheme& s, int head_dim) {
  if (head_dim <= 0) throw SchemeError(fmt::format("{}: head_dim must be positive, got {}", to_string(s), head_dim));
  if (s.granularity == Granularity::kGroup && head_dim % s.group != 0)
    throw SchemeError(fmt::format("{}: {} size {} does not divide head_dim {}", to_string(s),
                                  s.block_format() ? "block" : "group", s.group, head_dim));
  if (s.bits == 4 && head_dim % 2 != 0)
    throw SchemeError(fmt::format("{}: int4 packs two codes per byte and needs an even head_dim, got {}",
                                  to_string(s), head_dim));
  if (s.hadamard && s.hadamard_block == 0 && (head_dim & (head_dim - 1)) != 0)
    throw SchemeError(fmt::format("{}: the Hadamard rotation (+had) needs a power-of-two head_dim, got {}",
                                  to_string(s), head_dim));
  if (s.hadamard && s.hadamard_block > 0 && head_dim % s.hadamard_block != 0)
    throw SchemeError(fmt::format("{}: the rotation block {} does not divide head_dim {}", to_string(s),
                                  s.hadamard_block, head_dim));
}

}  // namespace kvq
