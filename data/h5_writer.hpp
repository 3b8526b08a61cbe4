// Writes the HDF5 files kvq produces (dumps, quantized tensors, reference outputs): datasets by
// path (intermediate groups made as needed) and attributes in the forms h5py reads back as
// str / int / float / bool. Every HDF5 failure becomes a DumpError naming the file and object.
// The file is written beside its path (PATH.partial-PID) and moved onto it by close(): a writer
// destroyed unclosed (an error part-way) removes its partial file and leaves an earlier PATH as it was.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/dump.hpp"

namespace kvq {

class H5Writer {
 public:
  explicit H5Writer(const std::string& path);
  ~H5Writer();
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;

  void write_floats(const std::string& dataset, const std::vector<int64_t>& dims, const std::vector<float>& values,
                    StoredDtype dtype);  // rounded to dtype
  void write_doubles(const std::string& dataset, const std::vector<int64_t>& dims, const std::vector<double>& values);
  void write_int32(const std::string& dataset, const std::vector<int64_t>& dims, const std::vector<int32_t>& values);
  // Raw bytes as int8 (signed) or uint8 elements.
  void write_bytes(const std::string& dataset, const std::vector<int64_t>& dims, const std::vector<uint8_t>& bytes,
                   bool as_signed);

  // Attributes on the object at `object` ("/" or a group or dataset path, which must exist).
  void set_attr(const std::string& object, const std::string& name, const std::string& value);
  void set_attr(const std::string& object, const std::string& name, const char* value) {
    set_attr(object, name, std::string(value));
  }
  void set_attr(const std::string& object, const std::string& name, int64_t value);
  void set_attr(const std::string& object, const std::string& name, double value);
  void set_bool_attr(const std::string& object, const std::string& name, bool value);

  void close();  // finishes the file and moves it onto path; without it nothing is written
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvq
