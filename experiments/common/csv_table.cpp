#include "experiments/common/csv_table.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "quant/errors.hpp"

namespace kvq {
namespace {

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') fields.back() += '"', ++i;
      else if (c == '"') quoted = false;
      else fields.back() += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else if (c != '\r') {
      fields.back() += c;
    }
  }
  return fields;
}

}  // namespace

CsvTable CsvTable::read(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open", path));
  CsvTable t;
  t.path_ = path;
  std::string line;
  if (!std::getline(in, line)) throw InputError(fmt::format("{}: empty file, expected a CSV header", path));
  const size_t first = line.find_first_not_of(" \t\r\xEF\xBB\xBF");
  if (first != std::string::npos && (line[first] == '{' || line[first] == '['))
    throw InputError(fmt::format("{}: JSON, expected a CSV file (a header line of column names)", path));
  t.header_ = split_csv_line(line);
  for (size_t number = 2; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    std::vector<std::string> fields = split_csv_line(line);
    if (fields.size() != t.header_.size())
      throw InputError(fmt::format("{}: line {}: {} fields, expected {} as in the header", path, number, fields.size(),
                                   t.header_.size()));
    t.cells_.push_back(std::move(fields));
  }
  return t;
}

bool CsvTable::has_column(const std::string& name) const {
  return std::find(header_.begin(), header_.end(), name) != header_.end();
}

size_t CsvTable::column(const std::string& name) const {
  const auto it = std::find(header_.begin(), header_.end(), name);
  if (it == header_.end()) throw InputError(fmt::format("{}: no column '{}'", path_, name));
  return static_cast<size_t>(it - header_.begin());
}

std::vector<size_t> CsvTable::columns(const std::vector<std::string>& names, const std::string& expected) const {
  std::vector<size_t> out;
  std::vector<std::string> missing;
  for (const std::string& name : names) {
    if (has_column(name)) out.push_back(column(name));
    else if (std::find(missing.begin(), missing.end(), name) == missing.end()) missing.push_back(name);
  }
  if (!missing.empty())
    throw InputError(fmt::format("{}: not {}: no column{} {}", path_, expected, missing.size() > 1 ? "s" : "",
                                 fmt::join(missing, ", ")));
  return out;
}

double CsvTable::number(size_t row, size_t column) const {
  const std::string& cell = cells_[row][column];
  char* end = nullptr;
  const double v = std::strtod(cell.c_str(), &end);
  if (cell.empty() || end != cell.c_str() + cell.size())
    throw InputError(fmt::format("{}: line {}: column '{}' is '{}', expected a number", path_, row + 2, header_[column], cell));
  return v;
}

}  // namespace kvq
