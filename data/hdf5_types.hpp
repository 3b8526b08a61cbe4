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

// Reads `count` values of `dataset` (selection `file_space`, or all) into fp32, exactly.
std::vector<float> read_as_float(const H5::DataSet& dataset, StoredDtype dtype, const H5::DataSpace& mem_space,
                                 const H5::DataSpace& file_space, size_t count);

// Writes fp32 values, rounded to `dtype`.
void write_from_float(const H5::DataSet& dataset, StoredDtype dtype, const std::vector<float>& values);

}  // namespace kvq::h5
