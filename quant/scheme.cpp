#include "quant/scheme.hpp"

#include <fmt/format.h>

#include <charconv>

namespace kvq {
namespace {

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
      "unknown scheme '{}': {} (expected int8|int4 - tensor|token|head|g<G>|chan-t<N> "
      "[-sym|-asym] [-fp16|-fp32], e.g. int4-g32-asym)",
      name, why));
}

}  // namespace

Scheme parse_scheme(std::string_view name) {
  const std::vector<std::string_view> parts = split(name, '-');
  Scheme s;
  if (parts[0] == "int8") {
    s.bits = 8;
  } else if (parts[0] == "int4") {
    s.bits = 4;
  } else {
    bad(name, fmt::format("bits '{}' must be int8 or int4", parts[0]));
  }
  if (parts.size() < 2) bad(name, "missing granularity");

  size_t next = 2;
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
    next = 3;
  } else {
    bad(name, fmt::format("granularity '{}' is not tensor, token, head, g<G> or chan-t<N>", gran));
  }

  bool seen_symmetry = false, seen_dtype = false;
  for (; next < parts.size(); ++next) {
    const std::string_view p = parts[next];
    if ((p == "sym" || p == "asym") && !seen_symmetry) {
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

std::string to_string(const Scheme& s) {
  std::string gran;
  switch (s.granularity) {
    case Granularity::kTensor: gran = "tensor"; break;
    case Granularity::kToken: gran = "token"; break;
    case Granularity::kHead: gran = "head"; break;
    case Granularity::kGroup: gran = fmt::format("g{}", s.group); break;
    case Granularity::kChannel: gran = fmt::format("chan-t{}", s.group); break;
  }
  return fmt::format("int{}-{}{}{}", s.bits, gran, s.asymmetric ? "-asym" : "",
                     s.scale_dtype == ScaleDtype::kFp32 ? "-fp32" : "");
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

std::vector<Scheme> parse_scheme_list(std::string_view names) {
  std::vector<Scheme> schemes;
  for (std::string_view name : split(names, ',')) {
    if (name.empty()) throw SchemeError(fmt::format("empty scheme name in list '{}'", names));
    schemes.push_back(parse_scheme(name));
  }
  return schemes;
}

void check_scheme_fits(const Scheme& s, int head_dim) {
  if (head_dim <= 0) throw SchemeError(fmt::format("{}: head_dim must be positive, got {}", to_string(s), head_dim));
  if (s.granularity == Granularity::kGroup && head_dim % s.group != 0)
    throw SchemeError(fmt::format("{}: group size {} does not divide head_dim {}", to_string(s), s.group, head_dim));
  if (s.bits == 4 && head_dim % 2 != 0)
    throw SchemeError(fmt::format("{}: int4 packs two codes per byte and needs an even head_dim, got {}",
                                  to_string(s), head_dim));
}

}  // namespace kvq
