// kvq's C++ errors as Python exceptions, for every module of the package (kvq._core creates the
// classes, kvq._gpu raises the same ones): SchemeError > InputError > Error, kvq's own messages.
#pragma once

#include <nanobind/nanobind.h>

#include <exception>

#include "quant/errors.hpp"
#include "quant/scheme.hpp"

namespace kvq {

// Registers the translation of this module's kvq exceptions into the given classes (kept alive
// for the life of the process).
inline void translate_kvq_errors(PyObject* error, PyObject* input_error, PyObject* scheme_error) {
  static PyObject* classes[3] = {nullptr, nullptr, nullptr};
  classes[0] = error, classes[1] = input_error, classes[2] = scheme_error;
  nanobind::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const SchemeError& e) {
      PyErr_SetString(classes[2], e.what());
    } catch (const InputError& e) {
      PyErr_SetString(classes[1], e.what());
    } catch (const Error& e) {
      PyErr_SetString(classes[0], e.what());
    }
  });
}

}  // namespace kvq
