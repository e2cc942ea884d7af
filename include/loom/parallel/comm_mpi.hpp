#pragma once
/// \file comm::mpi — a communicator over MPI (Open MPI): one process per rank, any number of
/// machines, launched with mpirun. Needs <mpi.h> and libmpi (CMake target loom::mpi, or mpicxx).
///
///   int main(int argc, char** argv) {
///     loom::comm::mpi_environment env(&argc, &argv);   // MPI_Init_thread ... MPI_Finalize
///     loom::comm::mpi world = env.world();              // owns a duplicate of MPI_COMM_WORLD
///     world.all_reduce(std::span{grads}, loom::parallel::reduce_op::avg);
///   }                                                   // communicators die before env
///
/// Design decisions (measured with bench/bench_allreduce.cpp):
///  * Blocking operations call the blocking MPI functions (MPI_Allreduce, MPI_Reduce_scatter_block,
///    MPI_Allgather, MPI_Bcast, MPI_Send/Recv, MPI_Barrier), whose tuned algorithms are the fastest
///    Open MPI has: a loom all_reduce costs what a plain MPI_Allreduce costs. The exception is the
///    bf16/fp16 sum/avg all_reduce (below), a ring of MPI_Sendrecv written in loom.
///  * Asynchronous operations run those same blocking calls on a progress thread owned by the
///    communicator (FIFO, like comm::threads), so they progress while the caller computes and
///    keep the fast algorithms. This needs MPI_THREAD_MULTIPLE, which mpi_environment requests.
///    Open MPI's nonblocking collectives (libnbc) were the alternative; on this machine
///    MPI_Ireduce_scatter_block is ~10x slower than MPI_Reduce_scatter_block and MPI_Iallreduce's
///    default algorithm ~1.5x slower than MPI_Allreduce, and they progress only inside MPI calls.
///    If MPI provides less than MPI_THREAD_MULTIPLE, async operations fall back to those
///    nonblocking collectives (completed by MPI_Wait/MPI_Test; call request::test() now and then
///    to make progress); MPI_THREAD_SERIALIZED is then the minimum, and all MPI calls of the
///    process must come from one thread at a time.
///  * Timeout (comm_options::timeout > 0, default 10 min). MPI can neither cancel a collective nor
///    tell which ranks arrived. A blocking operation that exceeds it makes a watchdog thread print
///    "loom: comm::mpi <op> on communicator '<name>' (size n) rank r did not complete within ..."
///    to stderr and end the job: MPI_Abort(MPI_COMM_WORLD, 124) with MPI_THREAD_MULTIPLE, else
///    _Exit(124) (mpirun then stops the others). request::wait() past the timeout throws
///    comm_timeout instead (the communicator is then broken: its destructor leaks the stuck thread
///    and the MPI_Comm rather than hang). recv is a blocking operation like the others.
///  * bf16 / fp16: MPI has neither type, and a custom MPI_Op on 16-bit data would round after
///    every pairwise step. Blocking all_reduce with sum/avg (also on the progress thread) runs a
///    ring reduce-scatter + all-gather of MPI_Sendrecv (detail::mpi_ring_all_reduce): each rank's
///    own values travel as 16-bit words (exact), partial sums between hops as fp32, the owner of
///    a segment adds the last value, divides for avg and rounds once, and the rounded 16-bit
///    segments are all-gathered; the conversions are fused into the additions, piece by piece.
///    On 2 ranks that moves half the bytes of an fp32 all-reduce and is bitwise "sum in fp32,
///    round once"; on more ranks the fp32 sum runs in ring order, still rounded once and the
///    same on every rank. Its messages use a private duplicate of the communicator (created on
///    first use), never matching the caller's send/recv. Cost: 2 x 128 Ki floats of scratch.
///    max/min, reduce_scatter and the nonblocking fallback convert to an fp32 temporary, reduce
///    with MPI_FLOAT (fp32 accumulation, as in comm::threads) and round back once; cost: an fp32
///    buffer of the same element count (kept and reused by the communicator on blocking calls).
///    Data movement sends the 16-bit words as MPI_UINT16_T, unconverted.
///  * avg = MPI_SUM, then one division by size() on the final sum.
///  * Every MPI return code is checked: failures throw loom::device_error(code, "MPI_Xxx", text
///    from MPI_Error_string). Communicators use MPI_ERRORS_RETURN so that this is possible.
///  * Determinism: the reduction order is Open MPI's (its algorithms give every rank the same
///    result in practice, and the tests check bitwise agreement across ranks; the standard only
///    recommends it), or for the 16-bit ring loom's fixed ring order (each element reduced by
///    one rank and copied to the others). Counts are limited to INT_MAX elements per call (input_error beyond).
///
/// The pieces: comm_mpi/environment.hpp (MPI_Init_thread / MPI_Finalize),
/// comm_mpi/communicator.hpp (the communicator), detail/mpi_operations.hpp (error checks,
/// datatypes, the watchdog, requests and the collectives they run).
#include <loom/parallel/comm_mpi/communicator.hpp>
#include <loom/parallel/comm_mpi/environment.hpp>
