# FindAscendCL: the Huawei CANN toolkit (AscendCL runtime, HCCL collectives, aclnn operators).
# loom needs it only for -DLOOM_ASCEND_USE_CANN_HEADERS=ON (compile against the vendor headers so
# API drift is a compile error); loom never links these libraries — it dlopens them at run time
# (include/loom/device/ascend_runtime.hpp). The imported library targets are for other users.
#
# Search order for the toolkit root (loom's API reference §4.1 "practical rule"):
#   -DASCEND_TOOLKIT_HOME=...,  $ENV{ASCEND_HOME_PATH},  $ENV{ASCEND_TOOLKIT_HOME}  (set_env.sh)
#   /usr/local/Ascend/cann,  /usr/local/Ascend/ascend-toolkit/latest,  /usr/local/Ascend/latest
#
# A headers-only root is enough (include/acl/acl.h, no lib64): CANN's open-source headers, e.g. the
# fixture ../shared/reference/cann-headers CI compiles against, or a toolkit's include tree on a
# build machine. AscendCL_LIBRARY is then empty and AscendCL::AscendCL carries the include path only.
#
# Result variables: AscendCL_FOUND, AscendCL_INCLUDE_DIR, AscendCL_LIBRARY (may be empty),
#   AscendCL_HEADERS_ONLY (TRUE when no libascendcl was found), AscendCL_ROOT.
# Imported targets:
#   AscendCL::AscendCL   acl/acl.h (+ libascendcl when present; loom never links it)
#   AscendCL::hccl       libhccl      (when present)
#   AscendCL::opapi      libopapi + libnnopbase, the aclnn operator API (when present)
set(_ascend_hints "")
foreach(_root IN ITEMS "${ASCEND_TOOLKIT_HOME}" "$ENV{ASCEND_HOME_PATH}" "$ENV{ASCEND_TOOLKIT_HOME}"
                       /usr/local/Ascend/cann /usr/local/Ascend/ascend-toolkit/latest /usr/local/Ascend/latest
                       /usr/local/Ascend)
  if(_root AND IS_DIRECTORY "${_root}")
    list(APPEND _ascend_hints "${_root}")
  endif()
endforeach()

find_path(AscendCL_INCLUDE_DIR acl/acl.h HINTS ${_ascend_hints} PATH_SUFFIXES include runtime/include)
find_library(AscendCL_LIBRARY ascendcl HINTS ${_ascend_hints} PATH_SUFFIXES lib64 lib runtime/lib64)
find_library(AscendCL_hccl_LIBRARY hccl HINTS ${_ascend_hints} PATH_SUFFIXES lib64 lib)
find_library(AscendCL_opapi_LIBRARY opapi HINTS ${_ascend_hints} PATH_SUFFIXES lib64 lib)
find_library(AscendCL_nnopbase_LIBRARY nnopbase HINTS ${_ascend_hints} PATH_SUFFIXES lib64 lib)
mark_as_advanced(AscendCL_INCLUDE_DIR AscendCL_LIBRARY AscendCL_hccl_LIBRARY
                 AscendCL_opapi_LIBRARY AscendCL_nnopbase_LIBRARY)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(AscendCL
  REQUIRED_VARS AscendCL_INCLUDE_DIR
  REASON_FAILURE_MESSAGE "install the CANN toolkit and source its set_env.sh (sets ASCEND_HOME_PATH / ASCEND_TOOLKIT_HOME), or pass -DASCEND_TOOLKIT_HOME=<dir>, or configure with -DLOOM_ASCEND_USE_CANN_HEADERS=OFF (the default: loom's own declarations, no toolkit needed)")

if(AscendCL_FOUND)
  get_filename_component(AscendCL_ROOT "${AscendCL_INCLUDE_DIR}/.." ABSOLUTE)
  if(AscendCL_LIBRARY)
    set(AscendCL_HEADERS_ONLY FALSE)
  else()
    set(AscendCL_HEADERS_ONLY TRUE)
  endif()
  if(NOT TARGET AscendCL::AscendCL)
    if(AscendCL_HEADERS_ONLY)
      add_library(AscendCL::AscendCL INTERFACE IMPORTED)
      set_target_properties(AscendCL::AscendCL PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${AscendCL_INCLUDE_DIR}")
    else()
      add_library(AscendCL::AscendCL UNKNOWN IMPORTED)
      set_target_properties(AscendCL::AscendCL PROPERTIES
        IMPORTED_LOCATION "${AscendCL_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${AscendCL_INCLUDE_DIR}")
    endif()
  endif()
  if(AscendCL_hccl_LIBRARY AND NOT TARGET AscendCL::hccl)
    add_library(AscendCL::hccl UNKNOWN IMPORTED)
    set_target_properties(AscendCL::hccl PROPERTIES
      IMPORTED_LOCATION "${AscendCL_hccl_LIBRARY}" INTERFACE_LINK_LIBRARIES AscendCL::AscendCL)
  endif()
  if(AscendCL_opapi_LIBRARY AND AscendCL_nnopbase_LIBRARY AND NOT TARGET AscendCL::opapi)
    add_library(AscendCL::opapi UNKNOWN IMPORTED)
    set_target_properties(AscendCL::opapi PROPERTIES
      IMPORTED_LOCATION "${AscendCL_opapi_LIBRARY}"
      INTERFACE_LINK_LIBRARIES "${AscendCL_nnopbase_LIBRARY};AscendCL::AscendCL")
  endif()
endif()
