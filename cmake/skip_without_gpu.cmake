# For the CTest scripts that run a GPU program (cmake -P): after
#   execute_process(... RESULT_VARIABLE rc ERROR_VARIABLE err)
#   graphsafe_skip_without_gpu("${rc}" "${err}")
# prints "SKIPPED: no GPU" (the tests' SKIP_REGULAR_EXPRESSION) and returns from the script when the
# program exited 77, or could not start for want of libcuda on a machine whose kernel knows no NVIDIA
# GPU either. A missing driver where a GPU is present stays a failure.
macro(graphsafe_skip_without_gpu rc err)
  if("${err}" MATCHES "libcuda\\.so\\.1: cannot open shared object" AND NOT EXISTS /dev/nvidia0
     AND NOT EXISTS /proc/driver/nvidia/gpus)
    set(_graphsafe_no_gpu TRUE)
  else()
    set(_graphsafe_no_gpu FALSE)
  endif()
  if("${rc}" STREQUAL "77" OR _graphsafe_no_gpu)
    message("SKIPPED: no GPU")
    return()
  endif()
endmacro()
