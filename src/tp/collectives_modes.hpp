#pragma once
// The descriptions of tp/collectives.hpp, one function per mode (collectives_1d.cpp,
// collectives_2d.cpp, collectives_3d.cpp) and the MoE feed-forward's part that all modes
// share (collectives.cpp). Internal to src/tp; no Kokkos.

#include "cubelm/tp/collectives.hpp"

#include <vector>

namespace cubelm::tp::detail {

// The sizes a description needs: N tokens of the micro-batch on this rank's group, H
// features, V the padded vocabulary, T the sequence length, E experts of which each token
// takes k.
struct Sizes {
  const comm::Layout& layout;
  double N, H, V, T, E, k;
  double p() const { return layout.tp; }
  double q() const { return layout.side(); }
};

// Appends to a description.
class Describe {
public:
  explicit Describe(std::vector<Collective>& out) : out_(out) {}
  void operator()(const char* group, comm::Kind kind, double calls, double elements,
                  double bytes = 0) const {
    out_.push_back({group, kind, calls, elements, bytes});
  }

private:
  std::vector<Collective>& out_;
};

void describe_1d(const Sizes& s, Piece piece, Pass pass, const Describe& add);
void describe_2d(const Sizes& s, Piece piece, Pass pass, const Describe& add);
void describe_3d(const Sizes& s, Piece piece, Pass pass, const Describe& add);

} // namespace cubelm::tp::detail
