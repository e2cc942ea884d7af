# cmake -DEMU_INCLUDE=<emulation/include> -DCANN_INCLUDE=<CANN headers root>/include -DWORK_DIR=<scratch>
#       -DCXX=<compiler> -P emulation_matches.cmake
# CTest ascend_emulation_matches_cann_headers: the emulation's headers against CANN's own, for
# every function and constant the emulation declares that CANN's headers declare too (not only
# those loom uses, which ascend_cann_headers checks through loom's declarations).
#   functions  lines of emulation/include declaring acl*/Hccl* functions; for each, one program
#              prints decltype(&::fn) (the compiler's spelling of the function type), built once
#              with the emulation's headers and once with CANN's; the outputs must be equal
#   constants  `static const int`, numeric #defines and ACL_/HCCL_/ACLNN_ enumerators; their
#              values are printed and compared the same way
# Expected differences (the emulation restates CANN 8.1.RC1, the fixture is 9.0.0), reported but
# not failures: ACL_{MAJOR,MINOR,PATCH}_VERSION, HCCL_COMM_CONFIG_VERSION (HcclCommConfig's layout
# version) and HCCL_E_RESERVED (the end marker of HcclResult).
cmake_minimum_required(VERSION 3.22)
foreach(v EMU_INCLUDE CANN_INCLUDE WORK_DIR CXX)
  if(NOT ${v})
    message(FATAL_ERROR "emulation_matches.cmake: pass -D${v}=...")
  endif()
endforeach()
if(NOT EXISTS "${CANN_INCLUDE}/acl/acl.h")
  message(FATAL_ERROR "no CANN headers at ${CANN_INCLUDE} (expected acl/acl.h): CI keeps CANN's open-source headers "
                      "at ../shared/reference/cann-headers next to the repository; pass -DLOOM_CANN_HEADERS_DIR=<dir>")
endif()
set(expected_differences ACL_MAJOR_VERSION ACL_MINOR_VERSION ACL_PATCH_VERSION HCCL_COMM_CONFIG_VERSION HCCL_E_RESERVED)

function(read_all dir out)
  file(GLOB_RECURSE files "${dir}/*.h")
  set(text "")
  foreach(f IN LISTS files)
    file(READ "${f}" t)
    string(APPEND text "\n${t}")
  endforeach()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()
read_all("${EMU_INCLUDE}" emu_text)
read_all("${CANN_INCLUDE}" cann_text)

# --- names ---------------------------------------------------------------------------------------
string(REGEX MATCHALL "\n(ACL_FUNC_VISIBILITY |ACLNN_API |extern )?[A-Za-z_][A-Za-z_0-9 *]*[ *](acl[A-Za-z0-9_]*|Hccl[A-Za-z0-9_]*)\\("
       hits "${emu_text}")
set(functions "")
foreach(h IN LISTS hits)
  string(REGEX REPLACE ".*[ *]([A-Za-z0-9_]+)\\($" "\\1" name "${h}")
  if(cann_text MATCHES "[^A-Za-z0-9_]${name}[ \t\r\n]*\\(")
    list(APPEND functions "${name}")
  endif()
endforeach()
list(REMOVE_DUPLICATES functions)
list(SORT functions)

string(REGEX MATCHALL "static const int[ \t]+[A-Z][A-Z0-9_]+" c1 "${emu_text}")
string(REGEX MATCHALL "\n#define[ \t]+[A-Z][A-Z0-9_]+[ \t]+\\(?-?[0-9]" c2 "${emu_text}")
string(REGEX MATCHALL "\n[ \t]+(ACL|HCCL|ACLNN)_[A-Z0-9_]+[ \t]*[=,\n]" c3 "${emu_text}")
set(constants "")
foreach(h IN LISTS c1 c2 c3)
  string(REGEX REPLACE "^[ \t\n]*(static const int|#define)?[ \t\n]*([A-Z][A-Z0-9_]+).*" "\\2" name "${h}")
  string(STRIP "${name}" name)
  if(cann_text MATCHES "[^A-Za-z0-9_]${name}[^A-Za-z0-9_]")
    list(APPEND constants "${name}")
  endif()
endforeach()
list(REMOVE_DUPLICATES constants)
list(SORT constants)

# --- one program, built twice ----------------------------------------------------------------------
file(GLOB emu_ops RELATIVE "${EMU_INCLUDE}/aclnnop" "${EMU_INCLUDE}/aclnnop/*.h")
set(src "#include <cstdio>\n#include <acl/acl.h>\n#include <acl/acl_prof.h>\n#include <aclnn/acl_meta.h>\n#include <hccl/hccl.h>\n")
foreach(h IN LISTS emu_ops)
  if(EXISTS "${CANN_INCLUDE}/aclnnop/${h}")
    string(APPEND src "#include <aclnnop/${h}>\n")
  endif()
endforeach()
string(APPEND src "template <class T> void sig(const char* n) { std::printf(\"function %s %s\\n\", n, __PRETTY_FUNCTION__); }\n"
                  "int main() {\n")
foreach(f IN LISTS functions)
  string(APPEND src "  sig<decltype(&::${f})>(\"${f}\");\n")
endforeach()
foreach(c IN LISTS constants)
  string(APPEND src "  std::printf(\"constant %s %lld\\n\", \"${c}\", (long long)(${c}));\n")
endforeach()
string(APPEND src "}\n")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
file(WRITE "${WORK_DIR}/signatures.cpp" "${src}")

foreach(side emu cann)
  if(side STREQUAL "emu")
    set(inc "-I${EMU_INCLUDE}")
  else()
    set(inc "-isystem" "${CANN_INCLUDE}")
  endif()
  execute_process(COMMAND "${CXX}" -std=c++20 -Wno-deprecated-declarations ${inc} "${WORK_DIR}/signatures.cpp"
                          -o "${WORK_DIR}/signatures_${side}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "emulation_matches: compiling the probe with the ${side} headers failed:\n${out}")
  endif()
  execute_process(COMMAND "${WORK_DIR}/signatures_${side}" RESULT_VARIABLE rc OUTPUT_VARIABLE ${side}_out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "emulation_matches: the ${side} probe failed (${rc})")
  endif()
  string(REPLACE "\n" ";" ${side}_lines "${${side}_out}")
endforeach()

list(LENGTH emu_lines n)
math(EXPR last "${n} - 1")
set(bad "")
set(known "")
foreach(i RANGE ${last})
  list(GET emu_lines ${i} a)
  list(GET cann_lines ${i} b)
  if(NOT a STREQUAL b)
    string(REGEX REPLACE "^[a-z]+ ([A-Za-z0-9_]+) .*" "\\1" name "${a}")
    if(name IN_LIST expected_differences)
      string(APPEND known "  ${a}  (CANN 9.0.0: ${b})\n")
    else()
      string(APPEND bad "  emulation: ${a}\n  CANN:      ${b}\n")
    endif()
  endif()
endforeach()
list(LENGTH functions nf)
list(LENGTH constants nc)
message("emulation vs CANN headers: ${nf} functions, ${nc} constants compared")
if(known)
  message("expected differences (the emulation restates 8.1.RC1):\n${known}")
endif()
if(bad)
  message(FATAL_ERROR "the emulation's headers differ from CANN's (fix emulation/include):\n${bad}")
endif()
