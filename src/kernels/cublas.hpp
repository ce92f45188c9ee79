#pragma once
// cuBLAS as Kokkos Kernels holds it: the handle its gemm uses (so that the math
// mode cubelm sets applies to every product) and the status check of the calls
// cubelm makes itself (bf16 and batched products). Internal to src/kernels;
// CUDA builds only.

#include "cubelm/core/error.hpp"

// KokkosKernels_config.h first (its own block, so that sorting keeps it there): it says
// whether cuBLAS is enabled, which KokkosBlas_tpl_spec.hpp reads.
#include <KokkosKernels_config.h>

#include <KokkosBlas_tpl_spec.hpp>
#include <cublas_v2.h>

#include <string>

namespace cubelm::kernels::detail {

inline cublasHandle_t cublas_handle() {
  return KokkosBlas::Impl::CudaBlasSingleton::singleton().handle;
}

/// \brief The handle, set to run on `exec`'s stream.
inline cublasHandle_t cublas_on(const Kokkos::Cuda& exec);

inline void cublas_check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw InternalError(std::string("cuBLAS ") + call + " failed with status " +
                        std::to_string(static_cast<int>(status)));
}

inline cublasHandle_t cublas_on(const Kokkos::Cuda& exec) {
  const cublasHandle_t handle = cublas_handle();
  cublas_check(cublasSetStream(handle, exec.cuda_stream()), "cublasSetStream");
  return handle;
}

} // namespace cubelm::kernels::detail
