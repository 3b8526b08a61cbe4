// HDF5 dumps of K/V (schema v1, docs/data.md): a validating reader that reads one layer (or one
// batch range of a layer, by hyperslab) at a time, and a writer. Every problem with a file is a
// DumpError naming the file and the dataset, with expected vs got; HDF5's own error stack is
// never printed.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "data/kv_layer.hpp"
#include "quant/errors.hpp"

namespace kvq {

inline constexpr int kDumpSchemaVersion = 1;

struct DumpError : InputError {
  using InputError::InputError;
};

// The file itself is damaged: HDF5 cannot read it (a checksum mismatch, truncation, a broken
// structure), or reading it crashed or hung the process that checked it (experiments/common/dump_check.hpp).
// The command line exits with code 4 for these, 3 for other bad input.
struct CorruptFileError : DumpError {
  using DumpError::DumpError;
};

enum class StoredDtype { kFp16, kBf16, kFp32 };
std::string to_string(StoredDtype dtype);  // float16, bfloat16, float32
StoredDtype parse_stored_dtype(const std::string& name);

struct TensorInfo {
  std::string dataset;         // e.g. /layers/0/k
  std::vector<int64_t> shape;
  StoredDtype dtype = StoredDtype::kFp32;
};

struct LayerInfo {
  std::string name;  // the group under /layers, a decimal layer index
  int index = 0;
  TensorInfo k, v;
  std::optional<TensorInfo> q;  // [B, Hq, Tq, D]
  int64_t num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  double softmax_scale = 0.0;  // 0: absent, 1 / sqrt(D)
  bool alibi = false;
};

struct DumpInfo {
  std::string path;
  int schema = 0;
  std::string source, created_by, rope;  // rope: post | pre | none
  // Which channels RoPE pairs in K and Q: "half" (i, i + D/2; Hugging Face, vLLM), "adjacent" (2i, 2i + 1;
  // llama.cpp, llama2.c); "" when the file does not say. Per-group schemes along D see the difference.
  std::string rope_pairs;
  int64_t batch = 0, tokens = 0;         // B and T, the same in every layer
  std::vector<LayerInfo> layers;         // sorted by index
  std::vector<int32_t> seq_lens;         // [B]; all T when the file has none
  bool has_seq_lens = false, has_tokens = false;
};

// Opens and validates a dump (attributes, shapes, dtypes, seq_lens); reads no K/V data.
DumpInfo open_dump(const std::string& path);

// Layer `layer` (position in info.layers) for batches [batch_begin, batch_begin + batch_count);
// batch_count < 0 means to the end. Values are converted exactly to fp32. A range that needs more
// memory than the machine has is a DumpError (a corrupt file may declare any size).
KvLayer read_layer(const DumpInfo& info, size_t layer, int64_t batch_begin = 0, int64_t batch_count = -1);

// A non-finite decode query is an InputError naming the file, the dataset and the first index
// ("x.h5: /layers/3/q: non-finite value nan at [b, h, i, d] ..."): Q gets K and V's policy.
// `values` is layer `layer` of `info`, read whole (batch 0 first).
void check_finite_queries(const DumpInfo& info, size_t layer, const KvLayer& values);

// Positions in info.layers of the layers whose index is in `indices` (all when it is empty);
// throws DumpError when none matches.
std::vector<size_t> select_layers(const DumpInfo& info, const std::vector<int>& indices);

// Token ids [B, T]; throws DumpError when the file has none.
std::vector<int32_t> read_tokens(const DumpInfo& info);

struct DumpHeader {
  std::string source;
  std::string created_by = "kvq";
  std::string rope = "none";
};

// Writes a schema-v1 dump (truncating `path`). Values are rounded to the stored dtype (RNE);
// fp32 storage is exact. Sizes that do not match the shapes are a DumpError.
class DumpWriter {
 public:
  DumpWriter(const std::string& path, const DumpHeader& header);
  ~DumpWriter();
  DumpWriter(const DumpWriter&) = delete;
  DumpWriter& operator=(const DumpWriter&) = delete;

  void add_layer(const KvLayer& layer, StoredDtype dtype);  // /layers/<layer.layer>
  void set_seq_lens(const std::vector<int32_t>& seq_lens);  // [B]
  void set_tokens(const std::vector<int32_t>& tokens, int64_t batch, int64_t tokens_per_sequence);
  void close();  // finishes the dump at its path; a writer destroyed unclosed leaves no file (h5_writer.hpp)

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace kvq
