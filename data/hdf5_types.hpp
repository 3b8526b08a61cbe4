// HDF5 float types for the stored dtypes, and raw conversion to fp32 through quant/float_formats
// (HDF5 1.10 has no half or bfloat16 type: both are declared as custom IEEE-style float types,
// which h5py reads as float32 and writes with the same declaration).
#pragma once

#include <H5Cpp.h>

#include <optional>
#include <vector>

#include "data/dump.hpp"

namespace kvq::h5 {

H5::FloatType file_type(StoredDtype dtype);  // little-endian

// The stored dtype of an HDF5 type, or nullopt when it is not one of ours.
std::optional<StoredDtype> stored_dtype_of(const H5::DataType& type);

// A readable name for an HDF5 type in messages: "float64", "int32", "float (2 bytes, fields ...)".
std::string describe(const H5::DataType& type);

// Turns off HDF5's printing of its error stack and instead records why calls fail, for
// failure_reason(). (By the time a C++ exception is caught, destructors' HDF5 calls have cleared the
// stack, so it is read as the failing call returns.)
void record_failures();
// Forgets the recorded failures; call before a guarded group of HDF5 calls.
void clear_failures();
// Why HDF5 calls failed since clear_failures(), for messages: "checksum mismatch: the file is
// corrupt", "the file is truncated", "... newer HDF5 format", else "the file is truncated or corrupt".
std::string failure_reason();

// Reads `count` values of `dataset` (selection `file_space`, or all) into fp32, exactly.
std::vector<float> read_as_float(const H5::DataSet& dataset, StoredDtype dtype, const H5::DataSpace& mem_space,
                                 const H5::DataSpace& file_space, size_t count);

// Writes fp32 values, rounded to `dtype`. Returns the index of the first finite value that rounding
// made infinite (beyond float16's 65504 or bfloat16's range), -1 where none did: the caller's error.
int64_t write_from_float(const H5::DataSet& dataset, StoredDtype dtype, const std::vector<float>& values);

}  // namespace kvq::h5
