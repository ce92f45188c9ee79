// The MoE feed-forwards (docs/model.md for the semantics, docs/grid.md for expert
// parallelism), built from a mode's MoePlacement:
//  - the router and the routing (moe_router.hpp);
//  - the experts a rank holds and their products (moe_experts.hpp);
//  - LocalMoE and ExpertParallelMoE, which route tokens to the experts here or on the
//    ranks of the "ep" group (moe_dispatch.hpp);
//  - the wrappers of the tensor-parallel layouts around them (moe_shares.hpp):
//    TokenShareMoE (1d), FeatureShareMoE (2d, 3d), ExpertTensorMoE and
//    ReplicatedExpertTensorMoE (expert tensor parallelism).
//
// Forward: logits = x Wr, softmax and top-k (kernels::moe_route), the pairs sorted by
// expert into contiguous rows (moe_dispatch), the rows of x gathered, each expert's MLP
// run on its rows with ordinary gemms (ExpertBank), and the outputs combined with the
// gates. The expert matmuls' sizes are needed on the host: one small copy (E + 1 ints)
// from the device per layer and micro-batch (and, with expert parallelism, an all_to_all
// of E ints: the rows each rank receives for each expert).

#include "moe_dispatch.hpp"
#include "moe_shares.hpp"

#include <memory>

namespace cubelm::tp::detail {

template <class T>
std::unique_ptr<MoE<T>> make_moe(Params<T>& params, Workspace<T>& ws, const MoeNames& names,
                                 const MoeShape& shape, const MoeSizes& sizes,
                                 const MoePlacement& at) {
  const bool spread = at.ep != nullptr && at.ep->size() > 1;
  if (at.tensor == nullptr || at.tensor->size() == 1) {
    if (spread)
      return std::make_unique<ExpertParallelMoE<T>>(params, ws, names, shape, sizes, *at.ep,
                                                    nullptr, at.context, nullptr);
    return std::make_unique<LocalMoE<T>>(params, ws, names, shape, sizes, at.context, nullptr);
  }
  const comm::Group& tensor = *at.tensor;
  // The ranks holding the same rows: the whole group in 1d, the feature group in 2d/3d.
  const int c = at.features != nullptr ? at.features->size() : tensor.size();
  CUBELM_ASSERT(sizes.rows % c == 0 && sizes.hidden % c == 0,
                "MoE layers under tensor parallelism need the tokens to split evenly");
  MoeSizes share = sizes; // each rank routes an equal share of the rows
  share.rows = sizes.rows / c;
  std::unique_ptr<MoE<T>> inner;
  if (at.expert_tensor) {
    CUBELM_ASSERT(4 * sizes.hidden % tensor.size() == 0,
                  "expert tensor parallelism splits 4 x model.hidden over tensor_size");
    MoeSizes all = sizes; // every rank routes the group's gathered shares
    all.rows = share.rows * tensor.size();
    std::unique_ptr<MoE<T>> routed;
    if (spread)
      routed = std::make_unique<ExpertParallelMoE<T>>(params, ws, names, shape, all, *at.ep,
                                                      nullptr, at.context, &tensor);
    else
      routed = std::make_unique<LocalMoE<T>>(params, ws, names, shape, all, at.context, &tensor);
    // 1d without sequence parallelism: the rows are the group's tokens already.
    if (at.features == nullptr && !at.sequence_parallel)
      return std::make_unique<ReplicatedExpertTensorMoE<T>>(std::move(routed), tensor);
    inner = std::make_unique<ExpertTensorMoE<T>>(std::move(routed), tensor, share.rows,
                                                 sizes.hidden, ws);
  } else {
    CUBELM_ASSERT(spread && at.ep->size() % tensor.size() == 0,
                  "MoE layers under tensor parallelism spread their experts over the tensor "
                  "ranks: parallel.expert_size must be a multiple of tensor_size");
    inner = std::make_unique<ExpertParallelMoE<T>>(params, ws, names, shape, share, *at.ep, &tensor,
                                                   at.context, nullptr);
  }
  if (at.features != nullptr)
    return std::make_unique<FeatureShareMoE<T>>(std::move(inner), *at.features, sizes.rows,
                                                sizes.hidden, ws);
  return std::make_unique<TokenShareMoE<T>>(std::move(inner), tensor, at.sequence_parallel,
                                            sizes.rows, sizes.hidden, ws);
}

template std::unique_ptr<MoE<float>> make_moe<float>(Params<float>&, Workspace<float>&,
                                                     const MoeNames&, const MoeShape&,
                                                     const MoeSizes&, const MoePlacement&);
template std::unique_ptr<MoE<bf16>> make_moe<bf16>(Params<bf16>&, Workspace<bf16>&, const MoeNames&,
                                                   const MoeShape&, const MoeSizes&,
                                                   const MoePlacement&);
template std::unique_ptr<MoE<double>> make_moe<double>(Params<double>&, Workspace<double>&,
                                                       const MoeNames&, const MoeShape&,
                                                       const MoeSizes&, const MoePlacement&);

} // namespace cubelm::tp::detail
