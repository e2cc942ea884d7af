#pragma once
/// \file Umbrella for loom::parallel: layouts, the communicator concept and comm::threads, data
/// parallelism (bucketed gradient all-reduce, ZeRO-1), tensor-parallel layers and the 1F1B
/// pipeline schedule.
/// Not included here: loom/parallel/comm_mpi.hpp (needs mpi.h; CMake target loom::mpi),
/// loom/parallel/comm_hccl.hpp (Ascend; CMake target loom::ascend), and loom/parallel/rank_table.hpp
/// (HCCL rank tables; needs nlohmann-json). Include them yourself.
#include <loom/parallel/comm.hpp>
#include <loom/parallel/comm_observer.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/parallel/data_parallel.hpp>
#include <loom/parallel/dp_shard.hpp>
#include <loom/core/layout.hpp>
#include <loom/parallel/scalars.hpp>
#include <loom/parallel/schedule.hpp>
#include <loom/parallel/tensor_parallel.hpp>
