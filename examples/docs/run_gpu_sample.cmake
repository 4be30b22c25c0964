# Runs a docs sample that needs a GPU (and the driver's libcuda): passes on exit 0, prints
# "SKIPPED: no GPU" (CTest's SKIP_REGULAR_EXPRESSION) on exit 77 or when libcuda is missing on a
# machine whose kernel knows no NVIDIA GPU; anything else fails. With -DREPORT=<json>, the sample's
# graphsafe_cupti report must have been written there at exit.
#   cmake -DEXE=<sample> [-DREPORT=<json>] -P run_gpu_sample.cmake
if(REPORT)
  file(REMOVE "${REPORT}")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/run_gpu_program.cmake)
graphsafe_run_gpu_program(ENV GRAPHSAFE_CUPTI_REPORT=${REPORT} COMMAND ${EXE})
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} exited with ${rc}")
endif()
if(REPORT AND NOT EXISTS "${REPORT}")
  message(FATAL_ERROR "no report at ${REPORT}: graphsafe_cupti wrote nothing at exit")
endif()
