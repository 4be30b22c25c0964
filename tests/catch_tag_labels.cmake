# Gives each Catch2-discovered CTest test its Catch2 tags as CTest labels (run after the build, next
# to catch_discover_tests), so `[concurrency]` in a test source is `ctest -L concurrency`:
#   cmake -DTEST_EXECUTABLE=<exe> -DTEST_PREFIX=<prefix> -DBASE_LABELS=<a;b> -DOUT=<file.cmake> -P catch_tag_labels.cmake
# catch_discover_tests cannot pass a list-valued LABELS property, so this writes a second include file
# that CTest reads after the discovered tests. Hidden tags ([.], [!mayfail], ...) give no label.
# A test name with ';' is refused here: CTest would split it into entries that run nothing.
execute_process(COMMAND "${TEST_EXECUTABLE}" --list-test-names-only OUTPUT_VARIABLE names RESULT_VARIABLE rc)
if(rc LESS 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} --list-test-names-only failed: ${rc}")
endif()
string(FIND "${names}" ";" semicolon)
if(NOT semicolon EQUAL -1)
  string(SUBSTRING "${names}" 0 ${semicolon} before)
  string(REGEX REPLACE ".*\n" "" before "${before}")
  file(REMOVE "${TEST_EXECUTABLE}")  # so the next build links and checks it again
  message(FATAL_ERROR "${TEST_EXECUTABLE}: the Catch2 test name starting \"${before};\" contains ';': CTest splits "
                      "it into entries that match no test case. Rename it.")
endif()

execute_process(COMMAND "${TEST_EXECUTABLE}" --list-tags OUTPUT_VARIABLE tag_lines RESULT_VARIABLE rc)
if(rc LESS 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} --list-tags failed: ${rc}")
endif()
string(REGEX MATCHALL "\\[[^]!.][^]]*\\]" tags "${tag_lines}")
list(REMOVE_DUPLICATES tags)

set(tests)
foreach(tag IN LISTS tags)
  string(REGEX REPLACE "^\\[(.*)\\]$" "\\1" label "${tag}")
  execute_process(COMMAND "${TEST_EXECUTABLE}" "${tag}" --list-test-names-only OUTPUT_VARIABLE tagged RESULT_VARIABLE rc)
  if(rc LESS 0)
    message(FATAL_ERROR "${TEST_EXECUTABLE} ${tag} --list-test-names-only failed: ${rc}")
  endif()
  string(REPLACE "\n" ";" tagged "${tagged}")
  foreach(name IN LISTS tagged)
    if(name STREQUAL "")
      continue()
    endif()
    string(MD5 key "${name}")
    if(NOT DEFINED labels_${key})
      set(labels_${key} ${BASE_LABELS})
      set(name_${key} "${name}")
      list(APPEND tests ${key})
    endif()
    list(APPEND labels_${key} ${label})
  endforeach()
endforeach()

set(script "")
foreach(key IN LISTS tests)
  string(APPEND script "set_tests_properties([==[${TEST_PREFIX}${name_${key}}]==] PROPERTIES LABELS [==[${labels_${key}}]==])\n")
endforeach()
file(WRITE "${OUT}" "${script}")
