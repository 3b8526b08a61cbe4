// K and V scheme pairs: the sweep's default set and crossed lists. Shared by the sweep, the gate
// and the Python module (kvq.default_pairs), so that every tool means the same by "the default set".
#pragma once

#include <vector>

#include "quant/scheme.hpp"

namespace kvq {

struct SchemePair {
  Scheme k, v;
};

// Every K scheme with every V scheme.
std::vector<SchemePair> cross_pairs(const std::vector<Scheme>& k, const std::vector<Scheme>& v);

// The default set, for a head_dim: int8 and int4 x {tensor, token, head, g64, g32, g16, g8 (where
// G < D divides D)} x {sym, asym}, the same scheme on K and V; plus KIVI-style per-channel K
// (chan-t32, asymmetric) with per-token V.
std::vector<SchemePair> default_pairs(int64_t head_dim);

}  // namespace kvq
