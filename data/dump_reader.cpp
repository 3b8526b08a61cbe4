#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <utility>

#include <unistd.h>

#include "data/dump.hpp"
#include "data/hdf5_types.hpp"
#include "quant/kv_tensor.hpp"

namespace kvq {

std::string to_string(StoredDtype dtype) {
  switch (dtype) {
    case StoredDtype::kFp16: return "float16";
    case StoredDtype::kBf16: return "bfloat16";
    case StoredDtype::kFp32: return "float32";
  }
  return "?";
}

StoredDtype parse_stored_dtype(const std::string& name) {
  if (name == "float16" || name == "fp16") return StoredDtype::kFp16;
  if (name == "bfloat16" || name == "bf16") return StoredDtype::kBf16;
  if (name == "float32" || name == "fp32") return StoredDtype::kFp32;
  throw InputError(fmt::format("unknown dtype '{}': expected float16, bfloat16 or float32", name));
}

namespace {

// No real K/V/Q tensor comes near this (2^48 fp16 values = 512 TiB); a corrupt or hostile file may
// declare anything, and products of its dimensions must not overflow.
constexpr int64_t kMaxTensorElements = int64_t{1} << 48;

// Bytes of physical memory, to refuse reads that cannot fit before allocating them.
double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

// Messages read "<file>: <object>: <problem>".
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& problem) const {
    throw DumpError(where.empty() ? fmt::format("{}: {}", path_, problem) : fmt::format("{}: {}: {}", path_, where, problem));
  }

  // Runs HDF5 calls; any HDF5 failure becomes a CorruptFileError about `where`, with the reason
  // HDF5 gives (checksum mismatch, truncation, ...).
  template <typename F>
  auto guarded(const std::string& where, const char* doing, F&& f) const -> decltype(f()) {
    h5::clear_failures();
    try {
      return f();
    } catch (const H5::Exception&) {
      const std::string problem = fmt::format("cannot {} ({})", doing, h5::failure_reason());
      throw CorruptFileError(where.empty() ? fmt::format("{}: {}", path_, problem)
                                           : fmt::format("{}: {}: {}", path_, where, problem));
    }
  }

  H5::H5File open() const {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path_, ec)) fail("", "no such file");
    const auto size = std::filesystem::file_size(path_, ec);
    if (ec) fail("", "cannot read the file size");
    if (size == 0) fail("", "empty file (0 bytes), not an HDF5 dump");
    const bool hdf5 = guarded("", "read the file", [&] { return H5::H5File::isHdf5(path_); });
    if (!hdf5) fail("", "not an HDF5 file (no HDF5 signature: a corrupt superblock or another format)");
    return guarded("", "open the file as HDF5", [&] { return H5::H5File(path_, H5F_ACC_RDONLY); });
  }

  H5O_type_t child_type(const H5::Group& parent, const std::string& parent_path, const std::string& name) const {
    const std::string where = join(parent_path, name);
    return guarded(where, "look up the object", [&]() -> H5O_type_t {
      if (!parent.nameExists(name)) return H5O_TYPE_UNKNOWN;
      return parent.childObjType(name);
    });
  }

  H5::DataSet dataset(const H5::Group& parent, const std::string& parent_path, const std::string& name,
                      bool required) const {
    const std::string where = join(parent_path, name);
    const H5O_type_t t = child_type(parent, parent_path, name);
    if (t == H5O_TYPE_UNKNOWN) {
      if (required) fail(where, "missing dataset");
      return H5::DataSet();
    }
    if (t != H5O_TYPE_DATASET) fail(where, "expected a dataset, got another kind of object");
    return guarded(where, "open the dataset", [&] { return parent.openDataSet(name); });
  }

  std::vector<int64_t> shape_of(const H5::DataSet& ds, const std::string& where) const {
    return guarded(where, "read the dataspace", [&] {
      const H5::DataSpace space = ds.getSpace();
      std::vector<hsize_t> dims(static_cast<size_t>(space.getSimpleExtentNdims()));
      space.getSimpleExtentDims(dims.data());
      return std::vector<int64_t>(dims.begin(), dims.end());
    });
  }

  std::string read_string_attr(const H5::H5Object& obj, const std::string& where, const std::string& name) const {
    const std::string at = where + " attribute " + name;
    return guarded(at, "read the attribute", [&] {
      if (!obj.attrExists(name)) fail(at, "missing");
      const H5::Attribute attr = obj.openAttribute(name);
      if (attr.getTypeClass() != H5T_STRING) fail(at, fmt::format("expected a string, got {}", h5::describe(attr.getDataType())));
      std::string value;
      attr.read(attr.getDataType(), value);
      return value;
    });
  }

  std::optional<int64_t> read_int_attr(const H5::H5Object& obj, const std::string& where, const std::string& name,
                                       bool required) const {
    const std::string at = where + " attribute " + name;
    return guarded(at, "read the attribute", [&]() -> std::optional<int64_t> {
      if (!obj.attrExists(name)) {
        if (required) fail(at, "missing");
        return std::nullopt;
      }
      const H5::Attribute attr = obj.openAttribute(name);
      if (attr.getSpace().getSimpleExtentNpoints() != 1) fail(at, "expected a scalar");
      if (attr.getTypeClass() == H5T_ENUM && attr.getDataType().getSize() == 1) {  // h5py's bool
        int8_t b = 0;
        attr.read(attr.getDataType(), &b);
        return b;
      }
      if (attr.getTypeClass() != H5T_INTEGER) fail(at, fmt::format("expected an integer, got {}", h5::describe(attr.getDataType())));
      int64_t v = 0;
      attr.read(H5::PredType::NATIVE_INT64, &v);
      return v;
    });
  }

  std::optional<double> read_float_attr(const H5::H5Object& obj, const std::string& where, const std::string& name) const {
    const std::string at = where + " attribute " + name;
    return guarded(at, "read the attribute", [&]() -> std::optional<double> {
      if (!obj.attrExists(name)) return std::nullopt;
      const H5::Attribute attr = obj.openAttribute(name);
      if (attr.getSpace().getSimpleExtentNpoints() != 1) fail(at, "expected a scalar");
      const H5T_class_t c = attr.getTypeClass();
      if (c != H5T_FLOAT && c != H5T_INTEGER) fail(at, fmt::format("expected a number, got {}", h5::describe(attr.getDataType())));
      double v = 0;
      attr.read(H5::PredType::NATIVE_DOUBLE, &v);
      return v;
    });
  }

  TensorInfo tensor(const H5::DataSet& ds, const std::string& where, const char* dims_doc) const {
    TensorInfo info{where, shape_of(ds, where), StoredDtype::kFp32};
    if (info.shape.size() != 4)
      fail(where, fmt::format("expected rank 4 {}, got rank {} [{}]", dims_doc, info.shape.size(), fmt::join(info.shape, ", ")));
    int64_t elements = 1;
    for (int64_t d : info.shape) {
      if (d == 0) fail(where, fmt::format("zero-size dimension in shape [{}]", fmt::join(info.shape, ", ")));
      if (d < 0 || __builtin_mul_overflow(elements, d, &elements) || elements > kMaxTensorElements)
        fail(where, fmt::format("shape [{}] declares more than 2^48 elements", fmt::join(info.shape, ", ")));
    }
    const H5::DataType type = guarded(where, "read the datatype", [&] { return ds.getDataType(); });
    const auto dtype = h5::stored_dtype_of(type);
    if (!dtype) fail(where, fmt::format("expected float16, bfloat16 or float32, got {}", h5::describe(type)));
    info.dtype = *dtype;
    check_chunks(ds, info);
    check_filters(ds, where);
    return info;
  }

  // A corrupt chunk index can send HDF5's own read outside its buffers (a crash, not an error), so
  // before any read every chunk must sit on the chunk grid inside the extent, its bytes inside the file.
  void check_chunks(const H5::DataSet& ds, const TensorInfo& info) const {
    auto corrupt = [&](const std::string& problem) {
      throw CorruptFileError(fmt::format("{}: {}: {} (corrupt chunk metadata)", path_, info.dataset, problem));
    };
    guarded(info.dataset, "read the chunk index", [&] {
      const H5::DSetCreatPropList dcpl = ds.getCreatePlist();
      if (dcpl.getLayout() != H5D_CHUNKED) return;
      const int rank = static_cast<int>(info.shape.size());
      std::vector<hsize_t> chunk(static_cast<size_t>(rank)), offset(static_cast<size_t>(rank));
      if (dcpl.getChunk(rank, chunk.data()) != rank) corrupt("the chunk shape's rank differs from the dataset's");
      const H5::DataSpace space = ds.getSpace();  // the whole extent (libhdf5 1.10 takes no H5S_ALL below)
      std::vector<hsize_t> dims(static_cast<size_t>(rank)), max_dims(static_cast<size_t>(rank));
      space.getSimpleExtentDims(dims.data(), max_dims.data());
      for (int d = 0; d < rank; ++d)  // libhdf5 refuses a chunk larger than a fixed dimension when it writes one
        if (chunk[d] == 0 || (max_dims[d] != H5S_UNLIMITED && chunk[d] > max_dims[d]))
          corrupt(fmt::format("chunk shape [{}] does not fit the dataset's maximum shape [{}]", fmt::join(chunk, ", "),
                              fmt::join(max_dims, ", ")));
      hsize_t count = 0;
      if (H5Dget_num_chunks(ds.getId(), space.getId(), &count) < 0) throw H5::DataSetIException("H5Dget_num_chunks", "failed");
      std::error_code ec;
      const auto file_bytes = std::filesystem::file_size(path_, ec);
      for (hsize_t i = 0; i < count; ++i) {
        unsigned filter_mask = 0;
        haddr_t address = 0;
        hsize_t bytes = 0;
        if (H5Dget_chunk_info(ds.getId(), space.getId(), i, offset.data(), &filter_mask, &address, &bytes) < 0)
          throw H5::DataSetIException("H5Dget_chunk_info", "failed");
        for (int d = 0; d < rank; ++d)
          if (chunk[d] == 0 || offset[d] % chunk[d] != 0 || offset[d] >= static_cast<hsize_t>(info.shape[d]))
            corrupt(fmt::format("chunk {} at [{}] is off the grid of [{}] chunks in shape {}", i, fmt::join(offset, ", "),
                                fmt::join(chunk, ", "), fmt::format("[{}]", fmt::join(info.shape, ", "))));
        if (address == HADDR_UNDEF || (!ec && (address > file_bytes || bytes > file_bytes - address)))
          corrupt(fmt::format("chunk {} lies outside the file ({} bytes at {}, file {} bytes)", i, bytes, address, file_bytes));
      }
    });
  }

  // A chunk that went through a filter this HDF5 lacks (h5py's lzf, a plugin not on HDF5_PLUGIN_PATH)
  // cannot be read, and HDF5 says only that the read failed: named here, so that a valid file is
  // not reported as a corrupt one. Optional filters a chunk skipped (its filter mask) need nothing.
  void check_filters(const H5::DataSet& ds, const std::string& where) const {
    guarded(where, "read the filter pipeline", [&] {
      const H5::DSetCreatPropList dcpl = ds.getCreatePlist();
      if (dcpl.getLayout() != H5D_CHUNKED) return;
      struct Missing {
        unsigned index;
        H5Z_filter_t id;
        std::string name;
      };
      std::vector<Missing> missing;
      const int filters = dcpl.getNfilters();
      for (int i = 0; i < filters; ++i) {
        unsigned flags = 0, config = 0, decode = 0;
        size_t values = 0;
        char name[80] = "";
        const H5Z_filter_t id = H5Pget_filter2(dcpl.getId(), static_cast<unsigned>(i), &flags, &values, nullptr,
                                               sizeof name, name, &config);
        if (id < 0) throw H5::PropListIException("H5Pget_filter2", "failed");
        if (H5Zfilter_avail(id) > 0 && H5Zget_filter_info(id, &decode) >= 0 && (decode & H5Z_FILTER_CONFIG_DECODE_ENABLED))
          continue;
        missing.push_back({static_cast<unsigned>(i), id, name});
      }
      if (missing.empty()) return;
      const H5::DataSpace space = ds.getSpace();
      std::vector<hsize_t> offset(static_cast<size_t>(space.getSimpleExtentNdims()));
      hsize_t count = 0;
      if (H5Dget_num_chunks(ds.getId(), space.getId(), &count) < 0) throw H5::DataSetIException("H5Dget_num_chunks", "failed");
      for (hsize_t c = 0; c < count; ++c) {
        unsigned mask = 0;
        haddr_t address = 0;
        hsize_t bytes = 0;
        if (H5Dget_chunk_info(ds.getId(), space.getId(), c, offset.data(), &mask, &address, &bytes) < 0)
          throw H5::DataSetIException("H5Dget_chunk_info", "failed");
        for (const Missing& m : missing)
          if ((mask & (1u << m.index)) == 0)
            fail(where, fmt::format("chunk [{}] is stored through HDF5 filter {} ('{}'), which this HDF5 library cannot "
                                    "decode (h5py's compression='lzf' is one): rewrite the dump with compression='gzip' "
                                    "or none, or put the filter's plugin on HDF5_PLUGIN_PATH",
                                    fmt::join(offset, ", "), m.id, m.name));
      }
    });
  }

  static std::string join(const std::string& parent, const std::string& name) {
    return parent == "/" ? "/" + name : parent + "/" + name;
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Canonical decimal only: "00" or "+1" would alias another layer's index (and kvq's outputs name
// layers by index).
std::optional<int> layer_index(const std::string& name) {
  int v = -1;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), v);
  if (ec != std::errc() || end != name.data() + name.size() || v < 0 || (name.size() > 1 && name[0] == '0'))
    return std::nullopt;
  return v;
}

std::string shape_string(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

LayerInfo read_layer_info(const Reader& r, const H5::Group& layers, const std::string& name) {
  const std::string where = "/layers/" + name;
  LayerInfo info;
  info.name = name;
  const auto index = layer_index(name);
  if (!index) r.fail(where, "layer group names must be layer indices 0, 1, ... (decimal, no leading zeros)");
  info.index = *index;
  if (r.child_type(layers, "/layers", name) != H5O_TYPE_GROUP) r.fail(where, "expected a group");
  const H5::Group g = r.guarded(where, "open the group", [&] { return layers.openGroup(name); });

  info.k = r.tensor(r.dataset(g, where, "k", true), where + "/k", "[B, Hkv, T, D]");
  info.v = r.tensor(r.dataset(g, where, "v", true), where + "/v", "[B, Hkv, T, D]");
  if (info.v.shape != info.k.shape)
    r.fail(where + "/v", fmt::format("expected shape {} (as k), got {}", shape_string(info.k.shape), shape_string(info.v.shape)));

  info.num_q_heads = *r.read_int_attr(g, where, "num_q_heads", true);
  info.num_kv_heads = *r.read_int_attr(g, where, "num_kv_heads", true);
  info.head_dim = *r.read_int_attr(g, where, "head_dim", true);
  if (info.num_kv_heads != info.k.shape[1])
    r.fail(where, fmt::format("attribute num_kv_heads is {} but k has {} heads", info.num_kv_heads, info.k.shape[1]));
  if (info.head_dim != info.k.shape[3])
    r.fail(where, fmt::format("attribute head_dim is {} but k has head_dim {}", info.head_dim, info.k.shape[3]));
  if (info.num_q_heads <= 0 || info.num_q_heads % info.num_kv_heads != 0)
    r.fail(where, fmt::format("attribute num_q_heads {} is not a positive multiple of num_kv_heads {}", info.num_q_heads,
                              info.num_kv_heads));
  if (const auto scale = r.read_float_attr(g, where, "softmax_scale")) {
    if (!(std::isfinite(*scale) && *scale > 0))
      r.fail(where + " attribute softmax_scale", fmt::format("expected a positive finite number, got {}", *scale));
    info.softmax_scale = *scale;
  }
  if (const auto alibi = r.read_int_attr(g, where, "alibi", false)) {
    if (*alibi != 0 && *alibi != 1) r.fail(where + " attribute alibi", fmt::format("expected a bool, got {}", *alibi));
    info.alibi = *alibi == 1;
  }

  if (const H5::DataSet q = r.dataset(g, where, "q", false); q.getId() > 0) {
    TensorInfo qi = r.tensor(q, where + "/q", "[B, Hq, Tq, D]");
    const std::vector<int64_t>& ks = info.k.shape;
    if (qi.shape[0] != ks[0] || qi.shape[1] != info.num_q_heads || qi.shape[2] > ks[2] || qi.shape[3] != ks[3])
      r.fail(where + "/q", fmt::format("expected shape [B={}, Hq={}, Tq<={}, D={}], got {}", ks[0], info.num_q_heads,
                                       ks[2], ks[3], shape_string(qi.shape)));
    info.q = qi;
  }
  return info;
}

// An integer dataset of the given shape, read as int32.
std::vector<int32_t> read_int_dataset(const Reader& r, const H5::DataSet& ds, const std::string& where,
                                      const std::vector<int64_t>& expected, const char* dims_doc) {
  const std::vector<int64_t> shape = r.shape_of(ds, where);
  if (shape != expected)
    r.fail(where, fmt::format("expected shape {} {}, got {}", dims_doc, shape_string(expected), shape_string(shape)));
  const H5::DataType type = r.guarded(where, "read the datatype", [&] { return ds.getDataType(); });
  if (type.getClass() != H5T_INTEGER) r.fail(where, fmt::format("expected integers, got {}", h5::describe(type)));
  r.check_filters(ds, where);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<int64_t> wide(static_cast<size_t>(n));
  if (n > 0) r.guarded(where, "read the data", [&] { ds.read(wide.data(), H5::PredType::NATIVE_INT64); });
  std::vector<int32_t> out(wide.size());
  for (size_t i = 0; i < wide.size(); ++i) {
    if (wide[i] < INT32_MIN || wide[i] > INT32_MAX) r.fail(where, fmt::format("value {} at {} does not fit int32", wide[i], i));
    out[i] = static_cast<int32_t>(wide[i]);
  }
  return out;
}

}  // namespace

DumpInfo open_dump(const std::string& path) {
  h5::record_failures();
  const Reader r(path);
  const H5::H5File file = r.open();
  DumpInfo info;
  info.path = path;

  // kvq quantize / reference write files of their own kinds: name them, and the dump they came from
  const auto has = [&](const char* name) {
    return r.guarded("/", "look the attributes up", [&] { return file.attrExists(name); });
  };
  if (!has("kvq_schema"))
    for (const auto& [mark, command] : {std::pair{"kvq_quantized", "kvq quantize"}, std::pair{"kvq_reference", "kvq reference"}})
      if (has(mark))
        r.fail("/ attribute kvq_schema",
               fmt::format("missing: this file is {}'s output ({}), not a dump{}", command, mark,
                           has("input") ? "; its input dump was " + r.read_string_attr(file, "/", "input") : ""));
  const auto schema = r.read_int_attr(file, "/", "kvq_schema", true);
  if (*schema != kDumpSchemaVersion)
    r.fail("/ attribute kvq_schema", fmt::format("expected {}, got {}", kDumpSchemaVersion, *schema));
  info.schema = static_cast<int>(*schema);
  info.source = r.read_string_attr(file, "/", "source");
  info.created_by = r.read_string_attr(file, "/", "created_by");
  info.rope = r.read_string_attr(file, "/", "rope");
  if (info.rope != "post" && info.rope != "pre" && info.rope != "none")
    r.fail("/ attribute rope", fmt::format("expected post, pre or none, got '{}'", info.rope));
  if (r.guarded("/ attribute rope_pairs", "look the attribute up", [&] { return file.attrExists("rope_pairs"); })) {
    info.rope_pairs = r.read_string_attr(file, "/", "rope_pairs");
    if (info.rope_pairs != "half" && info.rope_pairs != "adjacent")
      r.fail("/ attribute rope_pairs", fmt::format("expected half or adjacent, got '{}'", info.rope_pairs));
  }

  if (r.child_type(file, "/", "layers") != H5O_TYPE_GROUP) r.fail("/layers", "missing group");
  const H5::Group layers = r.guarded("/layers", "open the group", [&] { return file.openGroup("layers"); });
  const hsize_t count = r.guarded("/layers", "list the layers", [&] { return layers.getNumObjs(); });
  if (count == 0) r.fail("/layers", "no layers");
  for (hsize_t i = 0; i < count; ++i) {
    const std::string name = r.guarded("/layers", "list the layers", [&] { return layers.getObjnameByIdx(i); });
    info.layers.push_back(read_layer_info(r, layers, name));
  }
  std::sort(info.layers.begin(), info.layers.end(), [](const LayerInfo& a, const LayerInfo& b) { return a.index < b.index; });
  info.batch = info.layers[0].k.shape[0];
  info.tokens = info.layers[0].k.shape[2];
  for (const LayerInfo& l : info.layers)
    if (l.k.shape[0] != info.batch || l.k.shape[2] != info.tokens)
      r.fail(l.k.dataset, fmt::format("expected B={} and T={} as in /layers/{}, got {}", info.batch, info.tokens,
                                      info.layers[0].name, shape_string(l.k.shape)));

  if (const H5::DataSet sl = r.dataset(file, "/", "seq_lens", false); sl.getId() > 0) {
    info.seq_lens = read_int_dataset(r, sl, "/seq_lens", {info.batch}, "[B]");
    info.has_seq_lens = true;
    for (size_t b = 0; b < info.seq_lens.size(); ++b)
      if (info.seq_lens[b] < 0 || info.seq_lens[b] > info.tokens)
        r.fail("/seq_lens", fmt::format("seq_lens[{}] = {} is outside [0, T={}]", b, info.seq_lens[b], info.tokens));
  } else {
    info.seq_lens.assign(static_cast<size_t>(info.batch), static_cast<int32_t>(info.tokens));
  }
  if (const H5::DataSet tok = r.dataset(file, "/", "tokens", false); tok.getId() > 0) {
    const std::vector<int64_t> shape = r.shape_of(tok, "/tokens");
    if (shape != std::vector<int64_t>{info.batch, info.tokens})
      r.fail("/tokens", fmt::format("expected shape [B, T] [{}, {}], got {}", info.batch, info.tokens, shape_string(shape)));
    info.has_tokens = true;
  }
  return info;
}

KvLayer read_layer(const DumpInfo& info, size_t layer, int64_t batch_begin, int64_t batch_count) {
  h5::record_failures();
  const Reader r(info.path);
  if (layer >= info.layers.size())
    throw DumpError(fmt::format("{}: layer position {} is out of range (the dump has {} layers)", info.path, layer,
                                info.layers.size()));
  if (batch_count < 0) batch_count = info.batch - batch_begin;
  if (batch_begin < 0 || batch_count < 0 || batch_begin + batch_count > info.batch)
    throw DumpError(fmt::format("{}: batch range [{}, {}) is outside [0, B={})", info.path, batch_begin,
                                batch_begin + batch_count, info.batch));
  const LayerInfo& li = info.layers[layer];
  // K and V as fp32 plus Q, and the 16-bit staging copy of the largest.
  const double per_entry = static_cast<double>(li.k.shape[1] * li.k.shape[2] * li.k.shape[3]) * 2 * 4 +
                           (li.q ? static_cast<double>(li.q->shape[1] * li.q->shape[2] * li.q->shape[3]) * 4 : 0.0);
  const double need = per_entry * static_cast<double>(batch_count) * 1.25, have = physical_memory_bytes();
  if (have > 0 && need > have)
    r.fail(li.k.dataset, fmt::format("layer {} ({} batch entries) needs {:.3g} GiB in memory, more than this "
                                     "machine's {:.3g} GiB", li.index, batch_count, need / (1 << 30), have / (1 << 30)));
  const H5::H5File file = r.open();

  // Rows [batch_begin, batch_begin + batch_count) of a rank-4 dataset, by hyperslab.
  auto read_rows = [&](const TensorInfo& t) {
    return r.guarded(t.dataset, "read the data", [&] {
      const H5::DataSet ds = file.openDataSet(t.dataset);
      H5::DataSpace file_space = ds.getSpace();
      const hsize_t start[4] = {static_cast<hsize_t>(batch_begin), 0, 0, 0};
      const hsize_t dims[4] = {static_cast<hsize_t>(batch_count), static_cast<hsize_t>(t.shape[1]),
                               static_cast<hsize_t>(t.shape[2]), static_cast<hsize_t>(t.shape[3])};
      file_space.selectHyperslab(H5S_SELECT_SET, dims, start);
      const H5::DataSpace mem_space(4, dims);
      return h5::read_as_float(ds, t.dtype, mem_space, file_space, dims[0] * dims[1] * dims[2] * dims[3]);
    });
  };

  KvLayer out;
  out.source = info.source;
  out.layer = li.index;
  out.kv_shape = {batch_count, li.k.shape[1], li.k.shape[2], li.k.shape[3]};
  out.k = read_rows(li.k);
  out.v = read_rows(li.v);
  if (li.q) {
    out.q_shape = {batch_count, li.q->shape[1], li.q->shape[2], li.q->shape[3]};
    out.q = read_rows(*li.q);
  }
  out.seq_lens.assign(info.seq_lens.begin() + batch_begin, info.seq_lens.begin() + batch_begin + batch_count);
  out.softmax_scale = li.softmax_scale;
  out.alibi = li.alibi;
  return out;
}

void check_finite_queries(const DumpInfo& info, size_t layer, const KvLayer& values) {
  if (!values.has_queries()) return;
  check_finite(KvView::bnsh(values.q.data(), values.q_shape),
               fmt::format("{}: /layers/{}/q", info.path, info.layers.at(layer).name), "attention needs finite queries");
}

namespace {
// Layer indices as runs: 0, 1, 2, 5 -> "0-2, 5"
std::string index_runs(const std::vector<int>& sorted) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    runs.push_back(j == i ? std::to_string(sorted[i]) : fmt::format("{}-{}", sorted[i], sorted[j]));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(runs, ", "));
}
}  // namespace

std::vector<size_t> select_layers(const DumpInfo& info, const std::vector<int>& indices) {
  std::vector<size_t> out;
  std::vector<int> present, missing;
  for (size_t i = 0; i < info.layers.size(); ++i) {
    present.push_back(info.layers[i].index);
    if (indices.empty() || std::find(indices.begin(), indices.end(), info.layers[i].index) != indices.end())
      out.push_back(i);
  }
  std::sort(present.begin(), present.end());
  for (int index : indices)
    if (!std::binary_search(present.begin(), present.end(), index) &&
        std::find(missing.begin(), missing.end(), index) == missing.end())
      missing.push_back(index);
  if (!missing.empty())  // a layer asked for and not there is an error, not a smaller result
    throw DumpError(fmt::format("{}: --layers {}: not in the dump (its layers: {})", info.path, fmt::join(missing, ", "),
                                index_runs(present)));
  return out;
}

std::vector<int32_t> read_tokens(const DumpInfo& info) {
  h5::record_failures();
  const Reader r(info.path);
  if (!info.has_tokens) r.fail("/tokens", "missing dataset (this dump has no token ids)");
  const H5::H5File file = r.open();
  return read_int_dataset(r, r.dataset(file, "/", "tokens", true), "/tokens", {info.batch, info.tokens}, "[B, T]");
}

}  // namespace kvq
