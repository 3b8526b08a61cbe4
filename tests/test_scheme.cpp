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
  CHECK(msg("int5-head").find("bits 'int5' must be int8, int4 or fp8") != std::string::npos);
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
  CHECK(message_of<SchemeError>([] { parse_scheme_list("int8-head,int4-g32-asym,int8-head-sym"); }) ==
        "scheme 'int8-head-sym' is listed twice in 'int8-head,int4-g32-asym,int8-head-sym' (as 'int8-head')");
  CHECK(parse_scheme_list("int8-head,int8-head-asym,int8-head-fp32").size() == 3);  // three different schemes
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

TEST_CASE("fp8 and modifier names parse and print canonically") {
  const char* names[] = {"fp8-e4m3-tensor", "fp8-e4m3-token",     "fp8-e4m3-head",          "fp8-e5m2-g32",
                         "fp8-e4m3-head-fp32", "fp8-e4m3",        "fp8-e5m2",               "int4-g32-asym+had",
                         "int4-chan-t32-asym+w128", "int8-head+w0", "fp8-e4m3-head+had+w64", "int4-head-asym-fp32+had"};
  for (const char* name : names) {
    CAPTURE(name);
    CHECK(to_string(parse_scheme(name)) == name);
  }
  const Scheme f = parse_scheme("fp8-e5m2-g16-fp32");
  CHECK(f.fp8());
  CHECK(f.format == CodeFormat::kFp8E5M2);
  CHECK(f.bits == 8);
  CHECK(f.granularity == Granularity::kGroup);
  CHECK(f.group == 16);
  CHECK(!f.asymmetric);
  CHECK(f.scale_dtype == ScaleDtype::kFp32);
  const Scheme free = parse_scheme("fp8-e4m3");
  CHECK(free.scale_free);
  CHECK(free.format == CodeFormat::kFp8E4M3);
  const Scheme m = parse_scheme("int4-chan-t32-asym+w128+had");
  CHECK(m.hadamard);
  CHECK(m.window == 128);
  CHECK(to_string(m) == "int4-chan-t32-asym+had+w128");  // modifiers print in one order
  CHECK(to_string(parse_scheme("fp8-e4m3-head-sym")) == "fp8-e4m3-head");
  CHECK(!parse_scheme("int8-head").has_window());
  CHECK(parse_scheme("int8-head") != parse_scheme("int8-head+w0"));
}

TEST_CASE("bad fp8 and modifier names are rejected with the reason") {
  using test::message_of;
  auto msg = [](const char* name) { return message_of<SchemeError>([&] { parse_scheme(name); }); };
  CHECK(msg("fp8").find("FP8 needs its format, e4m3 or e5m2") != std::string::npos);
  CHECK(msg("fp8-e3m4-head").find("got 'e3m4'") != std::string::npos);
  CHECK(msg("fp8-e4m3-head-asym").find("FP8 schemes are symmetric") != std::string::npos);
  CHECK(msg("fp8-e4m3-chan-t32").find("not per-channel chan-t<N>") != std::string::npos);
  CHECK(msg("fp8-e4m3-row").find("granularity 'row'") != std::string::npos);
  CHECK(msg("fp8-e4m3-fp32").find("granularity 'fp32'") != std::string::npos);  // scale-free stores no scale
  CHECK(msg("int4-head+hadamard").find("unexpected or repeated modifier '+hadamard'") != std::string::npos);
  CHECK(msg("int4-head+had+had").find("repeated modifier '+had'") != std::string::npos);
  CHECK(msg("int4-head+w").find("modifier '+w'") != std::string::npos);
  CHECK(msg("int4-head+w-3").find("window in '+w-3' must be a non-negative number of tokens") != std::string::npos);
  CHECK(msg("int4-head+wx").find("window in '+wx'") != std::string::npos);
  CHECK(msg("int4-head+w8+w16").find("repeated modifier '+w16'") != std::string::npos);
  CHECK(msg("int4-head+").find("modifier '+'") != std::string::npos);
  CHECK(msg("+had").find("bits '' must be int8, int4 or fp8") != std::string::npos);
}

