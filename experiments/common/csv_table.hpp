// A small reader for the CSV files kvq writes (RFC 4180 quoting), to look columns up by name.
#pragma once

#include <string>
#include <vector>

namespace kvq {

class CsvTable {
 public:
  // Throws InputError naming the file and line for unreadable files and ragged rows.
  static CsvTable read(const std::string& path);

  size_t rows() const { return cells_.size(); }
  bool has_column(const std::string& name) const;
  // Throws InputError naming the file and the column when it is missing.
  size_t column(const std::string& name) const;
  // The columns of `names`, in order; throws InputError naming the file, every missing column and
  // `expected` (what the file should have been, e.g. "kvq sweep's sweep.csv").
  std::vector<size_t> columns(const std::vector<std::string>& names, const std::string& expected) const;
  const std::string& at(size_t row, size_t column) const { return cells_[row][column]; }
  // The cell as a number; throws InputError naming file, line and column when it is not one.
  double number(size_t row, size_t column) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> cells_;
};

}  // namespace kvq
