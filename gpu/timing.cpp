#include "gpu/timing.hpp"

#include <algorithm>
#include <vector>

#include "gpu/device.hpp"

namespace kvq {
namespace {

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

class Event {
 public:
  Event() { KVQ_CUDA_CHECK(cudaEventCreate(&e_)); }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace

GpuTiming time_graph_replays(const std::function<void(cudaStream_t, int)>& launch, int sets, int reps, int warmup,
                             int calls_per_graph) {
  require_optimized_kernels();  // before the device: a machine without one learns it too
  require_device();
  Stream stream;
  std::vector<cudaGraphExec_t> graphs(sets, nullptr);
  for (int s = 0; s < sets; ++s) {
    cudaGraph_t graph = nullptr;
    KVQ_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeRelaxed));
    for (int c = 0; c < calls_per_graph; ++c) launch(stream.get(), (s + c) % sets);
    KVQ_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
    KVQ_CUDA_CHECK(cudaGraphInstantiate(&graphs[s], graph, 0));
    KVQ_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  for (int i = 0; i < warmup; ++i) KVQ_CUDA_CHECK(cudaGraphLaunch(graphs[i % sets], stream.get()));
  stream.synchronize();
  Event start, stop;
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    KVQ_CUDA_CHECK(cudaEventRecord(start.get(), stream.get()));
    KVQ_CUDA_CHECK(cudaGraphLaunch(graphs[i % sets], stream.get()));
    KVQ_CUDA_CHECK(cudaEventRecord(stop.get(), stream.get()));
    KVQ_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0;
    KVQ_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    us.push_back(1e3 * ms / calls_per_graph);
  }
  for (cudaGraphExec_t g : graphs) cudaGraphExecDestroy(g);
  return {percentile(us, 0.5), percentile(us, 0.1), percentile(us, 0.9), reps};
}

double copy_bandwidth_gbps(size_t bytes, int reps) {
  require_optimized_kernels();
  DeviceBuffer<uint8_t> src(bytes), dst(bytes);
  src.fill_bytes(1);
  const GpuTiming t = time_graph_replays(
      [&](cudaStream_t s, int) {
        KVQ_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, s));
      },
      1, reps);
  return 2.0 * static_cast<double>(bytes) / (t.median_us * 1e3);
}

}  // namespace kvq
