#include <fmt/format.h>

#include "data/dump.hpp"
#include "data/h5_writer.hpp"

namespace kvq {

struct DumpWriter::Impl {
  H5Writer file;
};

DumpWriter::DumpWriter(const std::string& path, const DumpHeader& header) {
  if (header.rope != "post" && header.rope != "pre" && header.rope != "none")
    throw DumpError(fmt::format("{}: rope must be post, pre or none, got '{}'", path, header.rope));
  impl_ = new Impl{H5Writer(path)};
  H5Writer& f = impl_->file;
  f.set_attr("/", "kvq_schema", static_cast<int64_t>(kDumpSchemaVersion));
  f.set_attr("/", "source", header.source);
  f.set_attr("/", "created_by", header.created_by);
  f.set_attr("/", "rope", header.rope);
}

DumpWriter::~DumpWriter() { delete impl_; }

void DumpWriter::close() { impl_->file.close(); }

void DumpWriter::add_layer(const KvLayer& layer, StoredDtype dtype) {
  const KvShape& s = layer.kv_shape;
  const std::string group = "/layers/" + std::to_string(layer.layer);
  if (layer.has_queries() && (layer.q_shape.batch != s.batch || layer.q_shape.head_dim != s.head_dim))
    throw DumpError(fmt::format("{}: {}: Q shape [{}, {}, {}, {}] does not match K/V [{}, {}, {}, {}]",
                                impl_->file.path(), group, layer.q_shape.batch, layer.q_shape.heads,
                                layer.q_shape.tokens, layer.q_shape.head_dim, s.batch, s.heads, s.tokens, s.head_dim));
  H5Writer& f = impl_->file;
  const std::vector<int64_t> kv_dims = {s.batch, s.heads, s.tokens, s.head_dim};
  f.write_floats(group + "/k", kv_dims, layer.k, dtype);
  f.write_floats(group + "/v", kv_dims, layer.v, dtype);
  if (layer.has_queries()) {
    const KvShape& q = layer.q_shape;
    f.write_floats(group + "/q", {q.batch, q.heads, q.tokens, q.head_dim}, layer.q, dtype);
  }
  f.set_attr(group, "num_q_heads", layer.has_queries() ? layer.q_shape.heads : s.heads);
  f.set_attr(group, "num_kv_heads", s.heads);
  f.set_attr(group, "head_dim", s.head_dim);
  if (layer.softmax_scale != 0.0) f.set_attr(group, "softmax_scale", layer.softmax_scale);
  f.set_bool_attr(group, "alibi", layer.alibi);
}

void DumpWriter::set_seq_lens(const std::vector<int32_t>& seq_lens) {
  impl_->file.write_int32("/seq_lens", {static_cast<int64_t>(seq_lens.size())}, seq_lens);
}

void DumpWriter::set_tokens(const std::vector<int32_t>& tokens, int64_t batch, int64_t tokens_per_sequence) {
  impl_->file.write_int32("/tokens", {batch, tokens_per_sequence}, tokens);
}

}  // namespace kvq
