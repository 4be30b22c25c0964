# Checks that EXE carries the CUDA runtime inside itself (the static archive's libcudart_static_*
# symbols) and does not load the shared one (no libcudart.so in its NEEDED entries).
#   cmake -DEXE=<executable> -P check_static_runtime.cmake
find_program(READELF readelf REQUIRED)
execute_process(COMMAND ${READELF} -d ${EXE} OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${EXE} failed (${rc})")
endif()
if(dyn MATCHES "libcudart\\.so")
  message(FATAL_ERROR "${EXE} loads the shared CUDA runtime:\n${dyn}")
endif()
execute_process(COMMAND ${READELF} -s --wide ${EXE} OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
string(REGEX MATCHALL "libcudart_static_[0-9a-f]+" internal "${syms}")
list(LENGTH internal n)
if(n LESS 100)
  message(FATAL_ERROR "${EXE} holds ${n} libcudart_static_* symbols: the static CUDA runtime is not linked in")
endif()
message("OK: ${EXE} links the CUDA runtime statically (${n} internal runtime symbols, no libcudart.so needed)")
