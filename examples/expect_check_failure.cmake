# Runs ${DEMO} ${ARGS} and passes only if it exits 1 having printed "CHECK FAILED": the demo's checks
# really fail on a corrupted replay (a crash, a timeout or exit 0 fails this test).
execute_process(COMMAND ${DEMO} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "1")
  message(FATAL_ERROR "expected exit code 1 from a corrupted replay, got '${rc}'")
endif()
string(FIND "${out}" "CHECK FAILED: replay differs from eager" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "the demo exited 1 but did not report the replay/eager mismatch")
endif()
message("OK: the corrupted replay was detected (exit 1)")
