#include "data/h5_writer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <system_error>

#include "data/hdf5_types.hpp"

namespace kvq {
namespace {

// Chunks of at most 1 MiB: whole trailing dimensions, one partial, then 1s (a [B, H, T, D] tensor
// gets [1, 1, t, D] chunks, so a batch range reads whole chunks). data/kvq_dump.py chooses alike.
std::vector<hsize_t> chunk_dims(const std::vector<hsize_t>& dims, size_t element_bytes) {
  std::vector<hsize_t> chunk(dims.size(), 1);
  hsize_t budget = std::max<hsize_t>(1, (hsize_t{1} << 20) / element_bytes);
  for (size_t i = dims.size(); i-- > 0;) {
    chunk[i] = std::min(dims[i], budget);
    budget /= chunk[i];
    if (chunk[i] < dims[i] || budget <= 1) break;
  }
  return chunk;
}

}  // namespace

struct H5Writer::Impl {
  std::string path, partial;       // the file's name, and where it is written until close()
  std::optional<H5::H5File> file;  // optional: HDF5's classes are not assignable

  template <typename F>
  void guarded(const std::string& what, F&& f) {
    if (!file) throw DumpError(fmt::format("{}: already closed, cannot write {}", path, what));
    try {
      f();
    } catch (const H5::Exception&) {
      throw DumpError(fmt::format("{}: cannot write {} (is the disk full, the path not writable, or the name taken?)",
                                  path, what));
    }
  }

  H5::DataSet create(const std::string& dataset, const H5::DataType& type, const std::vector<int64_t>& dims,
                     size_t values) {
    size_t n = 1;
    for (int64_t d : dims) n *= static_cast<size_t>(d);
    if (n != values)
      throw DumpError(fmt::format("{}: {}: {} values for a shape of {} elements", path, dataset, values, n));
    const std::vector<hsize_t> h(dims.begin(), dims.end());
    H5::LinkCreatPropList lcpl;
    lcpl.setCreateIntermediateGroup(true);
    // Every payload carries a Fletcher32 checksum, verified on read (a filter: chunked storage).
    // Empty datasets cannot be chunked, and have nothing to check.
    H5::DSetCreatPropList dcpl;
    if (n > 0 && !h.empty()) {
      const std::vector<hsize_t> chunk = chunk_dims(h, type.getSize());
      dcpl.setChunk(static_cast<int>(chunk.size()), chunk.data());
      dcpl.setFletcher32();
    }
    return file->createDataSet(dataset, type, H5::DataSpace(static_cast<int>(h.size()), h.data()), dcpl,
                               H5::DSetAccPropList::DEFAULT, lcpl);
  }

  H5::Attribute create_attr(const std::string& object, const std::string& name, const H5::DataType& type) {
    const H5::DataSpace scalar(H5S_SCALAR);
    if (object == "/") return file->createAttribute(name, type, scalar);
    if (file->childObjType(object) == H5O_TYPE_DATASET) return file->openDataSet(object).createAttribute(name, type, scalar);
    return file->openGroup(object).createAttribute(name, type, scalar);
  }
};

H5Writer::H5Writer(const std::string& path)
    : impl_(new Impl{path, fmt::format("{}.partial-{}", path, static_cast<long>(getpid())), {}}) {
  H5::Exception::dontPrint();
  try {
    // The HDF5 1.10 file format: checksummed superblock, object headers and indices, so a damaged
    // file is a checksum error on read rather than garbage or a crash.
    H5::FileAccPropList fapl;
    fapl.setLibverBounds(H5F_LIBVER_V110, H5F_LIBVER_V110);
    impl_->file.emplace(impl_->partial, H5F_ACC_TRUNC, H5::FileCreatPropList::DEFAULT, fapl);
  } catch (const H5::Exception&) {
    throw DumpError(fmt::format("{}: cannot create the file (does the directory exist and is it writable?)", path));
  }
}

// Not closed: a run that failed part-way. Its partial file goes; a file already at `path` stays.
H5Writer::~H5Writer() {
  if (!impl_->file) return;
  try {
    impl_->file->close();
  } catch (...) {  // destructors must not throw
  }
  std::error_code ignored;
  std::filesystem::remove(impl_->partial, ignored);
}

void H5Writer::close() {
  if (!impl_->file) return;
  impl_->guarded("the file", [&] { impl_->file->close(); });
  impl_->file.reset();
  std::error_code error;
  std::filesystem::rename(impl_->partial, impl_->path, error);  // one step: readers see the old file or the new
  if (error) {
    std::filesystem::remove(impl_->partial, error);
    throw DumpError(fmt::format("{}: cannot move the finished file into place ({})", impl_->path, error.message()));
  }
}

const std::string& H5Writer::path() const { return impl_->path; }

void H5Writer::write_floats(const std::string& dataset, const std::vector<int64_t>& dims,
                            const std::vector<float>& values, StoredDtype dtype) {
  int64_t overflow = -1;
  impl_->guarded(dataset, [&] {
    overflow = h5::write_from_float(impl_->create(dataset, h5::file_type(dtype), dims, values.size()), dtype, values);
  });
  if (overflow >= 0) {  // a value the file could not hold: an error, not an infinity (the partial file goes)
    std::vector<int64_t> index(dims.size());
    for (size_t i = dims.size(), rest = static_cast<size_t>(overflow); i-- > 0; rest /= static_cast<size_t>(dims[i]))
      index[i] = static_cast<int64_t>(rest % static_cast<size_t>(dims[i]));
    throw DumpError(fmt::format("{}: {}: value {} at [{}] overflows {} (largest finite {}); store float32 or rescale",
                                impl_->path, dataset, values[overflow], fmt::join(index, ", "), to_string(dtype),
                                dtype == StoredDtype::kFp16 ? "65504" : "3.39e38"));
  }
}

void H5Writer::write_doubles(const std::string& dataset, const std::vector<int64_t>& dims,
                             const std::vector<double>& values) {
  impl_->guarded(dataset, [&] {
    H5::DataSet ds = impl_->create(dataset, H5::PredType::IEEE_F64LE, dims, values.size());
    if (!values.empty()) ds.write(values.data(), H5::PredType::NATIVE_DOUBLE);
  });
}

void H5Writer::write_int32(const std::string& dataset, const std::vector<int64_t>& dims,
                           const std::vector<int32_t>& values) {
  impl_->guarded(dataset, [&] {
    H5::DataSet ds = impl_->create(dataset, H5::PredType::STD_I32LE, dims, values.size());
    if (!values.empty()) ds.write(values.data(), H5::PredType::NATIVE_INT32);
  });
}

void H5Writer::write_bytes(const std::string& dataset, const std::vector<int64_t>& dims,
                           const std::vector<uint8_t>& bytes, bool as_signed) {
  impl_->guarded(dataset, [&] {
    const H5::PredType& type = as_signed ? H5::PredType::STD_I8LE : H5::PredType::STD_U8LE;
    H5::DataSet ds = impl_->create(dataset, type, dims, bytes.size());
    if (!bytes.empty()) ds.write(bytes.data(), type);  // same size and order: the bytes go as they are
  });
}

void H5Writer::set_attr(const std::string& object, const std::string& name, const std::string& value) {
  impl_->guarded(object + " attribute " + name, [&] {
    // Fixed-length: the text sits in the checksummed object header. (Variable-length strings live in
    // the global heap, which has no checksum: a flipped byte there crashes HDF5 or goes unnoticed.)
    H5::StrType type(H5::PredType::C_S1, std::max<size_t>(1, value.size()));
    type.setCset(H5T_CSET_UTF8);
    type.setStrpad(H5T_STR_NULLPAD);
    impl_->create_attr(object, name, type).write(type, value);
  });
}

void H5Writer::set_attr(const std::string& object, const std::string& name, int64_t value) {
  impl_->guarded(object + " attribute " + name, [&] {
    impl_->create_attr(object, name, H5::PredType::STD_I64LE).write(H5::PredType::NATIVE_INT64, &value);
  });
}

void H5Writer::set_attr(const std::string& object, const std::string& name, double value) {
  impl_->guarded(object + " attribute " + name, [&] {
    impl_->create_attr(object, name, H5::PredType::IEEE_F64LE).write(H5::PredType::NATIVE_DOUBLE, &value);
  });
}

void H5Writer::set_bool_attr(const std::string& object, const std::string& name, bool value) {
  impl_->guarded(object + " attribute " + name, [&] {
    H5::EnumType type(H5::PredType::NATIVE_INT8);  // h5py's bool: enum {FALSE, TRUE} of int8
    int8_t f = 0, t = 1;  // EnumType::insert takes non-const pointers
    const int8_t v = value ? 1 : 0;
    type.insert("FALSE", &f);
    type.insert("TRUE", &t);
    impl_->create_attr(object, name, type).write(type, &v);
  });
}

}  // namespace kvq
