# CTest driver of the install tests: `cmake --install` the build tree into a fresh prefix, then
# configure, build and run a consumer project (SOURCE_DIR, executable EXE) against it.
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DEXE=... -DGENERATOR=... -DCXX_COMPILER=...
#         -DCUDA_TOOLKIT_ROOT=... [-DCONFIG=...] [-DEXPECT_REFUSAL=<regex>] [-DAFTER=<script>]
#         [-DOTHER_ROOTS=<prefixes>] -P install_consumer.cmake
# EXPECT_REFUSAL: the consumer's configure must fail, its output matching the regex (a component the
# package lacks), and nothing is built. AFTER: a script included once the consumer passed, with
# `prefix`, `configure_args` and expect_refusal() at hand. OTHER_ROOTS: prefixes that, like the
# toolkit's, no installed target may name (a dependency found at build time).
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR EXE GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "install_consumer: ${v} not set")
  endif()
endforeach()

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/consumer-build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(step what)
  message(STATUS "install_consumer: ${what}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: ${what} failed (${rc})")
  endif()
endfunction()

set(config_args)
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()
step("install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" ${config_args})
if(NOT EXISTS "${prefix}/include/graphsafe/graphsafe.hpp")
  message(FATAL_ERROR "install_consumer: headers were not installed under ${prefix}/include")
endif()

set(configure_args -G "${GENERATOR}" "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
if(CUDA_TOOLKIT_ROOT)
  list(APPEND configure_args "-DCUDAToolkit_ROOT=${CUDA_TOOLKIT_ROOT}")
endif()
if(CONFIG)
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
# Configures `source` in WORK_DIR/<name> with `configure_args` and ARGN; it must fail and its output
# match `pattern`.
function(expect_refusal name source pattern)
  message(STATUS "install_consumer: ${name}: configure must fail matching '${pattern}'")
  execute_process(COMMAND "${CMAKE_COMMAND}" -S "${source}" -B "${WORK_DIR}/${name}" ${configure_args} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: ${name}: the configure succeeded; expected a refusal matching '${pattern}'")
  endif()
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${out}")  # CMake wraps long messages
  if(NOT flat MATCHES "${pattern}")
    message(FATAL_ERROR "install_consumer: ${name}: the configure failed, but its output does not match "
                        "'${pattern}':\n${out}")
  endif()
  string(REGEX MATCH "Reason given by package:.*" reason "${flat}")
  message(STATUS "install_consumer: ${name}: refused as expected: ${reason}")
endfunction()

if(DEFINED EXPECT_REFUSAL)
  expect_refusal(refusal "${SOURCE_DIR}" "${EXPECT_REFUSAL}")
  message(STATUS "install_consumer: ${EXE} refused as expected")
  return()
endif()
step("configure consumer" "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${consumer_build}" ${configure_args})
step("build consumer" "${CMAKE_COMMAND}" --build "${consumer_build}" ${config_args})
if(EXISTS "${consumer_build}/${EXE}")
  set(exe "${consumer_build}/${EXE}")
else()
  file(GLOB_RECURSE exe "${consumer_build}/*/${EXE}")
endif()
step("run consumer" "${exe}")
# No installed target may name a path inside the toolkit: consumers bring their own (CUDA::...).
# The same for OTHER_ROOTS (NCCL: graphsafe::nccl names graphsafe_nccl_library, defined by the
# consumer's find_nccl.cmake).
set(roots)
foreach(root ${CUDA_TOOLKIT_ROOT} ${OTHER_ROOTS})
  file(REAL_PATH "${root}" real)
  list(APPEND roots "${root}" "${real}")
endforeach()
file(GLOB target_files "${prefix}/lib*/cmake/graphsafe/*Targets*.cmake")
foreach(f ${target_files})
  file(READ "${f}" text)
  foreach(root ${roots})
    string(FIND "${text}" "${root}/" pos)
    if(NOT pos EQUAL -1)
      message(FATAL_ERROR "install_consumer: ${f} names the path ${root} (of the toolkit or a dependency)")
    endif()
  endforeach()
endforeach()
if(AFTER)
  include("${AFTER}")
endif()
message(STATUS "install_consumer: ${EXE} passed")
