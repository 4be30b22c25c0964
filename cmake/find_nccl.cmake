# Finds NCCL for graphsafe::nccl (nccl/): GRAPHSAFE_NCCL_ROOT (a prefix with include/nccl.h and
# lib/libnccl.so*), $NCCL_ROOT / $NCCL_HOME, the CUDA toolkit, the system, then the nvidia-nccl-cu*
# wheel in the site-packages of the Python interpreters on PATH (PyTorch's environment ships NCCL
# there as nvidia/nccl/{include,lib}, its library as libnccl.so.2 only).
# GRAPHSAFE_NCCL_FALLBACK (a prefix, optional) is searched last, after the system: the installed
# package's config (graphsafeConfig.cmake, which includes this file) passes the NCCL it was built with.
# Sets GRAPHSAFE_NCCL_FOUND, GRAPHSAFE_NCCL_VERSION, GRAPHSAFE_NCCL_WHY (when not found) and the
# imported target graphsafe_nccl_library.
set(GRAPHSAFE_NCCL_ROOT "" CACHE PATH "Prefix holding NCCL's include/nccl.h and lib/libnccl.so*")

set(_gs_nccl_hints ${GRAPHSAFE_NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_ROOT})
set(_gs_pythons)
foreach(_py python3 python)
  find_program(_gs_py_${_py} ${_py})
  if(_gs_py_${_py})
    list(APPEND _gs_pythons ${_gs_py_${_py}})
  endif()
endforeach()
if(Python3_EXECUTABLE)
  list(APPEND _gs_pythons ${Python3_EXECUTABLE})
endif()
list(REMOVE_DUPLICATES _gs_pythons)
foreach(_py IN LISTS _gs_pythons)
  # nvidia.nccl is a namespace package (no __init__.py): its __path__, not __file__, names the folder.
  execute_process(
    COMMAND ${_py} -c "import nvidia.nccl as n; print(list(n.__path__)[0])"
    OUTPUT_VARIABLE _gs_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _gs_rc)
  if(_gs_rc EQUAL 0 AND _gs_wheel)
    list(APPEND _gs_nccl_hints ${_gs_wheel})
  endif()
endforeach()

find_path(GRAPHSAFE_NCCL_INCLUDE_DIR nccl.h HINTS ${_gs_nccl_hints} PATHS ${GRAPHSAFE_NCCL_FALLBACK}
          PATH_SUFFIXES include)
# The library next to the header first (a header and a library of different releases do not mix).
if(GRAPHSAFE_NCCL_INCLUDE_DIR)
  get_filename_component(_gs_prefix ${GRAPHSAFE_NCCL_INCLUDE_DIR} DIRECTORY)
  find_library(GRAPHSAFE_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR PATHS ${_gs_prefix}
               PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
endif()
find_library(GRAPHSAFE_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_gs_nccl_hints}
             PATHS ${GRAPHSAFE_NCCL_FALLBACK} PATH_SUFFIXES lib lib64)

set(GRAPHSAFE_NCCL_FOUND OFF)
set(GRAPHSAFE_NCCL_WHY "")
if(NOT GRAPHSAFE_NCCL_INCLUDE_DIR)
  set(GRAPHSAFE_NCCL_WHY "nccl.h not found")
elseif(NOT GRAPHSAFE_NCCL_LIBRARY)
  set(GRAPHSAFE_NCCL_WHY "libnccl.so not found (next to ${GRAPHSAFE_NCCL_INCLUDE_DIR})")
else()
  file(STRINGS ${GRAPHSAFE_NCCL_INCLUDE_DIR}/nccl.h _gs_code REGEX "^#define NCCL_VERSION_CODE [0-9]+")
  string(REGEX REPLACE "^#define NCCL_VERSION_CODE ([0-9]+).*" "\\1" _gs_code "${_gs_code}")
  if(NOT _gs_code OR _gs_code LESS 21903)
    set(GRAPHSAFE_NCCL_WHY "NCCL ${_gs_code} at ${GRAPHSAFE_NCCL_INCLUDE_DIR} is older than 2.19.3 (no ncclCommRegister)")
  else()
    math(EXPR _gs_major "${_gs_code} / 10000")
    math(EXPR _gs_minor "(${_gs_code} % 10000) / 100")
    math(EXPR _gs_patch "${_gs_code} % 100")
    set(GRAPHSAFE_NCCL_VERSION "${_gs_major}.${_gs_minor}.${_gs_patch}")
    set(GRAPHSAFE_NCCL_FOUND ON)
    if(NOT TARGET graphsafe_nccl_library)
      add_library(graphsafe_nccl_library SHARED IMPORTED)
      set_target_properties(graphsafe_nccl_library PROPERTIES IMPORTED_LOCATION ${GRAPHSAFE_NCCL_LIBRARY}
                            INTERFACE_INCLUDE_DIRECTORIES ${GRAPHSAFE_NCCL_INCLUDE_DIR})
    endif()
  endif()
endif()
