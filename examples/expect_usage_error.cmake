# Runs ${DEMO} ${ARGS} and passes only if it refuses the input before any work: exit code 2, one line
# on stderr matching ${EXPECT}, no input built (stdout has no "inputs built"), and no --json file
# left behind (${NO_FILE}, optional).
execute_process(COMMAND ${DEMO} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 60)
message("stdout: ${out}stderr: ${err}")
if(NOT rc STREQUAL "2")
  message(FATAL_ERROR "expected exit code 2 (bad input), got '${rc}'")
endif()
if(NOT err MATCHES "${EXPECT}")
  message(FATAL_ERROR "stderr does not match '${EXPECT}'")
endif()
string(STRIP "${err}" line)
if(line MATCHES "\n")
  message(FATAL_ERROR "the error is more than one line")
endif()
if(out MATCHES "inputs built")
  message(FATAL_ERROR "the demo built its inputs before refusing them")
endif()
if(NO_FILE AND EXISTS "${NO_FILE}")
  message(FATAL_ERROR "${NO_FILE} was created")
endif()
message("OK: refused up front (exit 2)")
