# CTest driver of install_consumer: `cmake --install` the build tree into a fresh prefix, then
# configure, build and run tests/install/consumer against it with find_package(graphsafe REQUIRED).
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX_COMPILER=...
#         -DCUDA_TOOLKIT_ROOT=... [-DCONFIG=...] -P install_consumer.cmake
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
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

set(configure_args -S "${SOURCE_DIR}" -B "${consumer_build}" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
if(CUDA_TOOLKIT_ROOT)
  list(APPEND configure_args "-DCUDAToolkit_ROOT=${CUDA_TOOLKIT_ROOT}")
endif()
if(CONFIG)
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
step("configure consumer" "${CMAKE_COMMAND}" ${configure_args})
step("build consumer" "${CMAKE_COMMAND}" --build "${consumer_build}" ${config_args})
if(EXISTS "${consumer_build}/consumer")
  set(exe "${consumer_build}/consumer")
else()
  file(GLOB_RECURSE exe "${consumer_build}/consumer" "${consumer_build}/*/consumer")
endif()
step("run consumer" "${exe}")
message(STATUS "install_consumer: passed")
