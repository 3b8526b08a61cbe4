// The tensor-core decode kernels' stage rows (gpu/decode_tc_traits.cuh), checked on the host: every
// element a word of its own, each 16-byte copy on one 32-byte sector of shared memory where the layout
// puts rows on sectors, and the fragment reads of decode_tc_fragments.cuh each in 32 different banks
// (or one word shared by lanes).
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gpu/decode_tc_traits.cuh"

using namespace kvq;

namespace {

// One shared-memory load of a warp: the words each lane reads (a 64-bit load: two words).
using Read = std::vector<std::vector<int>>;

// Conflict-free: no two lanes read different words of one bank. 64-bit loads go in two half-warp passes.
bool conflict_free(const Read& read) {
  const bool wide = read[0].size() == 2;
  for (int pass = 0; pass < (wide ? 2 : 1); ++pass) {
    std::map<int, int> word_of_bank;
    for (int lane = wide ? 16 * pass : 0; lane < (wide ? 16 * pass + 16 : 32); ++lane)
      for (int w : read[lane]) {
        auto [it, fresh] = word_of_bank.emplace(w % 32, w);
        if (!fresh && it->second != w) return false;
      }
  }
  return true;
}

template <typename Rows>
void check_rows(int rows, bool on_sectors, const std::string& what) {
  CAPTURE(what);
  std::set<int> words;
  for (int r = 0; r < rows; ++r)
    for (int w = 0; w < Rows::kWords; ++w) words.insert(Rows::word(r, w));
  CHECK(words.size() == static_cast<size_t>(rows * Rows::kWords));  // no two elements share a word
  CHECK(*words.rbegin() < rows * Rows::kStride);                    // within the stage's rows
  // copy_step's passes add even_rows_words(m) to a row's word for the row m further (m even)
  int not_affine = 0;
  for (int r = 0; r < rows; ++r)
    for (int m = 0; r + m < rows; m += 2) not_affine += Rows::word(r + m, 0) != Rows::word(r, 0) + Rows::even_rows_words(m);
  CHECK(not_affine == 0);
  if (!on_sectors) return;
  int off_sector = 0;
  for (int r = 0; r < rows; ++r)
    for (int w = 0; w < Rows::kWords; w += 8)
      off_sector += Rows::word(r, w) % 4 != 0 || Rows::word(r, w + 4) % 4 != 0 ||
                    Rows::word(r, w) / 8 != Rows::word(r, w + 4) / 8;
  CHECK(off_sector == 0);
}

// The words a lane loads for the k-th 16-bit pair of an operand row: two words of 16-bit values, one
// of 8-bit codes (four elements), half of one of 4-bit codes.
template <int bits, typename Rows>
std::vector<int> pair_words(int row, int k) {
  if constexpr (bits == 16) return {Rows::word(row, 2 * k), Rows::word(row, 2 * k + 1)};
  else if constexpr (bits == 8) return {Rows::word(row, k)};
  else return {Rows::word(row, k / 2)};
}

// K: lane (g, c) reads key rows 16 mt + g and + 8 of k-slice j (k_fragment).
template <KvFormat F, typename Rows>
void check_k_reads(int slices, const std::string& what) {
  CAPTURE(what);
  constexpr int bits = detail::TcOperand<F>::kBits;
  for (int mt = 0; mt < 2; ++mt)
    for (int j = 0; j < slices; ++j)
      for (int half = 0; half < 2; ++half) {
        Read read(32);
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, c = lane % 4, row = 16 * mt + g + 8 * half;
          read[lane] = pair_words<bits, Rows>(row, 4 * j + c);
        }
        CAPTURE(mt);
        CAPTURE(j);
        CAPTURE(half);
        CHECK(conflict_free(read));
      }
}

// V: lane (g, c) reads keys 16 mt + 2c + {0, 1, 8, 9}, one a load, at its columns of m-tile pair i.
template <KvFormat F, typename Rows>
void check_v_reads(int pairs, const std::string& what) {
  CAPTURE(what);
  constexpr int bits = detail::TcOperand<F>::kBits;
  for (int mt = 0; mt < 2; ++mt)
    for (int i = 0; i < pairs; ++i)
      for (int d : {0, 1, 8, 9}) {
        Read read(32);
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, c = lane % 4, row = 16 * mt + 2 * c + d;
          read[lane] = pair_words<bits, Rows>(row, 8 * i + g);
        }
        CAPTURE(mt);
        CAPTURE(i);
        CAPTURE(d);
        CHECK(conflict_free(read));
      }
}

// int4 K a word a lane for two k-slices (k_fragment<.., kWords>): lane (g, c) reads word
// tc_int4_k_word(j, c) of rows 16 mt + g and + 8, in 32 banks; the element the fragment puts at each k
// position (a packed row holds element e in nibble e % 8 of word e / 8) is the Q element the prologue
// stores in that slot, and the slots are a permutation of the row.
template <typename Rows>
void check_int4_k_words(int slices, const std::string& what) {
  CAPTURE(what);
  for (int mt = 0; mt < 2; ++mt)
    for (int j = 0; j < slices; ++j)
      for (int half = 0; half < 2; ++half) {
        Read read(32);
        for (int lane = 0; lane < 32; ++lane)
          read[lane] = {Rows::word(16 * mt + lane / 4 + 8 * half, detail::tc_int4_k_word(j, lane % 4))};
        CAPTURE(j);
        CHECK(conflict_free(read));
      }
  const int d_max = 16 * slices;
  std::set<int> slots;
  for (int d = 0; d < d_max; ++d) slots.insert(detail::tc_int4_k_q_slot(d));
  CHECK(slots.size() == static_cast<size_t>(d_max));
  CHECK(*slots.rbegin() == d_max - 1);
  int wrong = 0;
  for (int j = 0; j < slices; ++j)
    for (int c = 0; c < 4; ++c) {
      // the word shifted right by a byte for odd j; pairs low: nibbles (0, 4), high: (1, 5)
      const int first = 8 * detail::tc_int4_k_word(j, c) + 2 * (j & 1);
      const int element[4] = {first, first + 4, first + 1, first + 5};
      for (int k = 0; k < 4; ++k) wrong += detail::tc_int4_k_q_slot(element[k]) != 16 * j + 4 * c + k;
    }
  CHECK(wrong == 0);
}

// int4 V likewise (v_fragments<.., kWords>): lane (g, c) reads word tc_int4_v_word(i, g) of keys
// 16 mt + 2c + {0, 1, 8, 9}, in 32 banks; m-tile j's row g takes byte 2 (i % 2) + j % 2's low nibble
// (row g + 8 its high one), which is the element the kernel stores that accumulator as
// (tc_v_row_element), and the rows of the m-tiles cover the row once.
template <typename Rows>
void check_int4_v_words(int pairs, const std::string& what) {
  CAPTURE(what);
  for (int mt = 0; mt < 2; ++mt)
    for (int i = 0; i < pairs; ++i)
      for (int key : {0, 1, 8, 9}) {
        Read read(32);
        for (int lane = 0; lane < 32; ++lane)
          read[lane] = {Rows::word(16 * mt + 2 * (lane % 4) + key, detail::tc_int4_v_word(i, lane / 4))};
        CAPTURE(i);
        CHECK(conflict_free(read));
      }
  std::set<int> elements;
  int wrong = 0;
  for (int j = 0; j < 2 * pairs; ++j)
    for (int g = 0; g < 8; ++g) {
      const int i = j / 2, byte = 2 * (i % 2) + j % 2;
      const int element = 8 * detail::tc_int4_v_word(i, g) + 2 * byte;  // the byte's low nibble
      wrong += detail::tc_v_row_element(j, g, true) != element;
      elements.insert(element), elements.insert(element + 1);
    }
  CHECK(wrong == 0);
  CHECK(elements.size() == static_cast<size_t>(32 * pairs));
  CHECK(*elements.rbegin() == 32 * pairs - 1);
}

// The warps' O in the merge area (tc_w_o_slot): a permutation of each head's row; every store of
// the epilogue (accumulator j, element e: lane (g, c) writes head 2c + e % 2, element
// tc_v_row_element(j, g) + e / 2) and every read of 32 aligned elements of a row in 32 banks.
void check_w_o_slots(int d_max, bool int4_words) {
  CAPTURE(d_max);
  CAPTURE(int4_words);
  for (int h = 0; h < 8; ++h) {
    std::set<int> slots;
    for (int d = 0; d < d_max; ++d) slots.insert(detail::tc_w_o_slot(h, d));
    CHECK(slots.size() == static_cast<size_t>(d_max));
    CHECK(*slots.rbegin() == d_max - 1);
  }
  for (int j = 0; j < d_max / 16; ++j)
    for (int e = 0; e < 4; ++e) {
      Read store(32);
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, h = 2 * (lane % 4) + e % 2;
        store[lane] = {h * d_max + detail::tc_w_o_slot(h, detail::tc_v_row_element(j, g, int4_words) + e / 2)};
      }
      CAPTURE(j);
      CAPTURE(e);
      CHECK(conflict_free(store));
    }
  for (int h = 0; h < 8; ++h)
    for (int d0 = 0; d0 < d_max; d0 += 32) {
      Read read(32);
      for (int lane = 0; lane < 32; ++lane) read[lane] = {h * d_max + detail::tc_w_o_slot(h, d0 + lane)};
      CHECK(conflict_free(read));
    }
}

template <KvFormat FK, KvFormat FV, int D, TcConfig C = TcConfig::kStandard>
void check_traits(const std::string& what) {
  using Tr = detail::TcTraits<FK, FV, D, C>;
  // On sectors: V's rows (pairs of rows padded together; 5-bit V only at D = 256, its rows of 10 / 20
  // words at D = 64 / 128 are not whole sectors) and 16-bit K (padded by 8 words). Quantized K rows stay
  // padded by 4 words, off-sector every other row: an XOR swizzle that put them on sectors measured
  // slower on the H100 (registers, a third CTA an SM;
  // experiments/results/nvidia-h100-80gb-hbm3/decode-l2-sectors/k-row-swizzle/).
  constexpr bool k16 = detail::TcOperand<FK>::kBits == 16, v5 = detail::TcOperand<FV>::kBits == 5;
  check_rows<typename Tr::KRows>(Tr::kStepTokens, k16, what + " K");
  check_rows<typename Tr::VRows>(Tr::kStepTokens, !v5 || D == 256, what + " V");
  if constexpr (detail::TcOperand<FK>::kBits != 5) check_k_reads<FK, typename Tr::KRows>(Tr::kSlices, what + " K");
  if constexpr (detail::TcOperand<FV>::kBits != 5) check_v_reads<FV, typename Tr::VRows>(Tr::kSlices / 2, what + " V");
}

template <int D>
void check_head_dim() {
  const std::string d = " D=" + std::to_string(D);
  check_traits<KvFormat::kBf16, KvFormat::kBf16, D>("bf16" + d);
  check_traits<KvFormat::kFp16, KvFormat::kFp16, D>("fp16" + d);
  check_traits<KvFormat::kInt8, KvFormat::kInt8, D>("int8" + d);
  check_traits<KvFormat::kFp8E4m3, KvFormat::kFp8E4m3, D>("fp8" + d);
  check_traits<KvFormat::kInt4, KvFormat::kInt4, D>("int4" + d);
  check_int4_k_words<typename detail::TcTraits<KvFormat::kInt4, KvFormat::kInt4, D>::KRows>(D / 16, "int4 K words" + d);
  check_int4_v_words<typename detail::TcTraits<KvFormat::kInt4, KvFormat::kInt4, D>::VRows>(D / 32, "int4 V words" + d);
  check_w_o_slots(D, false);
  check_w_o_slots(D, true);
  check_traits<KvFormat::kLut4, KvFormat::kLut4, D>("lut4" + d);
  check_traits<KvFormat::kInt5, KvFormat::kInt5, D>("int5" + d);
  check_traits<KvFormat::kInt8, KvFormat::kBf16, D>("int8/bf16" + d);
  check_traits<KvFormat::kBf16, KvFormat::kInt4, D>("bf16/int4" + d);
  if constexpr (D != 256) {  // 32-key steps of 16-bit K and V (TcConfig::kLongSteps)
    check_traits<KvFormat::kBf16, KvFormat::kBf16, D, TcConfig::kLongSteps>("bf16 long steps" + d);
    check_traits<KvFormat::kFp16, KvFormat::kFp16, D, TcConfig::kLongSteps>("fp16 long steps" + d);
    using Long = detail::TcTraits<KvFormat::kBf16, KvFormat::kBf16, D, TcConfig::kLongSteps>;
    CHECK(Long::kStepTokens == 32);
    CHECK(Long::kSplitRound == 2 * detail::TcTraits<KvFormat::kBf16, KvFormat::kBf16, D>::kSplitRound);
    DecodeParams raw;
    raw.head_dim = D;
    const int smem = detail::tc_smem_bytes<KvFormat::kBf16, KvFormat::kBf16, D, TcConfig::kLongSteps>(raw);
    CHECK(smem <= 227 * 1024);  // a CTA's opt-in shared memory on sm_90
    CHECK(Long::kMinCtas * (smem + 1024) <= 228 * 1024);  // the registers budgeted for CTAs that fit
  }
  if constexpr (D == 128) {  // int4 K and V by the row, registers for four CTAs (TcConfig::kFourCtas)
    using Four = detail::TcTraits<KvFormat::kInt4, KvFormat::kInt4, D, TcConfig::kFourCtas>;
    using Three = detail::TcTraits<KvFormat::kInt4, KvFormat::kInt4, D>;
    CHECK(Four::kMinCtas == 4);
    CHECK(Three::kMinCtas == 3);
    CHECK(Four::kSplitRound == Three::kSplitRound);  // the same tiles: only the register budget differs
    DecodeParams rows;
    rows.head_dim = D;
    for (KvOperand* op : {&rows.k, &rows.v}) op->mode = ParamMode::kHead, op->asymmetric = true;
    const int smem = detail::tc_smem_bytes<KvFormat::kInt4, KvFormat::kInt4, D, TcConfig::kFourCtas>(rows);
    CHECK(smem == detail::tc_smem_bytes<KvFormat::kInt4, KvFormat::kInt4, D>(rows));
    CHECK(Four::kMinCtas * (smem + 1024) <= 228 * 1024);  // four CTAs' shared memory fits an SM
  }
}

}  // namespace

TEST_CASE("tensor-core stage rows: words of their own, 16-byte copies on 32-byte sectors, reads in 32 banks") {
  check_head_dim<64>();
  check_head_dim<128>();
  check_head_dim<256>();
}
