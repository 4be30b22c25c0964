# For the CTest scripts that run a GPU program (cmake -P):
#   include(<repo>/cmake/run_gpu_program.cmake)
#   graphsafe_run_gpu_program(ENV VAR=value ... COMMAND program args ...)
# runs the program with the environment given, prints its output and sets rc, out and err. When it
# exited 77, or could not start for want of libcuda on a machine whose kernel knows no NVIDIA GPU
# either, it prints "SKIPPED: no GPU" (the tests' SKIP_REGULAR_EXPRESSION) and returns from the
# script. A missing driver where a GPU is present stays a failure.
macro(graphsafe_run_gpu_program)
  cmake_parse_arguments(_gs_run "" "" "ENV;COMMAND" ${ARGN})
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${_gs_run_ENV} ${_gs_run_COMMAND}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if("${err}" MATCHES "libcuda\\.so\\.1: cannot open shared object" AND NOT EXISTS /dev/nvidia0
     AND NOT EXISTS /proc/driver/nvidia/gpus)
    set(_gs_no_gpu TRUE)
  else()
    set(_gs_no_gpu FALSE)
  endif()
  if("${rc}" STREQUAL "77" OR _gs_no_gpu)
    message("SKIPPED: no GPU")
    return()
  endif()
endmacro()
