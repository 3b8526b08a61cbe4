// kvq's error types. Every message names what was wrong, where, and expected vs got; the command
// line maps them to exit codes (usage vs input errors).
#pragma once

#include <stdexcept>

namespace kvq {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bad input data or arguments: non-finite values, shapes that do not fit, unknown names.
struct InputError : Error {
  using Error::Error;
};

}  // namespace kvq
