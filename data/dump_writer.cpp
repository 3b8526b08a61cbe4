#include <fmt/format.h>

#include <optional>

#include "data/dump.hpp"
#include "data/hdf5_types.hpp"

namespace kvq {

struct DumpWriter::Impl {
  std::string path;
  std::optional<H5::H5File> file;  // optional: HDF5's classes are not assignable
  std::optional<H5::Group> layers;
};

namespace {

// Strings as variable-length UTF-8 and bools as HDF5 enums {FALSE, TRUE}: what h5py writes and
// reads back as str and bool.
void write_attr(const H5::H5Object& obj, const std::string& name, const std::string& value) {
  H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
  type.setCset(H5T_CSET_UTF8);
  obj.createAttribute(name, type, H5::DataSpace(H5S_SCALAR)).write(type, value);
}

void write_attr(const H5::H5Object& obj, const std::string& name, int64_t value) {
  obj.createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_INT64, &value);
}

void write_attr(const H5::H5Object& obj, const std::string& name, double value) {
  obj.createAttribute(name, H5::PredType::IEEE_F64LE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_DOUBLE, &value);
}

void write_bool_attr(const H5::H5Object& obj, const std::string& name, bool value) {
  H5::EnumType type(H5::PredType::NATIVE_INT8);
  int8_t f = 0, t = 1;
  type.insert("FALSE", &f);
  type.insert("TRUE", &t);
  const int8_t v = value ? 1 : 0;
  obj.createAttribute(name, type, H5::DataSpace(H5S_SCALAR)).write(type, &v);
}

H5::DataSet create(const H5::Group& parent, const std::string& name, const H5::DataType& type,
                   const std::vector<hsize_t>& dims) {
  return parent.createDataSet(name, type, H5::DataSpace(static_cast<int>(dims.size()), dims.data()));
}

template <typename F>
void guarded(const std::string& path, const std::string& what, F&& f) {
  try {
    f();
  } catch (const H5::Exception&) {
    throw DumpError(fmt::format("{}: cannot write {} (is the disk full, or the path not writable?)", path, what));
  }
}

}  // namespace

DumpWriter::DumpWriter(const std::string& path, const DumpHeader& header) : impl_(new Impl{path, {}, {}}) {
  H5::Exception::dontPrint();
  if (header.rope != "post" && header.rope != "pre" && header.rope != "none")
    throw DumpError(fmt::format("{}: rope must be post, pre or none, got '{}'", path, header.rope));
  guarded(path, "the file", [&] {
    impl_->file.emplace(path, H5F_ACC_TRUNC);
    write_attr(*impl_->file, "kvq_schema", static_cast<int64_t>(kDumpSchemaVersion));
    write_attr(*impl_->file, "source", header.source);
    write_attr(*impl_->file, "created_by", header.created_by);
    write_attr(*impl_->file, "rope", header.rope);
    impl_->layers.emplace(impl_->file->createGroup("layers"));
  });
}

DumpWriter::~DumpWriter() {
  try {
    close();
  } catch (...) {  // destructors must not throw; close() explicitly to see errors
  }
  delete impl_;
}

void DumpWriter::check_open() const {
  if (!impl_->file) throw DumpError(fmt::format("{}: the dump writer is already closed", impl_->path));
}

void DumpWriter::close() {
  impl_->layers.reset();
  if (impl_->file) guarded(impl_->path, "the file", [&] { impl_->file->close(); });
  impl_->file.reset();
}

void DumpWriter::add_layer(const KvLayer& layer, StoredDtype dtype) {
  check_open();
  const KvShape& s = layer.kv_shape;
  const std::string name = std::to_string(layer.layer);
  if (static_cast<int64_t>(layer.k.size()) != s.numel() || static_cast<int64_t>(layer.v.size()) != s.numel())
    throw DumpError(fmt::format("{}: layer {}: K/V hold {}/{} values, shape needs {}", impl_->path, name, layer.k.size(),
                                layer.v.size(), s.numel()));
  if (layer.has_queries() && (static_cast<int64_t>(layer.q.size()) != layer.q_shape.numel() ||
                              layer.q_shape.batch != s.batch || layer.q_shape.head_dim != s.head_dim))
    throw DumpError(fmt::format("{}: layer {}: Q holds {} values for shape [{}, {}, {}, {}]", impl_->path, name,
                                layer.q.size(), layer.q_shape.batch, layer.q_shape.heads, layer.q_shape.tokens,
                                layer.q_shape.head_dim));
  guarded(impl_->path, "/layers/" + name, [&] {
    const H5::Group g = impl_->layers->createGroup(name);
    const H5::FloatType type = h5::file_type(dtype);
    const std::vector<hsize_t> kv_dims = {hsize_t(s.batch), hsize_t(s.heads), hsize_t(s.tokens), hsize_t(s.head_dim)};
    h5::write_from_float(create(g, "k", type, kv_dims), dtype, layer.k);
    h5::write_from_float(create(g, "v", type, kv_dims), dtype, layer.v);
    const int64_t q_heads = layer.has_queries() ? layer.q_shape.heads : s.heads;
    if (layer.has_queries()) {
      const KvShape& qs = layer.q_shape;
      h5::write_from_float(create(g, "q", type, {hsize_t(qs.batch), hsize_t(qs.heads), hsize_t(qs.tokens), hsize_t(qs.head_dim)}),
                           dtype, layer.q);
    }
    write_attr(g, "num_q_heads", q_heads);
    write_attr(g, "num_kv_heads", s.heads);
    write_attr(g, "head_dim", s.head_dim);
    if (layer.softmax_scale != 0.0) write_attr(g, "softmax_scale", layer.softmax_scale);
    write_bool_attr(g, "alibi", layer.alibi);
  });
}

void DumpWriter::set_seq_lens(const std::vector<int32_t>& seq_lens) {
  check_open();
  guarded(impl_->path, "/seq_lens", [&] {
    create(*impl_->file, "seq_lens", H5::PredType::STD_I32LE, {seq_lens.size()}).write(seq_lens.data(), H5::PredType::NATIVE_INT32);
  });
}

void DumpWriter::set_tokens(const std::vector<int32_t>& tokens, int64_t batch, int64_t tokens_per_sequence) {
  check_open();
  if (static_cast<int64_t>(tokens.size()) != batch * tokens_per_sequence)
    throw DumpError(fmt::format("{}: /tokens: {} ids for shape [{}, {}]", impl_->path, tokens.size(), batch, tokens_per_sequence));
  guarded(impl_->path, "/tokens", [&] {
    create(*impl_->file, "tokens", H5::PredType::STD_I32LE, {hsize_t(batch), hsize_t(tokens_per_sequence)})
        .write(tokens.data(), H5::PredType::NATIVE_INT32);
  });
}

}  // namespace kvq
