// compat.h — the one place where torch 1.13 and torch 2.x differ for
// process_group_collie.cpp (one source builds against either).
//
// Design notes
// - torch 1.13: a backend is a c10d::ProcessGroup subclass; torch 2.x: a
//   c10d::Backend subclass, which torch's ProcessGroup holds per device
//   (register_backend(..., devices=[...])). Both take (rank, size), keep
//   rank_/size_, and share c10d::Work, the option structs and OpType.
// - COLLIE_TORCH2 is 1 on torch 2.x: the members that only 2.x declares
//   (abort(), shutdown(), the coalescing entry points) are compiled under it,
//   with `override` so a signature torch changes breaks the build here.
// - collie_torch::BackendBase names the base class (also for pybind: the
//   base's Python class is torch's own, registered by torch).
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#define COLLIE_TORCH2 1
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#define COLLIE_TORCH2 0
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace collie_torch {

#if COLLIE_TORCH2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

} // namespace collie_torch
