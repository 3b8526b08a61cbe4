// One CHECK family for CUDA: the failing expression, the CUDA error and file:line, thrown as
// CudaError (library code never aborts). KVQ_CHECK_LAUNCH() after every kernel launch.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "quant/errors.hpp"

namespace kvq {

struct CudaError : Error {
  using Error::Error;
};

// No usable device: every GPU entry point says so in one sentence.
struct NoDeviceError : CudaError {
  NoDeviceError() : CudaError("no CUDA device: GPU kernels skipped") {}
};

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace kvq

#define KVQ_CUDA_CHECK(expr)                                                 \
  do {                                                                       \
    const cudaError_t kvq_err_ = (expr);                                     \
    if (kvq_err_ != cudaSuccess) ::kvq::throw_cuda_error(kvq_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define KVQ_CHECK_LAUNCH() KVQ_CUDA_CHECK(cudaGetLastError())
