# loom_sessions: the compiled train::session instances (include/loom/train/session.hpp) that
# train_gpt and users' programs choose at run time, and loom's CPU kernel instances, as one static
# library, loom::sessions. One generated translation unit per instance, so they compile in
# parallel and an added instance costs only its own file:
#
#   <build>/sessions/session_<model>_<precision>_<layout>_<device>_<attention>.cpp
#   <build>/sessions/whole_<model>.cpp   the fp32 single-rank model (save, export, import, sample)
#   <build>/sessions/registry.cpp        train::compiled_sessions(): the table of the above
#   cmake/sessions/session_io.cpp        train::session_io: checkpoints and traces, compiled once
#
# An instance is model/precision/layout/device/attention, e.g. quickstart/bf16/tp2pp2/cpu/fused.
# It serves every communicator (threads, MPI): its trainer runs on parallel::any_communicator.
# Device ascend (LOOM_WITH_ASCEND; nothing of CANN is needed to build) runs each rank on an NPU
# with HCCL bootstrapped over that world (train/ascend_session.hpp); its fp32 is the deliberate
# fp32-matmul policy precision::fp32_ascend_matmul, its attention fused.
#   -DLOOM_SESSIONS="a;b;..."        replaces the default set below
#   -DLOOM_EXTRA_SESSIONS="a;b;..."  adds to it (e.g. gpt2_small/fp16/tp1pp1/cpu/fused)
#   -DLOOM_PLAN_SESSIONS="a;b;..."   plan-only instances: only their memory plan is compiled
#                                    (train::planned_sessions(); examples/plan, --layout auto)
# Capacities (micro-batch x sequence) are per model: LOOM_SESSION_CAPACITY_<model> "B;T".

# The default set: the instance the README's first command trains (scripts/quickstart.sh), and
# with LOOM_BUILD_TESTS the instances the test suite names (its CLI tests, and the equality of a
# compiled-in and an on-demand instance of one shape). Every other instance is compiled on first
# use (train::instance_cache).
set(_loom_default_sessions quickstart_bpe/fp32/tp1pp1/cpu/fused)
set(_loom_default_plans "")
if(LOOM_BUILD_TESTS)
  list(APPEND _loom_default_sessions
    # the quickstart models: every precision on one rank and data parallel; the layouts the tests use
    # (tests/cli/instances.sh trains every CPU instance listed here; any other is compiled on first use)
    char_tiny/fp32/tp1pp1/cpu/fused char_tiny/bf16/tp1pp1/cpu/fused char_tiny/fp16/tp1pp1/cpu/fused
    char_tiny/fp32/tp2pp1/cpu/fused char_tiny/fp32/tp1pp2/cpu/fused char_tiny/fp32/tp2pp2/cpu/fused
    char_tiny/bf16/tp2pp2/cpu/fused char_tiny/fp16/tp2pp2/cpu/fused char_tiny/fp32/tp1pp1/cpu/reference
    quickstart/fp32/tp1pp1/cpu/fused quickstart/bf16/tp1pp1/cpu/fused quickstart/fp16/tp1pp1/cpu/fused
    quickstart/fp32/tp2pp2/cpu/fused quickstart/bf16/tp2pp2/cpu/fused
    llama_quickstart/fp32/tp1pp1/cpu/fused
    quickstart_bpe/bf16/tp1pp1/cpu/fused quickstart_bpe/fp16/tp1pp1/cpu/fused
    quickstart_bpe/fp32/tp2pp1/cpu/fused quickstart_bpe/fp32/tp1pp2/cpu/fused quickstart_bpe/fp32/tp2pp2/cpu/fused
    quickstart_bpe/bf16/tp2pp2/cpu/fused
    # the shape tests/cli/on_demand.sh also compiles on first use, from Megatron's flags
    odd_gqa/fp32/tp1pp1/cpu/fused)
  if(LOOM_WITH_ASCEND)  # the main job on an NPU (CI: on the emulation)
    list(APPEND _loom_default_sessions
      quickstart/fp32/tp1pp1/ascend/fused quickstart/bf16/tp1pp1/ascend/fused
      quickstart_bpe/fp32/tp1pp1/ascend/fused quickstart_bpe/bf16/tp1pp1/ascend/fused
      llama_quickstart/bf16/tp1pp1/ascend/fused)
    # plan-only instances (train::planned_sessions()): nothing of their model is compiled but the
    # plan, which tests/unit/train/test_shape_plan.cpp compares with train::plan_shape's arithmetic
    # (examples/plan plans any other layout with plan_shape). Llama 2 7B on a few layouts.
    foreach(layout tp1pp1 tp1pp2 tp2pp4 tp8pp1)
      list(APPEND _loom_default_plans llama2_7b/bf16/${layout}/ascend/fused)
    endforeach()
  endif()
endif()
set(LOOM_PLAN_SESSIONS "" CACHE STRING
    "plan-only instances (examples/plan, layout auto): model/precision/tpXppY/device/attention entries (empty: the default set)")
set(LOOM_SESSIONS "" CACHE STRING
    "train::session instances compiled into loom::sessions: model/precision/tpXppY/device/attention entries (empty: the default set)")
set(LOOM_EXTRA_SESSIONS "" CACHE STRING "instances added to LOOM_SESSIONS (same form)")
if(NOT LOOM_SESSIONS)
  set(LOOM_SESSIONS ${_loom_default_sessions})
endif()
if(NOT LOOM_PLAN_SESSIONS)
  set(LOOM_PLAN_SESSIONS ${_loom_default_plans})
endif()

set(LOOM_SESSION_CAPACITY_char_tiny 8 32)
set(LOOM_SESSION_CAPACITY_quickstart 16 128)
set(LOOM_SESSION_CAPACITY_quickstart_bpe 16 128)
set(LOOM_SESSION_CAPACITY_llama_quickstart 16 128)
set(LOOM_SESSION_CAPACITY_bench_small 8 256)
set(LOOM_SESSION_CAPACITY_gpt2_small 4 1024)
set(LOOM_SESSION_CAPACITY_llama2_7b 1 4096)
set(LOOM_SESSION_CAPACITY_odd_gqa 4 24)

function(loom_add_sessions)
  set(dir "${CMAKE_BINARY_DIR}/sessions")
  file(MAKE_DIRECTORY "${dir}")
  set(sources "")
  set(models "")
  set(decls "")
  set(rows "")
  set(ascend_used OFF)
  set(plan_rows "")
  set(all ${LOOM_SESSIONS} ${LOOM_EXTRA_SESSIONS})
  list(REMOVE_DUPLICATES all)
  set(plan_only ${LOOM_PLAN_SESSIONS})
  list(REMOVE_DUPLICATES plan_only)
  list(REMOVE_ITEM plan_only ${all})
  foreach(entry IN LISTS all plan_only)
    set(trainable ON)
    if(entry IN_LIST plan_only)
      set(trainable OFF)
    endif()
    string(REPLACE "/" ";" f "${entry}")
    list(LENGTH f n)
    if(NOT n EQUAL 5)
      message(FATAL_ERROR "LOOM_SESSIONS: '${entry}' is not model/precision/tpXppY/device/attention "
                          "(e.g. quickstart/bf16/tp2pp2/cpu/fused)")
    endif()
    list(GET f 0 model)
    list(GET f 1 prec)
    list(GET f 2 layout)
    list(GET f 3 device)
    list(GET f 4 attn)
    if(NOT DEFINED LOOM_SESSION_CAPACITY_${model})
      message(FATAL_ERROR "LOOM_SESSIONS: '${entry}': no capacity for model '${model}'; set "
                          "LOOM_SESSION_CAPACITY_${model} to \"B;T\" (micro-batch;sequence)")
    endif()
    if(NOT prec MATCHES "^(fp32|bf16|fp16)$" OR NOT layout MATCHES "^tp([1-9][0-9]*)pp([1-9][0-9]*)$"
       OR NOT attn MATCHES "^(fused|reference)$" OR NOT device MATCHES "^(cpu|ascend)$")
      message(FATAL_ERROR "LOOM_SESSIONS: '${entry}': precision fp32|bf16|fp16, layout tp<N>pp<M>, device cpu|ascend, "
                          "attention fused|reference")
    endif()
    set(header "loom/train/session_instance.hpp")
    set(policy_prec "${prec}")
    if(device STREQUAL "ascend")
      if(NOT LOOM_WITH_ASCEND OR NOT attn STREQUAL "fused")
        message(FATAL_ERROR "LOOM_SESSIONS: '${entry}': device ascend needs LOOM_WITH_ASCEND=ON and fused attention "
                            "(aclnnFlashAttentionScore)")
      endif()
      set(header "loom/train/ascend_session.hpp")
      if(prec STREQUAL "fp32")
        set(policy_prec "fp32_ascend_matmul")  # fp32 matmuls on the cube unit, chosen deliberately
      endif()
      set(ascend_used ON)
    endif()
    string(REGEX REPLACE "^tp([0-9]+)pp([0-9]+)$" "\\1" tp "${layout}")
    string(REGEX REPLACE "^tp([0-9]+)pp([0-9]+)$" "\\2" pp "${layout}")
    list(GET LOOM_SESSION_CAPACITY_${model} 0 B)
    list(GET LOOM_SESSION_CAPACITY_${model} 1 T)
    set(id "${model}_${prec}_${layout}_${device}_${attn}")
    set(src "${dir}/session_${id}.cpp")
    set(make_fn "")
    if(trainable)
      list(APPEND models ${model})
      set(make_fn "std::unique_ptr<train::session> make_${id}(const train::session_args& a, train::world_ref w) {
  using P = policy<device::${device}, precision::${policy_prec}, parallel::layout<${tp}, ${pp}>>;
  return train::make_session<models::${model}, P, ${B}, ${T}, kernels::${attn}>(a, w);
}
")
    endif()
    file(CONFIGURE OUTPUT "${src}" CONTENT
"// Generated by cmake/LoomSessions.cmake from LOOM_SESSIONS / LOOM_PLAN_SESSIONS; do not edit.
#include <${header}>

namespace loom::sessions {
${make_fn}train::memory_plan plan_${id}(const train::session_args& a, int world_size, int dp_rank, int stage) {
  using P = policy<device::${device}, precision::${policy_prec}, parallel::layout<${tp}, ${pp}>>;
  return train::plan_session<models::${model}, P, ${B}, ${T}, kernels::${attn}>(a, world_size, dp_rank, stage);
}
}  // namespace loom::sessions
")
    list(APPEND sources "${src}")
    string(APPEND decls "train::memory_plan plan_${id}(const train::session_args&, int, int, int);\n")
    set(row "{\"${model}\", \"${prec}\", ${tp}, ${pp}, \"${device}\", \"${attn}\", ${B}, ${T}")
    set(tail "&plan_${id}, &facts_v<models::${model}>, models::parameter_count<models::${model}>()},\n")
    if(trainable)
      string(APPEND decls "std::unique_ptr<train::session> make_${id}(const train::session_args&, train::world_ref);\n")
      string(APPEND rows "    ${row}, &make_${id}, &whole_${model}, ${tail}")
    else()
      string(APPEND plan_rows "    ${row}, nullptr, nullptr, ${tail}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES models)
  set(wdecls "")
  foreach(model IN LISTS models)
    set(src "${dir}/whole_${model}.cpp")
    file(CONFIGURE OUTPUT "${src}" CONTENT
"// Generated by cmake/LoomSessions.cmake; do not edit.
#include <loom/train/whole_model.hpp>

namespace loom::sessions {
std::unique_ptr<train::whole_model> whole_${model}(std::uint64_t seed) {
  return std::make_unique<train::gpt_whole_model<models::${model}>>(seed);
}
}  // namespace loom::sessions
")
    list(APPEND sources "${src}")
    string(APPEND wdecls "std::unique_ptr<train::whole_model> whole_${model}(std::uint64_t seed);\n")
  endforeach()
  if(TARGET loom::mpi)
    set(mpi_include "#include <loom/parallel/comm_mpi.hpp>")
    set(mpi_case "    case train::world_ref::kind::mpi: return parallel::any_communicator(*static_cast<comm::mpi*>(w.comm));")
  else()
    set(mpi_include "")
    set(mpi_case "    case train::world_ref::kind::mpi: throw input_error(\"--comm mpi: this build has no MPI (LOOM_WITH_MPI)\");")
  endif()
  list(LENGTH all count)
  file(CONFIGURE OUTPUT "${dir}/registry.cpp" CONTENT
"// Generated by cmake/LoomSessions.cmake from LOOM_SESSIONS; do not edit.
#include <loom/parallel/comm_threads.hpp>
${mpi_include}
#include <loom/models/registry.hpp>
#include <loom/models/params.hpp>
#include <loom/train/session.hpp>

namespace loom::sessions {
${wdecls}${decls}
namespace {
template <class M>
constexpr models::model_facts facts_v = models::facts_of<M>();

// the trainable instances, then the plan-only ones: compiled_sessions() is a prefix of planned_sessions()
const train::session_instance instances[] = {
${rows}${plan_rows}};
constexpr std::size_t trainable = ${count};
}  // namespace
}  // namespace loom::sessions

std::span<const loom::train::session_instance> loom::train::compiled_sessions() noexcept {
  return std::span(loom::sessions::instances).first(loom::sessions::trainable);
}

std::span<const loom::train::session_instance> loom::train::planned_sessions() noexcept {
  return loom::sessions::instances;
}

loom::parallel::any_communicator loom::train::any_communicator_of(world_ref w) {
  using namespace loom;
  switch (w.type) {
    case train::world_ref::kind::threads: return parallel::any_communicator(*static_cast<comm::threads*>(w.comm));
${mpi_case}
    case train::world_ref::kind::any:  // refers to the caller's any_communicator
      return parallel::any_communicator(std::make_unique<parallel::detail::any_comm_model<parallel::any_communicator>>(
          *static_cast<parallel::any_communicator*>(w.comm)));
    default: throw input_error(\"any_communicator_of: no world (world_ref::none())\");
  }
}
")
  list(APPEND sources "${dir}/registry.cpp" "${PROJECT_SOURCE_DIR}/cmake/sessions/session_io.cpp")
  add_library(loom_sessions STATIC ${sources})
  add_library(loom::sessions ALIAS loom_sessions)
  set_target_properties(loom_sessions PROPERTIES EXPORT_NAME sessions)
  target_link_libraries(loom_sessions PUBLIC loom_kernel_instances $<TARGET_NAME_IF_EXISTS:loom::mpi>
                                             $<TARGET_NAME_IF_EXISTS:nlohmann_json::nlohmann_json>)
  if(ascend_used)
    target_link_libraries(loom_sessions PUBLIC loom::ascend)
  endif()
  loom_target_defaults(loom_sessions)
  # Every instance parses the same headers (trainer, model, kernels, checkpoints: ~10 s of the
  # ~25 s an instance costs): parse them once.
  target_precompile_headers(loom_sessions PRIVATE "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include/loom/train/session_instance.hpp>")
  list(LENGTH plan_only plans)
  message(STATUS "loom: ${count} session instances (LOOM_SESSIONS, LOOM_EXTRA_SESSIONS) and ${plans} plan-only "
                 "(LOOM_PLAN_SESSIONS) in loom::sessions")
endfunction()

# loom_write_instance_toolchain(<target>): <build>/loom-instance-toolchain.json, how <target> (the
# library of the built-in instances) is compiled — compiler, flags, definitions, include
# directories — which train::instance_cache (include/loom/train/instance_cache.hpp) reads to
# compile the instances a program asks for on first use with the same compiler and flags. Its
# path is compiled into the programs as LOOM_INSTANCE_TOOLCHAIN (LOOM_TOOLCHAIN_FILE overrides).
function(loom_write_instance_toolchain target)
  string(TOUPPER "${CMAKE_BUILD_TYPE}" _bt)
  separate_arguments(_base UNIX_COMMAND "${CMAKE_CXX_FLAGS} ${CMAKE_CXX_FLAGS_${_bt}}")
  set(base "")
  foreach(f IN LISTS _base)
    string(APPEND base "\"${f}\", ")
  endforeach()
  set(std "${CMAKE_CXX20_EXTENSION_COMPILE_OPTION}")
  if(NOT CMAKE_CXX_EXTENSIONS AND DEFINED CMAKE_CXX_EXTENSIONS)
    set(std "${CMAKE_CXX20_STANDARD_COMPILE_OPTION}")
  endif()
  set(q "\"$<COMMA> \"")
  set(defs "$<TARGET_PROPERTY:${target},COMPILE_DEFINITIONS>")
  set(incs "$<TARGET_PROPERTY:${target},INCLUDE_DIRECTORIES>")
  set(opts "$<TARGET_PROPERTY:${target},COMPILE_OPTIONS>")
  set(LOOM_INSTANCE_TOOLCHAIN "${CMAKE_BINARY_DIR}/loom-instance-toolchain.json" PARENT_SCOPE)
  set(LOOM_INSTANCE_TOOLCHAIN "${CMAKE_BINARY_DIR}/loom-instance-toolchain.json" CACHE INTERNAL "")
  file(GENERATE OUTPUT "${CMAKE_BINARY_DIR}/loom-instance-toolchain.json" CONTENT
"{
  \"compiler\": \"${CMAKE_CXX_COMPILER}\",
  \"include_root\": \"${PROJECT_SOURCE_DIR}/include\",
  \"flags\": [${base}\"${std}\", \"$<JOIN:${opts},${q}>\", \"-D$<JOIN:${defs},${q}-D>\"],
  \"includes\": [\"$<JOIN:${incs},${q}>\"]
}
")
endfunction()
