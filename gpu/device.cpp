#include "gpu/device.hpp"

#include <fmt/format.h>

namespace kvq {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) throw NoDeviceError();
  throw CudaError(fmt::format("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err),
                              expr, file, line));
}

bool cuda_device_available() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) cudaGetLastError();  // clear the sticky "no device" state
  return err == cudaSuccess && count > 0;
}

void require_device() {
  if (!cuda_device_available()) throw NoDeviceError();
}

bool kernels_optimized() {
#ifdef KVQ_CUDA_COMPILE_CHECK
  return false;
#else
  return true;
#endif
}

void require_optimized_kernels() {
  if (!kernels_optimized())
    throw CudaError("this build's kernels were compiled only to check that they build (KVQ_CUDA_COMPILE_CHECK=ON, "
                    "NVVM -O1), so their times are not kvq's: reconfigure with -DKVQ_CUDA_COMPILE_CHECK=OFF to time them");
}

std::string DeviceInfo::driver_string() const {
  return fmt::format("{}.{}", driver_version / 1000, (driver_version % 1000) / 10);
}

std::string DeviceInfo::runtime_string() const {
  return fmt::format("{}.{}", runtime_version / 1000, (runtime_version % 1000) / 10);
}

DeviceInfo device_info() {
  require_device();
  DeviceInfo info;
  KVQ_CUDA_CHECK(cudaGetDevice(&info.device));
  cudaDeviceProp prop{};
  KVQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, info.device));
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.l2_bytes = prop.l2CacheSize;
  info.global_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&info.memory_clock_khz, cudaDevAttrMemoryClockRate, info.device));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&info.memory_bus_bits, cudaDevAttrGlobalMemoryBusWidth, info.device));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&info.sm_clock_khz, cudaDevAttrClockRate, info.device));
  KVQ_CUDA_CHECK(cudaDriverGetVersion(&info.driver_version));
  KVQ_CUDA_CHECK(cudaRuntimeGetVersion(&info.runtime_version));
  return info;
}

}  // namespace kvq
