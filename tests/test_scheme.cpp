#include <doctest/doctest.h>

#include "quant/scheme.hpp"
#include "test_util.hpp"

using namespace kvq;

TEST_CASE("scheme names parse and print canonically") {
  const char* names[] = {"int8-tensor", "int8-token",  "int8-head",       "int8-g32",      "int4-head-asym",
                         "int4-g32-asym", "int4-chan-t32", "int8-head-fp32", "int4-g8-asym-fp32", "int8-chan-t1-asym"};
  for (const char* name : names) {
    CAPTURE(name);
    CHECK(to_string(parse_scheme(name)) == name);
  }
  const Scheme s = parse_scheme("int4-g32-asym");
  CHECK(s.bits == 4);
  CHECK(s.granularity == Granularity::kGroup);
  CHECK(s.group == 32);
  CHECK(s.asymmetric);
  CHECK(s.scale_dtype == ScaleDtype::kFp16);
  CHECK(to_string(parse_scheme("int8-head-sym-fp16")) == "int8-head");  // defaults are omitted
  CHECK(parse_scheme("int4-chan-t16").granularity == Granularity::kChannel);
  CHECK(parse_scheme_list("int8-head,int4-g32-asym").size() == 2);
}

TEST_CASE("bad scheme names are rejected with the reason") {
  using test::message_of;
  auto msg = [](const char* name) { return message_of<SchemeError>([&] { parse_scheme(name); }); };
  CHECK(msg("int5-head").find("bits 'int5' must be int8 or int4") != std::string::npos);
  CHECK(msg("int8").find("missing granularity") != std::string::npos);
  CHECK(msg("int8-row").find("granularity 'row'") != std::string::npos);
  CHECK(msg("int8-g0").find("group size in 'g0' must be a positive integer") != std::string::npos);
  CHECK(msg("int8-gx").find("group size in 'gx'") != std::string::npos);
  CHECK(msg("int4-chan").find("chan-t32") != std::string::npos);
  CHECK(msg("int4-chan-t0").find("token group in 't0'") != std::string::npos);
  CHECK(msg("int8-head-asym-asym").find("repeated suffix 'asym'") != std::string::npos);
  CHECK(msg("int8-head-bf16").find("unexpected or repeated suffix 'bf16'") != std::string::npos);
  CHECK(message_of<SchemeError>([] { parse_scheme_list("int8-head,,int4-head"); }).find("empty scheme name") !=
        std::string::npos);
}

TEST_CASE("schemes that do not fit a head_dim are rejected") {
  using test::message_of;
  CHECK(message_of<SchemeError>([] { check_scheme_fits(parse_scheme("int4-g48"), 128); }) ==
        "int4-g48: group size 48 does not divide head_dim 128");
  CHECK(message_of<SchemeError>([] { check_scheme_fits(parse_scheme("int4-head"), 7); }).find("even head_dim") !=
        std::string::npos);
  CHECK_NOTHROW(check_scheme_fits(parse_scheme("int4-g32-asym"), 128));
  CHECK_NOTHROW(check_scheme_fits(parse_scheme("int8-g8"), 8));
}
