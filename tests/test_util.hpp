// Helpers shared by the test suites: seeded random data and message matching.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

namespace kvq::test {

inline std::vector<float> random_normal(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Runs `fn`, requires it to throw E, and returns the message.
template <typename E>
std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("expected an exception");
  return {};
}

}  // namespace kvq::test
