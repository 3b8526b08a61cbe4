// The device the GPU code runs on, and RAII for device memory and streams.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gpu/cuda_check.hpp"

namespace kvq {

struct DeviceInfo {
  std::string name;
  int device = 0, sm_count = 0, cc_major = 0, cc_minor = 0;
  int64_t l2_bytes = 0, global_bytes = 0;
  int memory_clock_khz = 0, memory_bus_bits = 0, sm_clock_khz = 0;
  int driver_version = 0, runtime_version = 0;  // as CUDA encodes them: 13000 = 13.0
  std::string driver_string() const;            // "13.0"
  std::string runtime_string() const;
};

bool cuda_device_available();
// Throws NoDeviceError when there is none.
void require_device();
// False in a KVQ_CUDA_COMPILE_CHECK build (kernels compiled to check that they build, NVVM -O1).
bool kernels_optimized();
// Throws CudaError naming the build option in such a build: its times are not kvq's.
void require_optimized_kernels();
DeviceInfo device_info();

// Device memory for n elements of T; move-only.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n) KVQ_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  void upload(const std::vector<T>& host) {
    if (host.size() != n_) throw CudaError("DeviceBuffer::upload: size mismatch");
    if (n_) KVQ_CUDA_CHECK(cudaMemcpy(p_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) KVQ_CUDA_CHECK(cudaMemcpy(host.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  // Fills every byte with `byte` (poisoning outputs before a kernel proves it writes them all).
  void fill_bytes(int byte) {
    if (n_) KVQ_CUDA_CHECK(cudaMemset(p_, byte, bytes()));
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

class Stream {
 public:
  Stream() { KVQ_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const { KVQ_CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace kvq
