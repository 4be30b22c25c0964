# Included by install_consumer.cmake once consumer_nccl passed (NCCL_VERSION: the NCCL graphsafe::nccl
# was built with): what find_package(graphsafe REQUIRED COMPONENTS nccl) refuses, each a configure
# that must fail with a reason naming the component.
if(NOT NCCL_VERSION)
  message(FATAL_ERROR "nccl_refusals: NCCL_VERSION not set")
endif()

# The installed NCCL headers are the public interface only: no detail:: types.
file(GLOB nccl_headers "${prefix}/include/graphsafe/nccl/*.hpp")
list(LENGTH nccl_headers n)
if(NOT n EQUAL 2)
  message(FATAL_ERROR "nccl_refusals: expected registrar.hpp and nccl.hpp under ${prefix}/include/graphsafe/nccl, found ${n}")
endif()
foreach(h ${nccl_headers})
  file(STRINGS "${h}" hits REGEX "detail::")
  if(hits)
    message(FATAL_ERROR "nccl_refusals: ${h} names detail:: types: ${hits}")
  endif()
endforeach()

# Stand-in NCCL installs: a header with only the version code and an empty library file, which
# find_nccl.cmake finds first through GRAPHSAFE_NCCL_ROOT and rejects or accepts by the version.
function(fake_nccl name code)
  file(WRITE "${WORK_DIR}/${name}/include/nccl.h" "#define NCCL_VERSION_CODE ${code}\n")
  file(WRITE "${WORK_DIR}/${name}/lib/libnccl.so" "")
endfunction()

# An NCCL without ncclCommRegister (2.18.0).
fake_nccl(nccl-2.18.0 21800)
expect_refusal(old-nccl "${SOURCE_DIR}" "component 'nccl' needs NCCL .*older than 2\\.19\\.3"
               "-DGRAPHSAFE_NCCL_ROOT=${WORK_DIR}/nccl-2.18.0")

# Built with window registration: an NCCL without ncclCommWindowRegister (2.25.0) cannot link it.
if(NCCL_VERSION VERSION_GREATER_EQUAL 2.27.3)
  fake_nccl(nccl-2.25.0 22500)
  expect_refusal(no-window-nccl "${SOURCE_DIR}"
                 "component 'nccl' needs NCCL 2\\.27\\.3 or later .*built with ${NCCL_VERSION}.* found is 2\\.25\\.0"
                 "-DGRAPHSAFE_NCCL_ROOT=${WORK_DIR}/nccl-2.25.0")
endif()

# A component graphsafe does not have, next to nccl.
file(WRITE "${WORK_DIR}/unknown/CMakeLists.txt"
     "cmake_minimum_required(VERSION 3.25)\nproject(unknown LANGUAGES CXX)\n"
     "find_package(graphsafe REQUIRED COMPONENTS nccl nvshmem)\n")
expect_refusal(unknown-component "${WORK_DIR}/unknown"
               "graphsafe has no component 'nvshmem' \\(it has ds4, cupti, nccl\\)")

# The component's targets file gone from the install: named, not an unknown target at build time.
file(GLOB nccl_targets "${prefix}/lib*/cmake/graphsafe/graphsafe_ncclTargets*.cmake")
if(NOT nccl_targets)
  message(FATAL_ERROR "nccl_refusals: no graphsafe_ncclTargets.cmake under ${prefix}")
endif()
file(REMOVE ${nccl_targets})
expect_refusal(no-targets "${SOURCE_DIR}"
               "component 'nccl' was not built into this graphsafe package \\(no graphsafe_ncclTargets\\.cmake in .*\\): it was built with NCCL ${NCCL_VERSION}")
