// HDF5 dumps: round trips through the writer and reader, hyperslab reads, and every kind of bad
// file giving a DumpError that names the file, the dataset and expected vs got.
#include <doctest/doctest.h>
#include <unistd.h>

#include <H5Cpp.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "data/dump.hpp"
#include "data/hdf5_types.hpp"
#include "data/synthetic.hpp"
#include "quant/float_formats.hpp"
#include "test_util.hpp"

using namespace kvq;
namespace fs = std::filesystem;

namespace {

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("kvq_test_" + std::to_string(getpid()) + "_" + name)).string();
}

KvLayer sample_layer(int index, int64_t tokens = 16) {
  SyntheticSpec spec;
  spec.batch = 3, spec.q_heads = 4, spec.kv_heads = 2, spec.tokens = tokens, spec.head_dim = 8, spec.q_len = 2;
  spec.seed = static_cast<uint64_t>(index);
  KvLayer l = make_synthetic(spec);
  l.layer = index;
  return l;
}

// A valid two-layer dump with q, seq_lens and tokens.
std::string write_sample(const std::string& name, StoredDtype dtype = StoredDtype::kFp32) {
  const std::string path = temp_path(name);
  DumpWriter w(path, {"synthetic:test", "kvq tests", "post"});
  KvLayer l0 = sample_layer(0), l1 = sample_layer(1);
  l1.alibi = true;
  l1.softmax_scale = 0.25;
  w.add_layer(l0, dtype);
  w.add_layer(l1, dtype);
  w.set_seq_lens({16, 0, 9});
  std::vector<int32_t> tokens(3 * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 500);
  w.set_tokens(tokens, 3, 16);
  w.close();
  return path;
}

std::string dump_error(const std::string& path) {
  return test::message_of<DumpError>([&] {
    const DumpInfo info = open_dump(path);
    for (size_t i = 0; i < info.layers.size(); ++i) read_layer(info, i);
  });
}

// Edits a copy of the sample dump with the HDF5 API.
std::string edited(const std::string& name, const std::function<void(H5::H5File&)>& edit) {
  const std::string path = write_sample(name);
  H5::H5File f(path, H5F_ACC_RDWR);
  edit(f);
  f.close();
  return path;
}

void replace_dataset(H5::H5File& f, const std::string& path, const H5::DataType& type, std::vector<hsize_t> dims) {
  f.unlink(path);
  const H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
  H5::DataSet ds = f.createDataSet(path, type, space);
  const size_t n = space.getSimpleExtentNpoints();
  std::vector<double> zeros(n, 0.0);
  if (n) ds.write(zeros.data(), H5::PredType::NATIVE_DOUBLE);
}

}  // namespace

TEST_CASE("dump round trip: fp32 exact, fp16 and bf16 rounded, attributes kept") {
  for (StoredDtype dtype : {StoredDtype::kFp32, StoredDtype::kFp16, StoredDtype::kBf16}) {
    CAPTURE(to_string(dtype));
    const std::string path = write_sample("roundtrip.h5", dtype);
    const DumpInfo info = open_dump(path);
    CHECK(info.source == "synthetic:test");
    CHECK(info.created_by == "kvq tests");
    CHECK(info.rope == "post");
    CHECK(info.batch == 3);
    CHECK(info.tokens == 16);
    CHECK(info.seq_lens == std::vector<int32_t>{16, 0, 9});
    REQUIRE(info.layers.size() == 2);
    CHECK(info.layers[0].k.dtype == dtype);
    CHECK(info.layers[1].alibi);
    CHECK(!info.layers[0].alibi);
    CHECK(info.layers[1].softmax_scale == 0.25);
    CHECK(info.layers[0].num_q_heads == 4);
    REQUIRE(info.layers[0].q);
    CHECK(info.layers[0].q->shape == std::vector<int64_t>{3, 4, 2, 8});

    const KvLayer want = sample_layer(1);
    const KvLayer got = read_layer(info, 1);
    CHECK(got.layer == 1);
    CHECK(got.alibi);
    CHECK(got.seq_lens == std::vector<int32_t>{16, 0, 9});
    REQUIRE(got.k.size() == want.k.size());
    auto stored = [&](float x) {
      return dtype == StoredDtype::kFp32 ? x : dtype == StoredDtype::kFp16 ? round_to_fp16(x) : round_to_bf16(x);
    };
    for (size_t i = 0; i < want.k.size(); ++i) {
      REQUIRE(got.k[i] == stored(want.k[i]));
      REQUIRE(got.v[i] == stored(want.v[i]));
    }
    for (size_t i = 0; i < want.q.size(); ++i) REQUIRE(got.q[i] == stored(want.q[i]));
    CHECK(read_tokens(info)[17] == 17);
    fs::remove(path);
  }
}

TEST_CASE("every fp16 and bf16 bit pattern survives the file exactly") {
  for (StoredDtype dtype : {StoredDtype::kFp16, StoredDtype::kBf16}) {
    KvLayer l;
    l.kv_shape = {1, 1, 65536 / 64, 64};
    for (uint32_t h = 0; h < 65536; ++h) {
      const float x = dtype == StoredDtype::kFp16 ? fp16_bits_to_fp32(uint16_t(h)) : bf16_bits_to_fp32(uint16_t(h));
      l.k.push_back(std::isnan(x) ? 0.0f : x);
    }
    l.v = l.k;
    const std::string path = temp_path("bits.h5");
    DumpWriter w(path, {"synthetic:bits"});
    w.add_layer(l, dtype);
    w.close();
    const KvLayer got = read_layer(open_dump(path), 0);
    for (size_t i = 0; i < l.k.size(); ++i) REQUIRE(float_bits(got.k[i]) == float_bits(l.k[i]));
    fs::remove(path);
  }
}

TEST_CASE("a batch range is read by hyperslab and equals the slice") {
  const std::string path = write_sample("slab.h5");
  const DumpInfo info = open_dump(path);
  const KvLayer all = read_layer(info, 0), part = read_layer(info, 0, 1, 2);
  CHECK(part.kv_shape.batch == 2);
  const size_t per_batch = all.k.size() / 3, q_per_batch = all.q.size() / 3;
  CHECK(std::equal(part.k.begin(), part.k.end(), all.k.begin() + per_batch));
  CHECK(std::equal(part.v.begin(), part.v.end(), all.v.begin() + per_batch));
  CHECK(std::equal(part.q.begin(), part.q.end(), all.q.begin() + q_per_batch));
  CHECK(part.seq_lens == std::vector<int32_t>{0, 9});
  CHECK(test::message_of<DumpError>([&] { read_layer(info, 0, 2, 2); }).find("batch range [2, 4) is outside [0, B=3)") !=
        std::string::npos);
  CHECK(test::message_of<DumpError>([&] { read_layer(info, 5); }).find("layer position 5 is out of range") !=
        std::string::npos);
  fs::remove(path);
}

TEST_CASE("a writer that fails part-way leaves an earlier file as it was and no partial file behind") {
  const std::string path = write_sample("atomic.h5");
  const auto bytes_of = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string before = bytes_of(path);
  const auto partial_files = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
      n += e.path().filename().string().rfind(fs::path(path).filename().string() + ".partial-", 0) == 0;
    return n;
  };
  {
    DumpWriter w(path, {"synthetic:test", "kvq tests", "post"});
    w.add_layer(sample_layer(0), StoredDtype::kFp16);
    CHECK(partial_files() == 1);  // written beside the path, not over it
    CHECK(bytes_of(path) == before);
  }  // destroyed unclosed, as when an exception leaves the command
  CHECK(partial_files() == 0);
  CHECK(bytes_of(path) == before);
  CHECK(open_dump(path).layers.size() == 2);
  {
    DumpWriter w(path, {"synthetic:test", "kvq tests", "post"});
    w.add_layer(sample_layer(0), StoredDtype::kFp16);
    w.close();  // closed: the new file replaces the old
  }
  CHECK(partial_files() == 0);
  CHECK(open_dump(path).layers.size() == 1);
  CHECK(test::message_of<DumpError>([] { DumpWriter w("/nonexistent/dir/x.h5", {"synthetic:test"}); }) ==
        "/nonexistent/dir/x.h5: cannot create the file (does the directory exist and is it writable?)");
  fs::remove(path);
}

TEST_CASE("a value beyond the stored dtype is an error naming the dataset and index, never an infinity in the file") {
  const std::string path = temp_path("overflow.h5");
  const auto write = [&](float value, StoredDtype dtype) {
    KvLayer l;
    l.kv_shape = {1, 2, 3, 4};
    l.k.assign(24, 1.0f);
    l.v.assign(24, -2.0f);
    l.v[1 * 12 + 2 * 4 + 3] = value;  // [0, 1, 2, 3]
    DumpWriter w(path, {"synthetic:overflow"});
    w.add_layer(l, dtype);
    w.close();
    return read_layer(open_dump(path), 0).v[23];
  };
  CHECK(write(65504.0f, StoredDtype::kFp16) == 65504.0f);
  CHECK(write(65519.0f, StoredDtype::kFp16) == 65504.0f);  // rounds down to the largest finite
  CHECK(write(-INFINITY, StoredDtype::kFp16) == -INFINITY);  // non-finite input is kept as it is
  CHECK(write(1e30f, StoredDtype::kFp32) == 1e30f);
  const std::string fp16 = test::message_of<DumpError>([&] { write(65520.0f, StoredDtype::kFp16); });
  CHECK(fp16 == path + ": /layers/0/v: value 65520 at [0, 1, 2, 3] overflows float16 (largest finite 65504); "
                       "store float32 or rescale");
  CHECK(read_layer(open_dump(path), 0).v[23] == 1e30f);  // the failed writer left the earlier file
  const std::string bf16 = test::message_of<DumpError>([&] { write(-3.4e38f, StoredDtype::kBf16); });
  CHECK(bf16.find(": /layers/0/v: value -3.4e+38 at [0, 1, 2, 3] overflows bfloat16") != std::string::npos);
  CHECK(read_layer(open_dump(path), 0).v[23] == 1e30f);
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    CHECK(e.path().filename().string().rfind(fs::path(path).filename().string() + ".partial-", 0) != 0);
  fs::remove(path);
}

TEST_CASE("synthetic parameters out of range are named with their values and rules, all at once") {
  SyntheticSpec s;
  s.head_dim = 7, s.token_spread = -1.0, s.rope_theta = 0.0;
  CHECK(test::message_of<InputError>([&] { make_synthetic(s); }) ==
        "synthetic: bad parameters: D=7 (need even and > 0: RoPE rotates pairs); outlier_channels=4 (need 0 .. D/2 = 3); "
        "token_spread=-1 (need finite, >= 0); rope_theta=0 (need finite, > 0)");
  SyntheticSpec n;
  n.outlier_scale = NAN;
  CHECK(test::message_of<InputError>([&] { make_synthetic(n); }) ==
        "synthetic: bad parameters: outlier_scale=nan (need finite)");
  SyntheticSpec q;
  q.tokens = 4, q.q_len = 5, q.sink_tokens = 6, q.q_heads = 6, q.kv_heads = 4;
  CHECK(test::message_of<InputError>([&] { make_synthetic(q); }) ==
        "synthetic: bad parameters: Hq=6 Hkv=4 (need both > 0, Hkv dividing Hq); Tq=5 (need 0 <= Tq <= T = 4); "
        "sink_tokens=6 (need 0 .. T = 4)");
  SyntheticSpec empty;
  empty.batch = 0, empty.tokens = 0, empty.q_len = 0, empty.sink_tokens = 0;
  CHECK(test::message_of<InputError>([&] { make_synthetic(empty); }) ==
        "synthetic: bad parameters: B=0 (need > 0: a dump holds no empty tensor); T=0 (need > 0: a dump holds no "
        "empty tensor)");
  CHECK_NOTHROW(make_synthetic(SyntheticSpec{}));
}

TEST_CASE("missing, empty and non-HDF5 files") {
  CHECK(dump_error("/nonexistent/x.h5") == "/nonexistent/x.h5: no such file");
  const std::string empty = temp_path("empty.h5");
  std::ofstream(empty).close();
  CHECK(dump_error(empty) == empty + ": empty file (0 bytes), not an HDF5 dump");
  const std::string text = temp_path("text.h5");
  std::ofstream(text) << "this is not HDF5\n";
  CHECK(dump_error(text).find("not an HDF5 file") != std::string::npos);
  fs::remove(empty);
  fs::remove(text);
}

TEST_CASE("truncated files at several offsets give a clear error and print nothing") {
  const std::string path = write_sample("full.h5");
  const auto size = fs::file_size(path);
  for (double frac : {0.001, 0.05, 0.3, 0.6, 0.95, 0.999}) {
    const auto cut = static_cast<uintmax_t>(static_cast<double>(size) * frac);
    CAPTURE(cut);
    const std::string t = temp_path("trunc.h5");
    fs::copy_file(path, t, fs::copy_options::overwrite_existing);
    fs::resize_file(t, cut);
    // Whatever HDF5 finds, nothing reaches stderr.
    std::fflush(stderr);
    const int saved = dup(2);
    std::FILE* sink = std::tmpfile();
    dup2(fileno(sink), 2);
    const std::string msg = dump_error(t);
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    CHECK(std::ftell(sink) == 0);
    std::fclose(sink);
    CHECK(msg.find(t + ": ") == 0);
    const bool says_why = msg.find("truncated") != std::string::npos || msg.find("corrupt") != std::string::npos ||
                          msg.find("not an HDF5 file") != std::string::npos;
    CHECK_MESSAGE(says_why, msg);
    fs::remove(t);
  }
  fs::remove(path);
}

TEST_CASE("flipped superblock bytes are detected") {
  const std::string path = write_sample("flip.h5");
  // Signature, superblock version, size of offsets, base address, root object header address.
  for (int offset : {0, 3, 8, 13, 24, 64}) {
    CAPTURE(offset);
    const std::string t = temp_path("flipped.h5");
    fs::copy_file(path, t, fs::copy_options::overwrite_existing);
    std::fstream f(t, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    const char c = static_cast<char>(f.get());
    f.seekp(offset);
    f.put(static_cast<char>(~c));
    f.close();
    const std::string msg = dump_error(t);
    CHECK(msg.find(t + ": ") == 0);
    fs::remove(t);
  }
  fs::remove(path);
}

TEST_CASE("schema violations name the dataset and say expected vs got") {
  using H5::PredType;
  struct Case {
    const char* name;
    std::function<void(H5::H5File&)> edit;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"rank", [](H5::H5File& f) { replace_dataset(f, "/layers/0/k", PredType::IEEE_F32LE, {3, 2, 16}); },
       "/layers/0/k: expected rank 4 [B, Hkv, T, D], got rank 3 [3, 2, 16]"},
      {"dtype int", [](H5::H5File& f) { replace_dataset(f, "/layers/0/k", PredType::STD_I32LE, {3, 2, 16, 8}); },
       "/layers/0/k: expected float16, bfloat16 or float32, got int32"},
      {"dtype f64", [](H5::H5File& f) { replace_dataset(f, "/layers/1/v", PredType::IEEE_F64LE, {3, 2, 16, 8}); },
       "/layers/1/v: expected float16, bfloat16 or float32, got float64"},
      {"shape", [](H5::H5File& f) { replace_dataset(f, "/layers/0/v", PredType::IEEE_F32LE, {3, 2, 15, 8}); },
       "/layers/0/v: expected shape [3, 2, 16, 8] (as k), got [3, 2, 15, 8]"},
      {"missing v", [](H5::H5File& f) { f.unlink("/layers/1/v"); }, "/layers/1/v: missing dataset"},
      {"zero size", [](H5::H5File& f) {
         replace_dataset(f, "/layers/0/k", PredType::IEEE_F32LE, {3, 2, 0, 8});
         replace_dataset(f, "/layers/0/v", PredType::IEEE_F32LE, {3, 2, 0, 8});
       },
       "/layers/0/k: zero-size dimension in shape [3, 2, 0, 8]"},
      {"seq_lens", [](H5::H5File& f) {
         f.unlink("/seq_lens");
         const int32_t sl[3] = {16, 17, 1};
         const hsize_t n = 3;
         f.createDataSet("/seq_lens", PredType::STD_I32LE, H5::DataSpace(1, &n)).write(sl, PredType::NATIVE_INT32);
       },
       "/seq_lens: seq_lens[1] = 17 is outside [0, T=16]"},
      {"seq_lens shape", [](H5::H5File& f) { replace_dataset(f, "/seq_lens", PredType::STD_I32LE, {2}); },
       "/seq_lens: expected shape [B] [3], got [2]"},
      {"q heads", [](H5::H5File& f) { replace_dataset(f, "/layers/0/q", PredType::IEEE_F32LE, {3, 3, 2, 8}); },
       "/layers/0/q: expected shape [B=3, Hq=4, Tq<=16, D=8], got [3, 3, 2, 8]"},
      {"tokens", [](H5::H5File& f) { replace_dataset(f, "/tokens", PredType::STD_I32LE, {3, 15}); },
       "/tokens: expected shape [B, T] [3, 16], got [3, 15]"},
      {"schema", [](H5::H5File& f) {
         f.removeAttr("kvq_schema");
         const int64_t two = 2;
         f.createAttribute("kvq_schema", PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR)).write(PredType::NATIVE_INT64, &two);
       },
       "/ attribute kvq_schema: expected 1, got 2"},
      {"no schema", [](H5::H5File& f) { f.removeAttr("kvq_schema"); }, "/ attribute kvq_schema: missing"},
      {"heads attr", [](H5::H5File& f) {
         H5::Group g = f.openGroup("/layers/1");
         g.removeAttr("num_kv_heads");
         const int64_t four = 4;
         g.createAttribute("num_kv_heads", PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR)).write(PredType::NATIVE_INT64, &four);
       },
       "/layers/1: attribute num_kv_heads is 4 but k has 2 heads"},
      {"layer name", [](H5::H5File& f) { f.move("/layers/1", "/layers/last"); },
       "/layers/last: layer group names must be layer indices 0, 1, ... (decimal, no leading zeros)"},
      {"layer name aliasing another", [](H5::H5File& f) { f.move("/layers/1", "/layers/00"); },
       "/layers/00: layer group names must be layer indices 0, 1, ... (decimal, no leading zeros)"},
      {"no layers", [](H5::H5File& f) {
         f.unlink("/layers/0");
         f.unlink("/layers/1");
       },
       "/layers: no layers"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const std::string path = edited("bad.h5", c.edit);
    CHECK(dump_error(path) == path + ": " + c.expected);
    fs::remove(path);
  }
}

namespace {

// Flips one bit at `offset` of a copy of `path`.
std::string flipped_copy(const std::string& path, uintmax_t offset, const std::string& name) {
  const std::string t = temp_path(name);
  fs::copy_file(path, t, fs::copy_options::overwrite_existing);
  std::fstream f(t, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  const char c = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x10));
  return t;
}

}  // namespace

TEST_CASE("kvq writes the HDF5 1.10 format, fixed-length text and Fletcher32-checked chunks") {
  const std::string path = write_sample("format.h5", StoredDtype::kBf16);
  {
    std::ifstream in(path, std::ios::binary);
    char head[9] = {};
    in.read(head, 9);
    CHECK(std::string(head + 1, 3) == "HDF");
    CHECK(static_cast<int>(head[8]) == 3);  // superblock version 3: checksummed, 1.10 format
  }
  H5::H5File f(path, H5F_ACC_RDONLY);
  for (const char* name : {"/layers/0/k", "/layers/1/v", "/layers/1/q", "/seq_lens", "/tokens"}) {
    CAPTURE(name);
    const H5::DSetCreatPropList dcpl = f.openDataSet(name).getCreatePlist();
    CHECK(dcpl.getLayout() == H5D_CHUNKED);
    CHECK(dcpl.allFiltersAvail());
    bool fletcher = false;
    for (int i = 0; i < dcpl.getNfilters(); ++i) {
      unsigned flags = 0, config = 0;
      size_t n = 0;
      char filter_name[64];
      fletcher = fletcher || dcpl.getFilter(i, flags, n, nullptr, sizeof filter_name, filter_name, config) == H5Z_FILTER_FLETCHER32;
    }
    CHECK(fletcher);
  }
  const H5::Attribute source = f.openAttribute("source");
  CHECK(!H5::StrType(source.getDataType().getId()).isVariableStr());  // inline: no unchecked global heap
  f.close();
  CHECK(open_dump(path).source == "synthetic:test");
  fs::remove(path);
}

TEST_CASE("a flipped byte anywhere in a kvq-written file is a corrupt-file error, most of them a checksum mismatch") {
  const std::string path = write_sample("flipall.h5");
  const auto size = fs::file_size(path);
  int corrupt = 0, checksum = 0, clean = 0;
  // Every 13th byte: the superblock, object headers, B-tree / index nodes, attributes and chunks.
  for (uintmax_t offset = 0; offset < size; offset += 13) {
    CAPTURE(offset);
    const std::string t = flipped_copy(path, offset, "flipone.h5");
    try {
      const DumpInfo info = open_dump(t);
      for (size_t i = 0; i < info.layers.size(); ++i) read_layer(info, i);
      read_tokens(info);
      ++clean;  // unused bytes (free space, padding)
    } catch (const CorruptFileError& e) {
      ++corrupt;
      checksum += std::string(e.what()).find("checksum mismatch") != std::string::npos;
      CHECK(std::string(e.what()).find(t + ": ") == 0);
    } catch (const DumpError& e) {  // a schema check saw it first (e.g. the superblock's signature)
      ++corrupt;
      CHECK(std::string(e.what()).find(t + ": ") == 0);
    }
    fs::remove(t);
  }
  MESSAGE(fmt::format("{} offsets: {} detected ({} checksum mismatches), {} harmless", (size + 12) / 13, corrupt, checksum, clean));
  CHECK(checksum > corrupt / 2);
  fs::remove(path);
}

TEST_CASE("a flipped data byte is caught by Fletcher32 when the layer is read") {
  const std::string path = write_sample("fletcher.h5");
  uintmax_t offset = 0;
  {
    H5::H5File f(path, H5F_ACC_RDONLY);
    const H5::DataSet ds = f.openDataSet("/layers/1/v");
    haddr_t addr = 0;
    hsize_t chunk_size = 0;
    const hsize_t origin[4] = {0, 0, 0, 0};
    unsigned mask = 0;
    REQUIRE(H5Dget_chunk_info_by_coord(ds.getId(), origin, &mask, &addr, &chunk_size) >= 0);
    offset = addr + chunk_size / 2;
  }
  const std::string t = flipped_copy(path, offset, "fletcher_flip.h5");
  const DumpInfo info = open_dump(t);  // metadata intact
  CHECK_NOTHROW(read_layer(info, 0));
  CHECK(test::message_of<CorruptFileError>([&] { read_layer(info, 1); }) ==
        t + ": /layers/1/v: cannot read the data (checksum mismatch: the file is corrupt)");
  fs::remove(t);
  fs::remove(path);
}

TEST_CASE("declared sizes beyond any memory are refused before allocating") {
  const std::string path = edited("huge.h5", [](H5::H5File& f) {
    for (const char* name : {"/layers/0/k", "/layers/0/v"}) {
      f.unlink(name);
      const hsize_t dims[4] = {3, 2, hsize_t{1} << 46, 8}, chunk[4] = {1, 1, 1024, 8};
      H5::DSetCreatPropList dcpl;
      dcpl.setChunk(4, chunk);
      f.createDataSet(name, H5::PredType::IEEE_F32LE, H5::DataSpace(4, dims), dcpl);  // no data: fill values
    }
    f.unlink("/layers/1");
  });
  CHECK(dump_error(path).find("declares more than 2^48 elements") != std::string::npos);
  const std::string big = edited("big.h5", [](H5::H5File& f) {
    for (const char* name : {"/layers/0/k", "/layers/0/v", "/layers/1/k", "/layers/1/v"}) {
      f.unlink(name);
      const hsize_t dims[4] = {3, 2, 16, hsize_t{1} << 36}, chunk[4] = {1, 1, 1, 1024};
      H5::DSetCreatPropList dcpl;
      dcpl.setChunk(4, chunk);
      f.createDataSet(name, H5::PredType::IEEE_F32LE, H5::DataSpace(4, dims), dcpl);
    }
    f.unlink("/layers/0/q");
    f.unlink("/layers/1/q");
    for (const char* g : {"/layers/0", "/layers/1"}) {
      H5::Group grp = f.openGroup(g);
      grp.removeAttr("head_dim");
      const int64_t d = int64_t{1} << 36;
      grp.createAttribute("head_dim", H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR)).write(H5::PredType::NATIVE_INT64, &d);
    }
  });
  CHECK(dump_error(big).find("GiB in memory, more than this machine's") != std::string::npos);
  fs::remove(path);
  fs::remove(big);
}

TEST_CASE("non-finite decode queries name the dataset and the first index") {
  const std::string path = write_sample("nanq.h5");
  const DumpInfo info = open_dump(path);
  KvLayer l = read_layer(info, 1);
  CHECK_NOTHROW(check_finite_queries(info, 1, l));
  l.q[((2 * 4 + 3) * 2 + 1) * 8 + 5] = NAN;  // [b=2, h=3, i=1, d=5]
  l.q.back() = INFINITY;
  CHECK(test::message_of<InputError>([&] { check_finite_queries(info, 1, l); }) ==
        path + ": /layers/1/q: non-finite value nan at [2, 3, 1, 5] (attention needs finite queries)");
  fs::remove(path);
}
